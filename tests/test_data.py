"""data.py: shard format, GPT-2 text, synthetic languages, the rank-strided loader, download."""
import hashlib
import http.server
import socket
import threading
from pathlib import Path

import numpy as np
import pytest
import tiktoken
import torch

import data

PARADISE = Path(__file__).parent / "assets" / "paradise_regained.txt"


def make_shards(folder, split, lengths, start=0):
    """Shards whose tokens are their stream positions (mod 60000): easy to trace."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, n in enumerate(lengths):
        data.write_shard(folder / f"t_{split}_{i:06d}.bin", (np.arange(n) + start) % 60000)
        start += n


# ----------------------------------------------------------------------------- format
def test_shard_roundtrip_and_header(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 65536, size=1000)
    data.write_shard(tmp_path / "a_train.bin", tokens)
    header = np.fromfile(tmp_path / "a_train.bin", dtype="<i4", count=256)
    assert list(header[:3]) == [20240520, 1, 1000] and not header[3:].any()
    back = data.read_shard(tmp_path / "a_train.bin")
    assert isinstance(back, np.memmap) and back.dtype == np.uint16
    np.testing.assert_array_equal(back, tokens)
    assert (tmp_path / "a_train.bin").stat().st_size == 1024 + 2 * 1000
    assert [p.name for p in tmp_path.iterdir()] == ["a_train.bin"]  # no temp file left


def corrupt(path, how):
    raw = bytearray(path.read_bytes())
    if how == "magic":
        raw[0:4] = np.int32(12345).tobytes()
    elif how == "version":
        raw[4:8] = np.int32(7).tobytes()
    elif how == "truncated":
        raw = raw[:-3]
    elif how == "header":
        raw = raw[:500]
    elif how == "extra":
        raw += b"\0\0"
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("how, message", [
    ("magic", "magic number is 12345"), ("version", "version 7"),
    ("truncated", "is truncated: its header announces 100 tokens"),
    ("header", "shorter than the 1024-byte header"), ("extra", "longer than its header says")])
def test_header_validation_catches_each_corruption(tmp_path, how, message):
    path = tmp_path / "x_train_000000.bin"
    data.write_shard(path, np.arange(100))
    corrupt(path, how)
    with pytest.raises(ValueError, match=message):
        data.read_shard(path)
    with pytest.raises(ValueError, match=message):
        data.ShardLoader(tmp_path, 1, 4)


def test_missing_data_names_the_command(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no train shards .*python data.py fineweb"):
        data.ShardLoader(tmp_path / "nowhere", 2, 8)
    with pytest.raises(SystemExit, match="python data.py text FILES"):
        data.main(["bench", "--data", str(tmp_path)])


def test_write_shard_refuses_ids_beyond_uint16(tmp_path):
    with pytest.raises(ValueError, match=r"\[0, 65535\]"):
        data.write_shard(tmp_path / "a.bin", [1, 70000])
    assert not list(tmp_path.iterdir())


# ----------------------------------------------------------------------------- GPT-2 text
def test_gpt2_ids():
    enc = data.gpt2_encoding()
    assert enc.encode_ordinary("Hello world") == [15496, 995]
    assert enc.eot_token == data.EOT == 50256


def test_missing_vocabulary_says_how_to_seed_the_cache(monkeypatch):
    def offline(name):
        raise ConnectionError("no network")
    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(RuntimeError, match="ConnectionError.*set TIKTOKEN_CACHE_DIR"):
        data.gpt2_encoding()


def test_text_pieces_tokenize_exactly_like_the_whole_text():
    text = PARADISE.read_text(encoding="utf-8")
    pieces = data.text_pieces(text, max_chars=3000)
    assert len(pieces) > 30 and "".join(pieces) == text
    assert max(map(len, pieces)) <= 3000
    enc = data.gpt2_encoding()
    whole = enc.encode_ordinary(text)
    assert sum((enc.encode_ordinary(p) for p in pieces), []) == whole


def test_text_to_shards_to_loader_decodes_back(tmp_path):
    second = tmp_path / "second.txt"
    second.write_text("A second document.\n\nIt ends here.", encoding="utf-8")
    out = tmp_path / "text"
    data.main(["text", str(PARADISE), str(second), "--out", str(out), "--workers", "2"])
    assert sorted(p.name for p in out.iterdir()) == \
        ["manifest.json", "text_train_000000.bin", "text_val_000000.bin"]
    train, val = (data.read_shard(p) for p in sorted(out.glob("*.bin")))
    enc = data.gpt2_encoding()
    expected = "<|endoftext|>" + PARADISE.read_text(encoding="utf-8") + "<|endoftext|>" + \
        second.read_text(encoding="utf-8")
    stream = np.concatenate([train, val])
    assert enc.decode(stream.tolist()) == expected
    assert (stream == data.EOT).sum() == 2 and stream[0] == data.EOT
    assert abs(len(val) / len(stream) - 0.1) < 0.01
    # the loader's windows, x rows followed by the last target, are the train stream in order
    loader = data.ShardLoader(out, batch_size=4, seq_len=256)
    steps = (len(train) - 1) // (4 * 256)
    seen = [loader.next_batch() for _ in range(steps)]
    tokens = torch.cat([x.flatten() for x, _ in seen] + [seen[-1][1][-1, -1:]])
    assert enc.decode(tokens.tolist()) == enc.decode(train[:len(tokens)].tolist())
    assert all(torch.equal(x[:, 1:], y[:, :-1]) and x.dtype == torch.int64 for x, y in seen)


def test_empty_text_file_is_refused(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n", encoding="utf-8")
    with pytest.raises(SystemExit, match="empty.txt is empty"):
        data.main(["text", str(PARADISE), str(empty), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


# ----------------------------------------------------------------------------- loader
def test_rank_striding_is_disjoint_complete_and_equals_one_process(tmp_path):
    B, T, W = 2, 8, 2
    make_shards(tmp_path, "train", [3 * W * B * T + 1, 2 * W * B * T + 1])  # wraps after 5 steps
    one = data.ShardLoader(tmp_path, B, T)
    ranks = [data.ShardLoader(tmp_path, B, T, rank=r, world_size=W) for r in range(W)]
    for step in range(12):
        batches = [loader.next_batch() for loader in ranks]
        for x, y in batches:                                # 1 process, twice == W ranks, once
            x1, y1 = one.next_batch()
            assert torch.equal(x, x1) and torch.equal(y, y1)
        xs = torch.cat([x.flatten() for x, _ in batches])
        assert len(set(xs.tolist())) == W * B * T           # disjoint ...
        assert torch.equal(xs, torch.arange(xs[0], xs[0] + W * B * T))  # ... and complete
        assert all(torch.equal(y, x + 1) for x, y in batches)
    assert ranks[0].state_dict()["epoch"] == 2


def test_resume_continues_with_the_exact_next_batch(tmp_path):
    make_shards(tmp_path, "train", [500, 300, 400])
    loader = data.ShardLoader(tmp_path, 3, 16, rank=1, world_size=2)
    for _ in range(7):                                      # past a shard boundary
        loader.next_batch()
    state = loader.state_dict()
    assert all(type(v) is int for v in state.values()) and state["shard"] > 0
    expected = [loader.next_batch() for _ in range(20)]     # wraps around, too
    resumed = data.ShardLoader(tmp_path, 3, 16, rank=1, world_size=2)
    resumed.load_state_dict(state)
    for (x, y), (rx, ry) in zip(expected, (resumed.next_batch() for _ in range(20))):
        assert torch.equal(x, rx) and torch.equal(y, ry)
    with pytest.raises(ValueError, match="does not fit the 3 shard"):
        resumed.load_state_dict({"shard": 5, "position": 0})


def test_shard_shorter_than_one_step_is_refused(tmp_path):
    make_shards(tmp_path, "train", [100])
    with pytest.raises(ValueError, match="holds 100 tokens, fewer than the 129"):
        data.ShardLoader(tmp_path, 4, 16, world_size=2)


def test_val_batches_are_deterministic_and_split_across_ranks(tmp_path):
    make_shards(tmp_path, "val", [1000, 700])
    B, T = 2, 16
    single = torch.cat([x.flatten() for x, _ in data.val_batches(tmp_path, 640, 2 * B, T)])
    for W in (1, 2):
        per_rank = [list(data.val_batches(tmp_path, 640, B, T, r, W)) for r in range(W)]
        assert len({len(b) for b in per_rank}) == 1         # every rank: same count
        steps = zip(*per_rank)
        union = torch.cat([x.flatten() for step in steps for x, _ in step])
        if W == 2:
            assert torch.equal(union, single)
        assert len(union) == 640 // (W * B * T) * W * B * T
        assert torch.equal(union, torch.arange(len(union)))  # the first tokens of the split
    with pytest.raises(ValueError, match="eval_tokens=99999"):
        data.val_batches(tmp_path, 99999, B, T)


def test_check_vocab(tmp_path):
    make_shards(tmp_path, "train", [50, 100])
    loader = data.ShardLoader(tmp_path, 1, 8)
    loader.check_vocab(150)
    with pytest.raises(ValueError, match="token id 149, outside the model's vocabulary of 149"):
        loader.check_vocab(149)


# ----------------------------------------------------------------------------- synthetic
def test_synthetic_repeat_rows_are_constant(tmp_path):
    data.main(["synthetic", "--task", "repeat", "--vocab", "50", "--tokens", "20000",
               "--seq_len", "16", "--out", str(tmp_path), "--seed", "3"])
    for split in ("train", "val"):
        loader = data.ShardLoader(tmp_path, 8, 16, split=split)
        for _ in range(10):
            x, y = loader.next_batch()
            assert (x == x[:, :1]).all() and (y[:, :-1] == x[:, :1]).all()
            assert x.max() < 50
    tokens = data.read_shard(next(tmp_path.glob("*train*")))
    assert len(np.unique(tokens)) == 50                      # all of the vocabulary appears


def test_synthetic_repeat_never_uses_eot():
    tokens = data.synthesize_repeat(50257, 40000, 4, seed=0)
    assert data.EOT not in tokens and tokens.max() < 50257


def test_synthetic_markov_has_the_claimed_statistics(tmp_path):
    V, seed = 6, 1
    data.main(["synthetic", "--task", "markov", "--vocab", str(V), "--tokens", "300000",
               "--out", str(tmp_path), "--seed", str(seed)])
    P = np.load(tmp_path / "markov_transition.npy")
    pi = np.load(tmp_path / "markov_stationary.npy")
    np.testing.assert_array_equal(P, data.markov_transition(V, seed))
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(pi @ P, pi, atol=1e-12)
    tokens = np.concatenate([data.read_shard(p) for p in sorted(tmp_path.glob("*.bin"))[::-1]])
    counts = np.zeros((V, V))
    np.add.at(counts, (tokens[:-1], tokens[1:]), 1)
    n = counts.sum(axis=1, keepdims=True)
    sigma = np.sqrt(P * (1 - P) / n)                        # binomial sampling error
    assert (np.abs(counts / n - P) < 5 * sigma + 1e-3).all()
    freq = np.bincount(tokens, minlength=V) / len(tokens)
    assert np.abs(freq - pi).max() < 0.01
    # the same seed gives the same language; another seed another one
    assert not np.allclose(P, data.markov_transition(V, seed + 1))


def test_synthetic_refuses_bad_settings(tmp_path):
    with pytest.raises(SystemExit, match="2 ≤ --vocab ≤ 4096"):
        data.main(["synthetic", "--task", "markov", "--vocab", "50304", "--tokens", "1000",
                   "--out", str(tmp_path)])
    make_shards(tmp_path / "mixed", "train", [10])
    with pytest.raises(SystemExit, match="already holds other shards"):
        data.main(["synthetic", "--task", "repeat", "--vocab", "5", "--tokens", "1000",
                   "--out", str(tmp_path / "mixed")])


# ----------------------------------------------------------------------------- download
class ShardServer(http.server.BaseHTTPRequestHandler):
    """Serves `files` with Range support; `cut_first` names files whose first answer breaks off."""
    files, cut_first, ranges = {}, set(), []

    def do_GET(self):
        body = self.files.get(self.path.rsplit("/", 1)[-1])
        if body is None:
            self.send_error(404)
            return
        start = int(self.headers["Range"][6:-1]) if self.headers["Range"] else 0
        self.ranges.append(self.headers["Range"])
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        name = self.path.rsplit("/", 1)[-1]
        if name in self.cut_first:
            self.cut_first.discard(name)
            self.wfile.write(body[start:start + (len(body) - start) // 2])
            self.close_connection = True
            return
        self.wfile.write(body[start:])

    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    data.write_shard(source / "fineweb_val_000000.bin", np.arange(3000) % 50257)
    data.write_shard(source / "fineweb_train_000001.bin", np.arange(5000) * 7 % 50257)
    ShardServer.files = {p.name: p.read_bytes() for p in source.iterdir()}
    ShardServer.cut_first, ShardServer.ranges = set(), []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ShardServer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}/resolve/main", source
    httpd.shutdown()
    httpd.server_close()


def test_download_resumes_a_transfer_that_breaks_off(server, tmp_path, capsys):
    url, source = server
    ShardServer.cut_first = {"fineweb_train_000001.bin"}
    out = tmp_path / "fw"
    data.main(["fineweb", "--shards", "1", "--out", str(out), "--base_url", url])
    assert sorted(p.name for p in out.iterdir()) == \
        sorted([p.name for p in source.iterdir()] + ["manifest.json"])
    recorded = data.read_manifest(out)["files"]
    for p in source.iterdir():
        assert (out / p.name).read_bytes() == p.read_bytes()
        assert recorded[p.name] == {"bytes": p.stat().st_size,
                                    "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
    half = (len(ShardServer.files["fineweb_train_000001.bin"])) // 2
    assert ShardServer.ranges == [None, None, f"bytes={half}-"]
    assert "MB/s" in capsys.readouterr().out
    data.fetch_fineweb(out, train_shards=1, base_url=url)                # all there: nothing fetched again
    assert len(ShardServer.ranges) == 3


def test_download_completes_an_existing_part_file(server, tmp_path, monkeypatch):
    url, source = server
    monkeypatch.setenv("FINEWEB_BASE_URL", url)
    out = tmp_path / "fw"
    out.mkdir()
    body = (source / "fineweb_val_000000.bin").read_bytes()
    (out / "fineweb_val_000000.bin.part").write_bytes(body[:1500])
    data.fetch_fineweb(out, train_shards=1)
    assert ShardServer.ranges[0] == "bytes=1500-"
    assert (out / "fineweb_val_000000.bin").read_bytes() == body
    assert not list(out.glob("*.part"))


def test_corrupt_download_is_rejected_and_leaves_no_file(server, tmp_path):
    url, _ = server
    ShardServer.files["fineweb_val_000000.bin"] = b"\x07" * 3000
    out = tmp_path / "fw"
    with pytest.raises(ValueError, match="is corrupt and was deleted .*magic number"):
        data.fetch_fineweb(out, train_shards=1, base_url=url)
    assert not list(out.iterdir())


def test_missing_shard_and_offline_errors(server, tmp_path):
    url, _ = server
    with pytest.raises(SystemExit, match="HTTP 404.*check --shards"):
        data.main(["fineweb", "--shards", "2", "--out", str(tmp_path / "fw"), "--base_url", url])
    assert not list((tmp_path / "fw").glob("*train_000002*"))
    with socket.socket() as s:                              # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/resolve/main"
    with pytest.raises(SystemExit, match=r"offline, train on local text instead: "
                                         r"`python data.py text FILES --out DIR`"):
        data.main(["fineweb", "--out", str(tmp_path / "dead"), "--base_url", dead])
