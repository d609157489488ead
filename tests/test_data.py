"""data.py (the shard format, the rank-strided loader, val batches) and prepare.py (GPT-2 text,
a Markov language, renumbering, the FineWeb download), each dataset written whole."""
import http.server
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import data
import prepare

ROOT = Path(__file__).resolve().parent.parent
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
    with pytest.raises(ValueError, match=r"\[0, 65535\] to fit a uint16 shard, got the range "
                                         r"\[1, 70000\]$"):
        data.write_shard(tmp_path / "b.bin", [1, 70000])


def edit_header(path, int_index, value):
    raw = bytearray(path.read_bytes())
    raw[4 * int_index:4 * int_index + 4] = np.int32(value).tobytes()
    path.write_bytes(bytes(raw))


CUT = "is cut short or damaged: its header announces"


@pytest.mark.parametrize("edit, message", [
    (lambda p: edit_header(p, 1, 7), "has shard version 7, but only version 1 (uint16 tokens) "
                                     "is read"),
    (lambda p: p.write_bytes(p.read_bytes()[:-3]),
     f"{CUT} 100 tokens (1224 bytes) but the file has 1221 bytes"),
    (lambda p: p.write_bytes(p.read_bytes()[:500]),
     f"{CUT} 100 tokens (1224 bytes) but the file has 500 bytes"),
    (lambda p: edit_header(p, 2, 101),
     f"{CUT} 101 tokens (1226 bytes) but the file has 1224 bytes"),
    (lambda p: edit_header(p, 2, -5), f"{CUT} -5 tokens (1014 bytes) but the file has 1224 bytes")])
def test_a_damaged_shard_is_refused_in_one_sentence(tmp_path, edit, message):
    path = tmp_path / "x_train_000000.bin"
    data.write_shard(path, np.arange(100))
    edit(path)
    with pytest.raises(ValueError) as refused:
        data.ShardLoader(tmp_path, 1, 4)
    assert str(refused.value) == f"{path} {message}"


def test_a_file_without_the_magic_is_headerless_tokens_unless_a_header_is_required(tmp_path):
    path = tmp_path / "x_train_000000.bin"
    np.arange(600, dtype="<u2").tofile(path)               # bare tokens, as nanoGPT writes them
    np.testing.assert_array_equal(data.read_shard(path), np.arange(600))
    assert data.shard_length(path, headerless=True) == 600
    with pytest.raises(ValueError) as refused:
        data.shard_length(path)                             # as a download must be
    assert str(refused.value) == f"{path} is no llm.c shard (its first int32 is not 20240520)"
    path.write_bytes(path.read_bytes() + b"\0")             # an odd size is no uint16 tokens
    with pytest.raises(ValueError, match=r"not 20240520\), nor uint16 tokens \(its size, 1201 "
                                         r"bytes, is odd\)$"):
        data.read_shard(path)


def test_nanogpt_bins_are_read_as_they_are(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 50257, size=5000).astype(np.uint16)
    for split, part in (("train", tokens[:4500]), ("val", tokens[4500:])):
        memmap = np.memmap(tmp_path / f"{split}.bin", dtype=np.uint16, mode="w+",
                           shape=part.shape)
        memmap[:] = part
        memmap.flush()
    np.testing.assert_array_equal(data.read_shard(tmp_path / "train.bin"), tokens[:4500])
    x, y = data.ShardLoader(tmp_path, 4, 16).next_batch()
    assert torch.equal(x.flatten(), torch.from_numpy(tokens[:64].astype(np.int64)))
    assert y[-1, -1] == tokens[64] and data.max_token(tmp_path / "val.bin") == tokens[4500:].max()
    val = torch.cat([x.flatten() for x, _ in data.val_batches(tmp_path, 448, 4, 16)])
    assert torch.equal(val, torch.from_numpy(tokens[4500:4948].astype(np.int64)))


def test_missing_data_is_named(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError) as missing:
        data.ShardLoader(tmp_path, 2, 8)
    assert str(missing.value) == f"no train shards (*train*.bin) in {tmp_path.resolve()}"
    monkeypatch.chdir(tmp_path)                             # a typo, or another current folder
    with pytest.raises(FileNotFoundError) as missing:
        data.ShardLoader("tests/assets", 2, 8)
    assert str(missing.value) == (f"no train shards (*train*.bin) in {tmp_path.resolve()}/tests/"
                                  f"assets, a folder that does not exist")


# ----------------------------------------------------------------------------- GPT-2 text
def test_gpt2_ids():
    enc = prepare.gpt2_encoding()
    assert enc.encode_ordinary("Hello world") == [15496, 995]
    assert enc.eot_token == data.EOT == 50256


OFFLINE = """
import sys
import tiktoken.load
def offline(url):
    print("download attempted")
    raise ConnectionError("no network")
tiktoken.load.read_file = offline
import prepare
prepare.GPT2_CACHE = prepare.Path(sys.argv[1])
prepare.gpt2_encoding()
print(prepare.gpt2_encoding().encode_ordinary("Hello world"))
"""


def test_offline_the_shipped_vocabulary_is_used_and_said_once_not_at_every_command(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TIKTOKEN_CACHE_DIR"}
    env["TMPDIR"] = str(tmp_path)                           # tiktoken's own default cache: empty
    cache = tmp_path / "cache"
    first, again = (subprocess.run([sys.executable, "-c", OFFLINE, str(cache)], cwd=ROOT,
                                   env=env, capture_output=True, text=True).stdout.splitlines()
                    for _ in range(2))                      # e.g. sample.py, twice
    assert first == ["download attempted", "using the GPT-2 vocabulary shipped in tests/assets/"
                     f"gpt2 (cached in {cache})", "[15496, 995]"]
    assert again == ["[15496, 995]"]


def test_text_to_shards_to_loader_decodes_back(tmp_path, capsys):
    second = tmp_path / "second.txt"
    second.write_text("A second document.\n\nIt ends here.", encoding="utf-8")
    out = tmp_path / "text"
    prepare.main(["text", str(PARADISE), str(second), "--out", str(out)])
    assert f"of 2 text file(s) into {out}" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["second.txt", "text"]  # no temporary
    assert sorted(p.name for p in out.iterdir()) == ["text_train_000000.bin",
                                                     "text_val_000000.bin"]
    train, val = (data.read_shard(p) for p in sorted(out.glob("*.bin")))
    enc = prepare.gpt2_encoding()
    expected = "<|endoftext|>" + PARADISE.read_text(encoding="utf-8") + "<|endoftext|>" + \
        second.read_text(encoding="utf-8")
    stream = np.concatenate([train, val])
    assert enc.decode(stream.tolist()) == expected
    assert (stream == data.EOT).sum() == 2 and stream[0] == data.EOT
    assert len(val) == int(np.ceil(0.1 * len(stream)))
    # the loader's windows, x rows followed by the last target, are the train stream in order
    loader = data.ShardLoader(out, batch_size=4, seq_len=256)
    steps = (len(train) - 1) // (4 * 256)
    seen = [loader.next_batch() for _ in range(steps)]
    tokens = torch.cat([x.flatten() for x, _ in seen] + [seen[-1][1][-1, -1:]])
    assert torch.equal(tokens, torch.from_numpy(train[:len(tokens)].astype(np.int64)))
    assert all(torch.equal(x[:, 1:], y[:, :-1]) and x.dtype == torch.int64 for x, y in seen)


def test_text_that_is_not_utf8_is_named(tmp_path):
    latin = tmp_path / "latin.txt"
    latin.write_bytes("Café au lait".encode("latin-1"))
    with pytest.raises(SystemExit, match=r"^prepare.py text: error: \S+latin.txt is not UTF-8 "
                                         r"text \(invalid continuation byte at byte 3\); convert"):
        prepare.main(["text", str(latin), "--out", str(tmp_path / "out")])


def test_a_write_that_fails_leaves_no_dataset_and_a_full_folder_is_not_replaced(
        tmp_path, monkeypatch):
    out, real = tmp_path / "out", data.write_shard

    def fails_at_val(path, tokens):
        real(path, tokens)
        if "_val_" in Path(path).name:
            raise KeyboardInterrupt                         # killed after the last shard
    monkeypatch.setattr(data, "write_shard", fails_at_val)
    with pytest.raises(KeyboardInterrupt):
        prepare.prepare_text([PARADISE], out)
    assert list(tmp_path.iterdir()) == []                   # no out, no temporary folder
    monkeypatch.undo()
    out.mkdir()                                             # an empty folder is filled
    prepare.prepare_text([PARADISE], out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(SystemExit, match=rf"^prepare.py synthetic: error: {out} is not empty; "
                                         rf"delete it, or choose another --out$"):
        prepare.main(["synthetic", "--vocab", "5", "--tokens", "1000", "--out", str(out)])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_text_files_are_tokenized_once_into_the_projects_cache(tmp_path, monkeypatch):
    assert prepare.TEXT_CACHE == ROOT / "data" / "text"    # not under the current folder
    monkeypatch.setattr(prepare, "TEXT_CACHE", tmp_path / "cache")
    text = tmp_path / "story.txt"
    text.write_text("Once upon a time.\n" * 300, encoding="utf-8")
    folder = prepare.text_dataset([text])
    assert folder.parent == tmp_path / "cache" and folder.name.startswith("story-")
    assert len(data.read_shard(data.shard_paths(folder, "val")[0])) > 0
    with monkeypatch.context() as m:
        m.setattr(prepare, "prepare_text", None)           # a second tokenizing would fail
        assert prepare.text_dataset([text]) == folder
    text.write_text("Once upon another time.\n" * 300, encoding="utf-8")
    edited = prepare.text_dataset([text])
    assert edited != folder and edited.parent == folder.parent and edited.is_dir()


def test_two_runs_caching_the_same_text_at_once_share_one_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare, "TEXT_CACHE", tmp_path / "cache")
    text = tmp_path / "story.txt"
    text.write_text("Once upon a time.\n" * 300, encoding="utf-8")
    real, calls, theirs = prepare.write_dataset, [], {}

    def meanwhile_another_run_finishes(*args):
        calls.append(1)
        if len(calls) == 1:                                 # the other run, while we write
            other = prepare.text_dataset([text])
            theirs.update({p.name: p.stat().st_ino for p in other.iterdir()})
        return real(*args)
    monkeypatch.setattr(prepare, "write_dataset", meanwhile_another_run_finishes)
    folder = prepare.text_dataset([text])
    assert len(calls) == 2 and [p.name for p in (tmp_path / "cache").iterdir()] == [folder.name]
    assert {p.name: p.stat().st_ino for p in folder.iterdir()} == theirs  # used, not replaced


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
    with pytest.raises(ValueError, match="does not fit .* in steps of 6 × 16 tokens"):
        resumed.load_state_dict({"shard": 5, "position": 0})


def test_shard_shorter_than_one_step_is_refused(tmp_path):
    make_shards(tmp_path, "train", [100])
    with pytest.raises(ValueError, match=r"holds 100 tokens, fewer than the 129 one step reads "
                                         r"\(8 rows × 16 tokens \+ 1\)"):
        data.ShardLoader(tmp_path, 4, 16, world_size=2)     # 2 ranks × 4 rows
    assert 8 * 16 + 1 == 129                                # the sentence's formula, its number
    with pytest.raises(ValueError, match=r"fewer than the 129 one step reads \(16 rows × 8"):
        data.ShardLoader(tmp_path, 4, 8, step_rows=16)      # a step of 4 micro-batches
    with pytest.raises(ValueError, match=r"step_rows=12 must be a multiple of world_size × "
                                         r"batch_size = 8"):
        data.ShardLoader(tmp_path, 4, 4, world_size=2, step_rows=12)
    with pytest.raises(ValueError, match=r"holds 100 tokens, fewer than the 101 one row "
                                         r"reads \(100 tokens \+ 1\)"):
        data.ShardLoader(tmp_path, 4, 100, order="random")


def random_batches(folder, n, batch_size=3, **kw):
    loader = data.ShardLoader(folder, batch_size, 8, order="random", **kw)
    return [loader.next_batch() for _ in range(n)]


def test_random_rows_draw_windows_by_seed_and_global_row_shards_in_proportion(tmp_path):
    make_shards(tmp_path, "train", [3000, 1000])            # tokens = stream positions
    batches = random_batches(tmp_path, 400, seed=5, rank=1, world_size=2)
    firsts = torch.cat([x[:, 0] for x, _ in batches])
    for x, y in batches:
        assert torch.equal(y, x + 1) and torch.equal(x[:, 1:], x[:, :-1] + 1)  # whole windows
    assert ((firsts < 3000 - 8) | (firsts >= 3000)).all()   # none crosses a shard's end
    share = (firsts >= 3000).double().mean().item()         # ∝ window starts: 992 / 3984
    assert abs(share - 992 / 3984) < 4 * (0.25 * 0.75 / len(firsts)) ** 0.5
    assert any(len(set((x[:, 0] >= 3000).tolist())) == 2 for x, _ in batches)  # shard per row
    same = random_batches(tmp_path, 400, seed=5, rank=1, world_size=2)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, same))
    assert not torch.equal(random_batches(tmp_path, 1, seed=6, rank=1, world_size=2)[0][0],
                           batches[0][0])
    rank0, whole = (random_batches(tmp_path, 2, seed=5, **kw) for kw in
                    (dict(rank=0, world_size=2), dict(batch_size=6)))  # one rank, twice the rows
    for k in range(2):                                      # global rows k·6 + r·3 + b
        assert torch.equal(whole[k][0], torch.cat([rank0[k][0], batches[k][0]]))


def test_random_order_resumes_bit_for_bit(tmp_path):
    make_shards(tmp_path, "train", [500, 300])
    uninterrupted = random_batches(tmp_path, 30, seed=2, rank=1, world_size=2)
    killed = data.ShardLoader(tmp_path, 3, 8, rank=1, world_size=2, order="random", seed=2)
    for _ in range(11):
        killed.next_batch()
    state = killed.state_dict()
    assert state == {"rows": 11 * 2 * 3}                    # global rows, the same on each rank
    resumed = data.ShardLoader(tmp_path, 3, 8, rank=1, world_size=2, order="random", seed=2)
    resumed.load_state_dict(state)
    for x, y in uninterrupted[11:]:
        rx, ry = resumed.next_batch()
        assert torch.equal(x, rx) and torch.equal(y, ry)
    with pytest.raises(ValueError, match="written for the other data order, not sequential"):
        data.ShardLoader(tmp_path, 3, 8).load_state_dict(state)
    with pytest.raises(ValueError, match="written for the other data order, not random"):
        resumed.load_state_dict({"shard": 0, "position": 0, "epoch": 0})


SPLITS = [(1, 16, 1), (1, 8, 2), (2, 8, 1), (4, 2, 2)]       # ranks × rows × micro-batches = 16


def split_loaders(folder, order, ranks, rows, state=None):
    loaders = [data.ShardLoader(folder, rows, 4, r, ranks, order=order, seed=3, step_rows=16)
               for r in range(ranks)]
    for loader in loaders if state else ():
        loader.load_state_dict(state)
    return loaders


def step_windows(loaders, micro_batches):
    """The sorted windows (x row and its last target) one optimizer step reads on all ranks."""
    batches = [loader.next_batch() for _ in range(micro_batches) for loader in loaders]
    return sorted(tuple(row) for x, y in batches for row in torch.cat([x, y[:, -1:]], 1).tolist())


@pytest.mark.parametrize("order", data.ORDERS)
def test_a_steps_windows_and_the_loader_state_do_not_depend_on_how_its_rows_are_split(
        tmp_path, order):
    make_shards(tmp_path, "train", [3 * 64 + 40, 300])      # a step reads 16 × 4 + 1 tokens
    reference = None
    for ranks, rows, micro in SPLITS:
        loaders = split_loaders(tmp_path, order, ranks, rows)
        steps = [step_windows(loaders, micro) for _ in range(9)]
        assert len({str(loader.state_dict()) for loader in loaders}) == 1
        reference = reference or steps
        assert steps == reference, (ranks, rows, micro)
    if order == "sequential":                               # shard 0 holds 3 steps, shard 1 4
        assert [reference[k][0][0] for k in (2, 3, 7)] == [128, 232, 0]
    for (ranks, rows, micro), (ranks2, rows2, micro2) in zip(SPLITS, SPLITS[1:] + SPLITS[:1]):
        loaders = split_loaders(tmp_path, order, ranks, rows)
        for _ in range(4):                                  # past shard 0, in order
            step_windows(loaders, micro)
        resumed = split_loaders(tmp_path, order, ranks2, rows2, loaders[0].state_dict())
        assert [step_windows(resumed, micro2) for _ in range(5)] == reference[4:]


def test_a_sequential_state_inside_a_step_is_refused(tmp_path):
    make_shards(tmp_path, "train", [500])
    with pytest.raises(ValueError, match=r"does not fit .* in steps of 16 × 4 tokens; resume "
                                         r"with the data, batch size and sequence length the "
                                         r"run was saved with$"):
        split_loaders(tmp_path, "sequential", 1, 8, {"shard": 0, "position": 32, "epoch": 0})


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


def test_val_steps_held_counts_whole_steps_and_refuses_a_shard_too_short_for_one(tmp_path):
    make_shards(tmp_path, "val", [1000, 700])
    assert data.val_steps_held(tmp_path, 2, 16, world_size=2) == 999 // 64 + 699 // 64
    assert data.val_steps_held(tmp_path, 2, 16) == 999 // 32 + 699 // 32
    for n in (0, 64):                                       # empty, and one token short
        make_shards(tmp_path / str(n), "val", [1000, n])
        with pytest.raises(ValueError, match=rf"t_val_000001.bin holds {n} tokens, fewer than "
                                             rf"the 65 one step reads \(4 rows × 16 tokens"):
            data.val_steps_held(tmp_path / str(n), 2, 16, world_size=2)


# ----------------------------------------------------------------------------- synthetic
def test_synthetic_markov_has_the_claimed_statistics(tmp_path, capsys):
    V, seed = 6, 1
    prepare.main(["synthetic", "--vocab", str(V), "--tokens", "200000", "--seed", str(seed),
                  "--out", str(tmp_path / "m")])
    P = prepare.markov_transition(V, seed)
    pi = prepare.markov_stationary(P)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(pi @ P, pi, atol=1e-12)
    rate = -(pi[:, None] * P * np.log(P)).sum()
    assert f"entropy rate (the best possible loss) is {rate:.4f} nats" in capsys.readouterr().out
    train, val = (data.read_shard(data.shard_paths(tmp_path / "m", s)[0]) for s in ("train", "val"))
    assert (len(train), len(val)) == (180_000, 20_000)
    tokens = np.concatenate([train, val])
    counts = np.zeros((V, V))
    np.add.at(counts, (tokens[:-1], tokens[1:]), 1)
    n = counts.sum(axis=1, keepdims=True)
    sigma = np.sqrt(P * (1 - P) / n)                        # binomial sampling error
    assert (np.abs(counts / n - P) < 5 * sigma + 1e-3).all()
    assert np.abs(np.bincount(tokens, minlength=V) / len(tokens) - pi).max() < 0.01
    assert not np.allclose(P, prepare.markov_transition(V, seed + 1))  # a seed, a language


def test_renumber_keeps_the_order_and_drops_unseen_val_tokens(tmp_path, capsys):
    prepare.write_dataset(tmp_path / "src", "text", np.array([5, 9, 5, 300, 9, 5]),
                          np.array([9, 7, 300, 5, 7]))
    prepare.main(["renumber", str(tmp_path / "src"), "--out", str(tmp_path / "dense")])
    assert capsys.readouterr().out == (f"wrote {tmp_path / 'dense'}: 3 token ids in use (train "
                                       f"with --vocab_size 3), 2 val tokens dropped\n")
    train, val = (data.read_shard(data.shard_paths(tmp_path / "dense", split)[0]).tolist()
                  for split in ("train", "val"))
    assert train == [0, 1, 0, 2, 1, 0] and val == [1, 2, 0]


# ----------------------------------------------------------------------------- download
class ShardServer(http.server.BaseHTTPRequestHandler):
    """Serves `files`; `cut_first` names files whose first answer breaks off half-way."""
    files, cut_first, asked = {}, set(), []

    def do_GET(self):
        name = self.path.rsplit("/", 1)[-1]
        self.asked.append(name)
        body = self.files.get(name)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if name in self.cut_first:
            self.cut_first.discard(name)
            body = body[:len(body) // 2]
            self.close_connection = True
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path, monkeypatch):
    source = tmp_path / "source"
    source.mkdir()
    data.write_shard(source / "fineweb_val_000000.bin", np.arange(3000) % 50257)
    data.write_shard(source / "fineweb_train_000001.bin", np.arange(5000) * 7 % 50257)
    ShardServer.files = {p.name: p.read_bytes() for p in source.iterdir()}
    ShardServer.cut_first, ShardServer.asked = set(), []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ShardServer)
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    monkeypatch.setenv(prepare.BASE_URL_ENV, f"http://127.0.0.1:{httpd.server_port}/resolve/main")
    yield source
    httpd.shutdown()
    httpd.server_close()


def test_download_writes_val_last_and_fetches_only_what_is_missing(server, tmp_path, capsys):
    out = tmp_path / "fw"
    prepare.main(["fineweb", "--shards", "1", "--out", str(out)])
    assert ShardServer.asked == ["fineweb_train_000001.bin", "fineweb_val_000000.bin"]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in server.iterdir())
    for p in server.iterdir():
        assert (out / p.name).read_bytes() == p.read_bytes()
    assert "[2/2] fineweb_val_000000.bin: 3,000 tokens, ETA 0 s" in capsys.readouterr().out
    (out / "fineweb_train_000001.bin").unlink()
    prepare.fetch_fineweb(out, train_shards=1)              # only the missing one is fetched
    assert ShardServer.asked[2:] == ["fineweb_train_000001.bin"]


def test_a_transfer_cut_short_is_not_taken_and_a_second_try_finishes(server, tmp_path):
    ShardServer.cut_first = {"fineweb_train_000001.bin"}
    out = tmp_path / "fw"
    with pytest.raises(SystemExit, match=r"could not download \S+fineweb_train_000001.bin \(\S+ "
                                         r"is cut short or damaged: .*; run the command again"):
        prepare.main(["fineweb", "--shards", "1", "--out", str(out)])
    assert not list(out.glob("*.bin"))                      # the .tmp is not a shard
    prepare.fetch_fineweb(out, train_shards=1)
    assert sorted(p.name for p in out.glob("*.bin")) == sorted(p.name for p in server.iterdir())


def test_missing_shard_and_offline_errors(server, tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match=r"could not download \S+fineweb_train_000002.bin \(Not "
                                         r"Found\)"):
        prepare.main(["fineweb", "--shards", "2", "--out", str(tmp_path / "fw")])
    assert not list((tmp_path / "fw").glob("*val*"))        # val comes last: the loader refuses
    with socket.socket() as s:                              # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv(prepare.BASE_URL_ENV, f"http://127.0.0.1:{s.getsockname()[1]}")
    with pytest.raises(SystemExit, match=r"offline, train on local text instead: "
                                         r"`python prepare.py text FILES --out DIR`$"):
        prepare.main(["fineweb", "--out", str(tmp_path / "dead")])


def test_fineweb100b_is_the_default_and_only_the_shards_a_run_reads_are_fetched():
    assert prepare.DEFAULT_DATA == str(ROOT / "data" / "fineweb100B")
    paper_tokens = 100_000 * 64 * 2048                      # steps × batch × seq_len
    assert prepare.shards_needed(paper_tokens) == 132       # 13.1B tokens: 131.07 shards
    assert prepare.shards_needed(paper_tokens, "fineweb10B") == 103   # all it has: 10.3B
    assert prepare.shards_needed(1) == 1
    with pytest.raises(ValueError, match="fineweb10B has 103 train shards; ask for 1 to 103"):
        prepare.fetch_fineweb("unused", "fineweb10B", 104)


def test_abbreviated_options_are_refused(capsys):
    with pytest.raises(SystemExit) as exit:
        prepare.main(["fineweb", "--shard", "1"])
    assert exit.value.code == 2 and "unrecognized arguments: --shard 1" in capsys.readouterr().err
