"""data.py (shard format, the rank-strided loader), store.py (datasets as a unit, safe writes)
and prepare.py (GPT-2 text, synthetic languages, download)."""
import errno
import hashlib
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import tiktoken
import torch

import data
import prepare
import store

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
    elif how == "byte":
        raw += b"\0"
    elif how in ("more", "fewer", "negative"):          # the token count, against the file
        raw[8:12] = np.int32({"more": 101, "fewer": 99, "negative": -5}[how]).tobytes()
    path.write_bytes(bytes(raw))


CORRUPTIONS = [
    ("version", "version 7"),
    ("truncated", "is truncated: its header announces 100 tokens"),
    ("header", "shorter than the 1024-byte header"), ("extra", "longer than its header says"),
    ("byte", "longer than its header says"), ("more", "truncated: its header announces 101"),
    ("fewer", "longer than its header says: its header announces 99"),
    ("negative", "corrupt header: it announces -5 tokens")]


@pytest.mark.parametrize("how, message", CORRUPTIONS)
def test_header_validation_catches_each_corruption(tmp_path, how, message):
    path = tmp_path / "x_train_000000.bin"
    data.write_shard(path, np.arange(100))
    corrupt(path, how)
    with pytest.raises(ValueError, match=message) as refused:
        data.read_shard(path)
    assert "delete" not in str(refused.value)               # the advice destroys nothing
    with pytest.raises(ValueError, match=message):
        data.ShardLoader(tmp_path, 1, 4)


def test_a_file_without_the_magic_is_headerless_tokens_unless_a_header_is_required(tmp_path):
    path = tmp_path / "x_train_000000.bin"
    np.arange(600, dtype="<u2").tofile(path)               # bare tokens, as nanoGPT writes them
    np.testing.assert_array_equal(data.read_shard(path), np.arange(600))
    assert data.shard_length(path, headerless=True) == 600
    with pytest.raises(ValueError, match=r"x_train_000000.bin has no llm.c shard header \(its "
                                         r"first int32 is not 20240520\); make it again"):
        data.shard_length(path)                             # as a download must be
    path.write_bytes(path.read_bytes() + b"\0")             # an odd size is no uint16 tokens
    with pytest.raises(ValueError, match=r"is neither an llm.c shard \(its first int32 is not "
                                         r"20240520\) nor headerless uint16 tokens \(its size, "
                                         r"1201 bytes, is odd\); make it again"):
        data.read_shard(path)


def test_an_llm_c_shard_whose_magic_was_hit_is_refused_not_read_as_tokens(tmp_path):
    """Its version and token count still fit its size: a header, not 512 tokens of one."""
    path = tmp_path / "x_train_000000.bin"
    data.write_shard(path, np.arange(100))
    corrupt(path, "magic")
    for headerless in (False, True):
        with pytest.raises(ValueError, match=r"x_train_000000.bin is an llm.c shard whose magic "
                                             r"number is 12345, not 20240520; make it again"):
            data.shard_length(path, headerless=headerless)


def nanogpt_folder(folder, tokens):
    """train.bin and val.bin as nanoGPT's prepare scripts write them: bare uint16, no header."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, part in (("train", tokens[:len(tokens) * 9 // 10]),
                        ("val", tokens[len(tokens) * 9 // 10:])):
        memmap = np.memmap(folder / f"{split}.bin", dtype=np.uint16, mode="w+", shape=part.shape)
        memmap[:] = part
        memmap.flush()


def test_nanogpt_bins_are_read_as_they_are_and_checked_as_a_dataset(tmp_path, capsys):
    tokens = np.random.default_rng(0).integers(0, 1000, size=5000)
    tokens[3] = 50000                                       # the largest id, among the first 512
    nanogpt_folder(tmp_path, tokens)
    np.testing.assert_array_equal(data.read_shard(tmp_path / "train.bin"), tokens[:4500])
    x, y = data.ShardLoader(tmp_path, 4, 16).next_batch()
    assert torch.equal(x.flatten(), torch.from_numpy(tokens[:64])) and y[-1, -1] == tokens[64]
    val = torch.cat([x.flatten() for x, _ in data.val_batches(tmp_path, 448, 4, 16)])
    assert torch.equal(val, torch.from_numpy(tokens[4500:4948]))
    store.main(["check", str(tmp_path)])                    # no manifest: one is written
    assert "had no manifest" in capsys.readouterr().out
    files = store.read_manifest(tmp_path)["files"]
    assert files["train.bin"]["max_token"] == 50000 and files["val.bin"]["bytes"] == 1000
    store.check_vocab(tmp_path, 50001)
    with pytest.raises(ValueError, match="train.bin holds token id 50000"):
        store.check_vocab(tmp_path, 50000)


@pytest.mark.parametrize("how, message", CORRUPTIONS)
def test_check_refuses_a_corrupt_shard_before_writing_a_manifest(tmp_path, how, message):
    make_shards(tmp_path, "train", [100])
    make_shards(tmp_path, "val", [100])
    corrupt(tmp_path / "t_val_000000.bin", how)
    with pytest.raises(SystemExit) as failure:
        store.main(["check", str(tmp_path)])
    assert message in str(failure.value) and "\n" not in str(failure.value)
    assert not (tmp_path / "manifest.json").exists()


def test_check_of_an_empty_folder_fails_and_leaves_it_empty(tmp_path):
    with pytest.raises(SystemExit, match=r"store.py check: error: no train shards"):
        store.main(["check", str(tmp_path)])
    assert not list(tmp_path.iterdir())


def test_missing_data_says_what_to_put_there(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=r"no train shards \(\*train\*.bin\) in .*; put "
                                                r"the split's token files there, llm.c shards "
                                                r"or headerless uint16$"):
        data.ShardLoader(tmp_path, 2, 8)
    monkeypatch.chdir(tmp_path)                             # a typo, or another current folder
    with pytest.raises(FileNotFoundError) as missing:
        data.ShardLoader("tests/assets/paradise.txt", 2, 8)
    assert str(missing.value) == (f"no train shards: tests/assets/paradise.txt does not exist (a "
                                  f"relative path starts in {tmp_path}); check the path")
    with pytest.raises(SystemExit, match=r"^store.py bench: error: no train shards"):
        store.main(["bench", "--data", str(tmp_path)])


def test_write_shard_refuses_ids_beyond_uint16(tmp_path):
    with pytest.raises(ValueError, match=r"\[0, 65535\]"):
        data.write_shard(tmp_path / "a.bin", [1, 70000])
    assert not list(tmp_path.iterdir())


# ----------------------------------------------------------------------------- GPT-2 text
def test_gpt2_ids():
    enc = prepare.gpt2_encoding()
    assert enc.encode_ordinary("Hello world") == [15496, 995]
    assert enc.eot_token == data.EOT == 50256


def test_missing_vocabulary_says_how_to_seed_the_cache(monkeypatch, tmp_path):
    def offline(name):
        raise ConnectionError("no network")
    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    monkeypatch.setattr(prepare, "GPT2_CACHE", tmp_path)  # the shipped copy is tried too
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty"))
    with pytest.raises(RuntimeError, match="ConnectionError.*set TIKTOKEN_CACHE_DIR"):
        prepare.gpt2_encoding()


OFFLINE_SAMPLE = """
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


def test_offline_the_download_is_tried_and_said_once_not_at_every_command(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TIKTOKEN_CACHE_DIR"}
    env["TMPDIR"] = str(tmp_path)                           # tiktoken's own default cache: empty
    outputs = [subprocess.run([sys.executable, "-c", OFFLINE_SAMPLE, str(tmp_path / "cache")],
                              cwd=ROOT, env=env, capture_output=True, text=True).stdout
               for _ in range(2)]                           # e.g. sample.py, twice
    first, again = (out.splitlines() for out in outputs)
    assert first[0] == "download attempted" and first[-2].startswith(
        "the GPT-2 vocabulary could not be downloaded (ConnectionError)")
    assert first[-1] == again[0] == "[15496, 995]" and len(again) == 1


def test_text_pieces_tokenize_exactly_like_the_whole_text():
    text = PARADISE.read_text(encoding="utf-8")
    pieces = prepare.text_pieces(text, max_chars=3000)
    assert len(pieces) > 30 and "".join(pieces) == text
    assert max(map(len, pieces)) <= 3000
    enc = prepare.gpt2_encoding()
    whole = enc.encode_ordinary(text)
    assert sum((enc.encode_ordinary(p) for p in pieces), []) == whole


def test_text_to_shards_to_loader_decodes_back(tmp_path):
    second = tmp_path / "second.txt"
    second.write_text("A second document.\n\nIt ends here.", encoding="utf-8")
    out = tmp_path / "text"
    prepare.main(["text", str(PARADISE), str(second), "--out", str(out), "--workers", "2"])
    assert sorted(p.name for p in out.iterdir()) == \
        ["manifest.json", "text_train_000000.bin", "text_val_000000.bin"]
    train, val = (data.read_shard(p) for p in sorted(out.glob("*.bin")))
    enc = prepare.gpt2_encoding()
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


def test_text_too_short_for_a_train_and_a_val_split_is_refused(tmp_path):
    one = tmp_path / "one.txt"
    one.write_text("a", encoding="utf-8")                   # [EOT, "a"]: 2 tokens
    with pytest.raises(SystemExit, match="2 tokens are too few to split into train and val of "
                                         "at least 2 tokens each"):
        prepare.main(["text", str(one), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_empty_text_file_is_refused(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n", encoding="utf-8")
    with pytest.raises(SystemExit, match="empty.txt is empty"):
        prepare.main(["text", str(PARADISE), str(empty), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


@pytest.mark.parametrize("make, kind", [(lambda p: os.mkfifo(p), "not a regular file"),
                                        (lambda p: p.mkdir(), "a folder")])
def test_a_pipe_or_a_folder_given_as_text_is_named_as_such(tmp_path, make, kind):
    odd = tmp_path / "odd"
    make(odd)  # it exists: "does not exist" would send the user looking in the wrong place
    with pytest.raises(SystemExit, match=f"odd is {kind}"):
        prepare.main(["text", str(odd), "--out", str(tmp_path / "out")])


def test_data_py_run_as_a_command_says_it_has_none(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "data.py"), "check", str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr == ("data.py is a library module with no "
                                                    "commands; import it\n")


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
    with pytest.raises(ValueError, match=r"holds 100 tokens, fewer than the 129 one step reads "
                                         r"\(8 sequences × 16 tokens \+ 1\)"):
        data.ShardLoader(tmp_path, 4, 16, world_size=2)     # 2 ranks × 4 rows
    assert 8 * 16 + 1 == 129                                # the sentence's formula, its number
    with pytest.raises(ValueError, match=r"fewer than the 129 one step reads \(16 sequences × 8"):
        data.ShardLoader(tmp_path, 4, 8, step_rows=16)      # a step of 4 micro-batches
    for rows in (12, -8):
        with pytest.raises(ValueError, match=rf"step_rows={rows} must be a positive multiple of "
                                             rf"world_size × batch_size = 8"):
            data.ShardLoader(tmp_path, 4, 4, world_size=2, step_rows=rows)
    with pytest.raises(ValueError, match=r"holds 100 tokens, fewer than the 101 one sequence "
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
    with pytest.raises(ValueError) as older:                # (seed, rank, batch) drew those
        resumed.load_state_dict({"batches": 11})
    assert str(older.value) == ("this run's random windows were drawn by an older data.py and "
                                "cannot be continued exactly; start a new run")


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
    with pytest.raises(ValueError, match=r"does not fit the 1 shard\(s\) of .* in steps of 16 × "
                                         r"4 tokens; resume with the data, batch size and "
                                         r"sequence length the run was saved with$"):
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
                                             rf"the 65 one step reads \(4 sequences × 16 tokens"):
            data.val_steps_held(tmp_path / str(n), 2, 16, world_size=2)


def test_check_vocab_reads_shards_only_where_the_manifest_does_not_record_their_largest_id(
        tmp_path, monkeypatch):
    make_shards(tmp_path, "train", [50, 100])
    make_shards(tmp_path, "val", [20], start=500)
    store.check_vocab(tmp_path, 520)                         # no manifest: every shard is read
    with pytest.raises(ValueError, match="t_val_000000.bin holds token id 519, outside the "
                                         "model's vocabulary of 519"):
        store.check_vocab(tmp_path, 519)
    store.main(["check", str(tmp_path)])                     # records them
    assert [e["max_token"] for e in store.read_manifest(tmp_path)["files"].values()] == \
        [49, 149, 519]
    monkeypatch.setattr(data, "read_shard", None)            # a read would fail now
    store.check_vocab(tmp_path, 520)
    with pytest.raises(ValueError, match="t_train_000001.bin holds token id 149"):
        store.check_vocab(tmp_path, 149)


def test_check_records_the_largest_ids_an_older_manifest_lacks(tmp_path, capsys):
    make_shards(tmp_path, "train", [50])
    make_shards(tmp_path, "val", [20])
    store.write_manifest(tmp_path, {"kind": "test"})
    old = store.read_manifest(tmp_path)
    for entry in old["files"].values():
        del entry["max_token"]                               # as an older prepare.py wrote it
    store.write_atomic(tmp_path / "manifest.json", json.dumps(old))
    fingerprint = store.check_dataset(tmp_path)
    store.main(["check", str(tmp_path)])
    assert "recorded its shards' largest token ids" in capsys.readouterr().out
    new = store.read_manifest(tmp_path)
    assert [e["max_token"] for e in new["files"].values()] == [49, 19]
    assert new["source"] == {"kind": "test"} and store.check_dataset(tmp_path) == fingerprint


# ----------------------------------------------------------------------------- synthetic
def test_synthetic_repeat_rows_are_constant(tmp_path):
    prepare.main(["synthetic", "--task", "repeat", "--vocab", "50", "--tokens", "20000",
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
    tokens = prepare.synthesize_repeat(50257, 40000, 4, seed=0)
    assert data.EOT not in tokens and tokens.max() < 50257


def test_synthetic_markov_has_the_claimed_statistics(tmp_path):
    V, seed = 6, 1
    prepare.main(["synthetic", "--task", "markov", "--vocab", str(V), "--tokens", "300000",
               "--out", str(tmp_path), "--seed", str(seed)])
    P = np.load(tmp_path / "markov_transition.npy")
    pi = np.load(tmp_path / "markov_stationary.npy")
    np.testing.assert_array_equal(P, prepare.markov_transition(V, seed))
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
    assert not np.allclose(P, prepare.markov_transition(V, seed + 1))


def test_an_empty_out_is_refused_not_the_current_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit:
        prepare.main(["synthetic", "--task", "repeat", "--vocab", "5", "--tokens", "1000",
                      "--out", ""])
    assert exit.value.code == 2 and not list(tmp_path.iterdir())
    assert "argument --out: '' is empty; give a folder" in capsys.readouterr().err


def test_synthetic_larger_than_memory_says_what_it_needs(tmp_path):
    with pytest.raises(SystemExit, match=r"--tokens 10,000,000,000,000 needs about 18,626.5 GiB "
                                         r"of memory and as much disk, but this machine has "
                                         r"[\d,.]+ GiB of memory and [\d,.]+ GiB free on /"):
        prepare.main(["synthetic", "--task", "markov", "--vocab", "5", "--tokens", str(10**13),
                      "--out", str(tmp_path / "big")])
    assert not (tmp_path / "big").exists()


def test_synthetic_refuses_bad_settings(tmp_path):
    with pytest.raises(SystemExit, match="2 ≤ --vocab ≤ 4096"):
        prepare.main(["synthetic", "--task", "markov", "--vocab", "50304", "--tokens", "1000",
                   "--out", str(tmp_path)])
    make_shards(tmp_path / "mixed", "train", [10])
    with pytest.raises(SystemExit, match="already holds other shards"):
        prepare.main(["synthetic", "--task", "repeat", "--vocab", "5", "--tokens", "1000",
                   "--out", str(tmp_path / "mixed")])


def test_renumber_keeps_the_order_drops_unseen_val_tokens_and_records_the_old_ids(tmp_path,
                                                                                  capsys):
    splits = {"train": np.array([5, 9, 5, 300, 9, 5]), "val": np.array([9, 7, 300, 5, 7])}
    store.write_dataset(tmp_path / "src", "text", splits, {"kind": "test"})
    prepare.main(["renumber", str(tmp_path / "src"), "--out", str(tmp_path / "dense")])
    assert "3 token ids in use, now 0 … 2 (train with --vocab_size 3); dropped 2 of 5" in \
        capsys.readouterr().out
    train, val = (data.read_shard(data.shard_paths(tmp_path / "dense", split)[0]).tolist()
                  for split in ("train", "val"))
    assert train == [0, 1, 0, 2, 1, 0] and val == [1, 2, 0]
    assert np.load(tmp_path / "dense" / "renumber_ids.npy").tolist() == [5, 9, 300]
    store.check_dataset(tmp_path / "dense")  # a whole dataset, manifest and all
    manifest = json.loads((tmp_path / "dense" / "manifest.json").read_text())
    assert manifest["source"] == {
        "kind": "renumbered", "from": str(tmp_path / "src"), "vocab": 3, "val_dropped": 2}
    with pytest.raises(SystemExit, match="is the source itself; give another folder"):
        prepare.main(["renumber", str(tmp_path / "src"), "--out", str(tmp_path / "src")])


# ----------------------------------------------------------------------------- download
class ShardServer(http.server.BaseHTTPRequestHandler):
    """Serves `files` with Range support; `cut_first` names files whose first answer breaks off.

    `hashes` {name: sha256} are stated as an ETag, or, with `via_hub`, as the X-Linked-Etag of
    a 302 to /cdn/NAME as the Hugging Face hub does; `range_from_zero` makes a 206 reply
    restart at byte 0 whatever was asked."""
    files, cut_first, ranges, hashes, via_hub, range_from_zero = {}, set(), [], {}, False, False

    def do_GET(self):
        name = self.path.rsplit("/", 1)[-1]
        body = self.files.get(name)
        if body is None:
            self.send_error(404)
            return
        if self.via_hub and "/cdn/" not in self.path:
            self.send_response(302)
            self.send_header("Location", f"/cdn/{name}")
            self.send_header("X-Linked-Etag", f'"{self.hashes[name]}"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        asked = int(self.headers["Range"][6:-1]) if self.headers["Range"] else 0
        start = 0 if self.range_from_zero else asked
        self.ranges.append(self.headers["Range"])
        self.send_response(206 if asked else 200)
        if asked:
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        if name in self.hashes and not self.via_hub:
            self.send_header("ETag", f'"{self.hashes[name]}"')
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
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
    ShardServer.cut_first, ShardServer.ranges, ShardServer.hashes = set(), [], {}
    ShardServer.via_hub = ShardServer.range_from_zero = False
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
    prepare.main(["fineweb", "--shards", "1", "--out", str(out), "--base_url", url])
    assert sorted(p.name for p in out.iterdir()) == \
        sorted([p.name for p in source.iterdir()] + ["manifest.json"])
    recorded = store.read_manifest(out)["files"]
    for p in source.iterdir():
        assert (out / p.name).read_bytes() == p.read_bytes()
        assert recorded[p.name] == {"bytes": p.stat().st_size,
                                    "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
                                    "max_token": int(data.read_shard(p).max())}
    half = (len(ShardServer.files["fineweb_train_000001.bin"])) // 2
    assert ShardServer.ranges == [None, None, f"bytes={half}-"]
    assert "MB/s" in capsys.readouterr().out
    prepare.fetch_fineweb(out, train_shards=1, base_url=url)     # all there: nothing fetched again
    assert len(ShardServer.ranges) == 3


def test_download_completes_an_existing_part_file(server, tmp_path, monkeypatch):
    url, source = server
    monkeypatch.setenv("FINEWEB_BASE_URL", url)
    out = tmp_path / "fw"
    out.mkdir()
    body = (source / "fineweb_val_000000.bin").read_bytes()
    (out / "fineweb_val_000000.bin.part").write_bytes(body[:1500])
    prepare.fetch_fineweb(out, train_shards=1)
    assert ShardServer.ranges[0] == "bytes=1500-"
    assert (out / "fineweb_val_000000.bin").read_bytes() == body
    assert not list(out.glob("*.part"))


def test_corrupt_download_is_rejected_and_leaves_no_file(server, tmp_path):
    url, _ = server
    ShardServer.files["fineweb_val_000000.bin"] = b"\x07" * 3000
    out = tmp_path / "fw"
    with pytest.raises(ValueError, match="is corrupt and was deleted .*has no llm.c shard header"):
        prepare.fetch_fineweb(out, train_shards=1, base_url=url)
    assert not list(out.iterdir())


def test_missing_shard_and_offline_errors(server, tmp_path):
    url, _ = server
    with pytest.raises(SystemExit, match="HTTP 404.*check --shards"):
        prepare.main(["fineweb", "--shards", "2", "--out", str(tmp_path / "fw"), "--base_url", url])
    assert not list((tmp_path / "fw").glob("*train_000002*"))
    with socket.socket() as s:                              # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/resolve/main"
    with pytest.raises(SystemExit, match=r"offline, train on local text instead: "
                                         r"`python prepare.py text FILES --out DIR`"):
        prepare.main(["fineweb", "--out", str(tmp_path / "dead"), "--base_url", dead])


def sha256(raw):
    return hashlib.sha256(raw).hexdigest()


def tamper(raw):
    """The same shard with one token changed: a valid header, another hash."""
    return raw[:-2] + bytes([raw[-2] ^ 1, raw[-1]])


def test_a_resumed_reply_must_continue_where_the_part_file_ends(server, tmp_path):
    url, source = server
    body = (source / "fineweb_val_000000.bin").read_bytes()
    out = tmp_path / "fw"
    out.mkdir()
    (out / "fineweb_val_000000.bin.part").write_bytes(body[:1500])
    ShardServer.range_from_zero = True                      # 206, but from byte 0
    with pytest.raises(SystemExit, match=r"bytes from 1500 with Content-Range 'bytes 0-"):
        prepare.main(["fineweb", "--shards", "1", "--out", str(out), "--base_url", url])
    assert (out / "fineweb_val_000000.bin.part").read_bytes() == body[:1500]  # kept as it was
    assert not (out / "fineweb_val_000000.bin").exists()


@pytest.mark.parametrize("via_hub", [False, True])
def test_download_must_match_the_sha256_the_server_states(server, tmp_path, via_hub):
    url, source = server
    ShardServer.via_hub = via_hub                           # X-Linked-Etag on a 302, or ETag
    ShardServer.hashes = {name: sha256(raw) for name, raw in ShardServer.files.items()}
    prepare.fetch_fineweb(tmp_path / "good", train_shards=1, base_url=url)
    recorded = store.read_manifest(tmp_path / "good")["files"]
    assert {name: e["sha256"] for name, e in recorded.items()} == ShardServer.hashes
    ShardServer.files["fineweb_train_000001.bin"] = tamper(ShardServer.files["fineweb_train_000001.bin"])
    with pytest.raises(ValueError, match="corrupt and was deleted .*sha256 differs from the "
                                         + ShardServer.hashes["fineweb_train_000001.bin"]):
        prepare.fetch_fineweb(tmp_path / "bad", train_shards=1, base_url=url)
    assert sorted(p.name for p in (tmp_path / "bad").iterdir()) == \
        ["fineweb_val_000000.bin", "manifest.json"]


def test_shards_recorded_by_no_manifest_are_recorded_without_downloading(server, tmp_path):
    url, _ = server
    out = tmp_path / "fw"
    prepare.fetch_fineweb(out, train_shards=1, base_url=url)
    fingerprint = store.check_dataset(out)
    (out / "manifest.json").unlink()                        # an older data.py, or a kill
    assert store.check_dataset(out) != fingerprint           # sizes only, still accepted
    requests = len(ShardServer.ranges)
    prepare.fetch_fineweb(out, train_shards=1, base_url=url)
    assert len(ShardServer.ranges) == requests and store.check_dataset(out) == fingerprint


def test_disk_full_during_a_download_says_so(server, tmp_path, monkeypatch):
    url, _ = server
    fill_disk_under(tmp_path / "fw", monkeypatch)
    with pytest.raises(SystemExit) as failure:
        prepare.main(["fineweb", "--shards", "1", "--out", str(tmp_path / "fw"), "--base_url", url])
    message = str(failure.value)
    assert re.fullmatch(r"prepare.py fineweb: error: the disk is full: could not write \S+"
                        r"fineweb_val_000000.bin.part \([\d,]+ bytes free on /\S*\)", message)
    assert "offline" not in message


def test_fineweb100b_is_the_default_and_only_the_shards_a_run_reads_are_fetched():
    paper_tokens = 100_000 * 64 * 2048                      # steps × batch × seq_len
    assert prepare.DEFAULT_DATA == "data/fineweb100B"
    assert prepare.shards_needed(paper_tokens) == 132          # 13.1B tokens: 131.07 shards
    assert prepare.shards_needed(paper_tokens, "fineweb10B") == 103   # all it has: 10.3B
    assert prepare.shards_needed(1) == 1
    with pytest.raises(ValueError, match="fineweb10B has 103 train shards; ask for 1 to 103"):
        prepare.fetch_fineweb("unused", "fineweb10B", 104)


# ----------------------------------------------------------------------------- safe writes
def fill_disk_under(folder, monkeypatch, after=0):
    """Make every write to a file under folder fail with ENOSPC once `after` bytes went in."""
    real_write, written = os.write, [0]

    def write(fd, raw):
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(folder)):
            if written[0] + len(raw) > after:
                raise OSError(errno.ENOSPC, "No space left on device")
            written[0] += len(raw)
        return real_write(fd, raw)
    monkeypatch.setattr(os, "write", write)


def test_disk_full_during_a_save_says_so_and_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "ckpt.pt"
    with store.open_atomic(target) as f:
        torch.save({"step": 1}, f)
    fill_disk_under(tmp_path, monkeypatch, after=4096)
    with pytest.raises(store.DiskFullError, match=r"^the disk is full: could not write "
                                                 rf"{re.escape(str(target))} \([\d,]+ bytes free"):
        with store.open_atomic(target) as f:
            torch.save({"step": 2, "weights": torch.zeros(100_000)}, f)   # torch wraps the error
    assert torch.load(target) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]     # no temporary file left
    fill_disk_under(tmp_path, monkeypatch)
    with pytest.raises(store.DiskFullError, match="the disk is full"):
        store.write_atomic(tmp_path / "summary.json", "{}")


def test_write_atomic_uses_a_unique_temporary_name_and_names_the_failure(tmp_path, monkeypatch):
    names = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: names.append(Path(a).name) or real_replace(a, b))
    for _ in range(2):
        store.write_atomic(tmp_path / "a.json", "{}")
    assert len(set(names)) == 2 and all(n.startswith(".a.json.") for n in names)
    (tmp_path / "file").write_text("x")
    with pytest.raises(store.WriteError, match=r"could not write \S+/file/a.json \(Not a directory\)"):
        store.write_atomic(tmp_path / "file" / "a.json", "{}")


# ----------------------------------------------------------------------------- datasets as a unit
def prepare_small_text(out, text):
    source = out.parent / f"{out.name}.txt"
    source.write_text(text, encoding="utf-8")
    prepare.prepare_text([source], out, workers=1)


def contents(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_a_failed_rewrite_leaves_the_old_dataset_intact(tmp_path, monkeypatch):
    out = tmp_path / "ds"
    prepare_small_text(out, "The old text, line after line.\n" * 200)
    before = contents(out)
    stale = out / ".ds.999999999.dead.staging"                # left by a killed writer
    stale.mkdir()
    real = data.write_shard

    def disk_full_at_val(path, tokens):
        if "val" in Path(path).name:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, tokens)
    monkeypatch.setattr(data, "write_shard", disk_full_at_val)
    with pytest.raises(OSError):
        prepare_small_text(out, "Quite another text now.\n" * 300)
    assert contents(out) == before                          # nothing replaced ...
    assert [p.name for p in out.iterdir() if p.is_dir()] == []   # ... and nothing left


def test_an_interrupted_replacement_is_finished_by_the_next_reader(tmp_path, monkeypatch):
    out, fresh = tmp_path / "ds", tmp_path / "fresh"
    prepare_small_text(out, "The old text, line after line.\n" * 200)
    real, renames = store.rename, []

    def killed_after_one(source, target):                   # of the shards renamed into out
        if Path(target).parent == out and Path(target).name.endswith(".bin"):
            if renames:
                raise KeyboardInterrupt                     # a kill between two renames
            renames.append(target)
        real(source, target)
    monkeypatch.setattr(store, "rename", killed_after_one)
    with pytest.raises(KeyboardInterrupt):
        prepare_small_text(out, "Quite another text now.\n" * 300)
    monkeypatch.undo()
    assert renames                                          # it was killed mid-move
    store.check_dataset(out)                                # what every reader calls first
    prepare_small_text(fresh, "Quite another text now.\n" * 300)
    assert {p.name: p.read_bytes() for p in out.glob("*.bin")} == \
        {p.name: p.read_bytes() for p in fresh.glob("*.bin")}   # the new dataset, whole


def test_of_two_writers_of_one_folder_the_second_is_told_and_the_first_wins(tmp_path, monkeypatch):
    out = tmp_path / "ds"

    def synthetic(seed):
        prepare.main(["synthetic", "--task", "repeat", "--vocab", "5", "--tokens", "1000",
                      "--out", str(out), "--seed", str(seed)])
    synthetic(0)                                            # a dataset both writers replace
    real, second = store.rename, []

    def meanwhile(source, target):                          # the first writer is mid-swap
        if not second and Path(target).parent == out:
            with pytest.raises(SystemExit) as failure:
                synthetic(2)
            second.append(str(failure.value))
        real(source, target)
    monkeypatch.setattr(store, "rename", meanwhile)
    synthetic(1)
    monkeypatch.undo()
    assert second == [f"prepare.py synthetic: error: another process is writing a dataset into "
                      f"{out} right now, so this one was not written; run the command again "
                      f"when it has finished"]
    store.check_dataset(out)                                # whole, and the first writer's
    assert store.read_manifest(out)["source"]["seed"] == 1
    assert sorted(p.name for p in out.iterdir()) == \
        ["manifest.json", "repeat_train_000000.bin", "repeat_val_000000.bin"]


def test_a_mixed_folder_is_refused_in_one_sentence(tmp_path):
    prepare_small_text(tmp_path / "a", "One text, line after line.\n" * 200)
    prepare_small_text(tmp_path / "b", "Another text, longer lines here.\n" * 300)
    a, b = tmp_path / "a", tmp_path / "b"
    fingerprint = store.check_dataset(a)
    (a / "text_train_000001.bin").write_bytes((b / "text_train_000000.bin").read_bytes())
    with pytest.raises(ValueError, match="text_train_000001.bin is not named in .*manifest.json, "
                                         "so the folder mixes datasets"):
        store.check_dataset(a)
    (a / "text_train_000001.bin").unlink()
    val = (a / "text_val_000000.bin").read_bytes()
    (a / "text_val_000000.bin").write_bytes((b / "text_val_000000.bin").read_bytes())
    with pytest.raises(ValueError, match=r"text_val_000000.bin has \d+ bytes, but the manifest "
                                         r"records \d+ bytes"):
        store.check_dataset(a, hash_bytes=0)
    (a / "text_val_000000.bin").write_bytes(tamper(val))    # same size, another content
    store.check_dataset(a, hash_bytes=0)                    # sizes only unless asked
    with pytest.raises(ValueError, match="sha256 mismatch"):
        store.check_dataset(a)
    (a / "text_val_000000.bin").write_bytes(val)
    assert store.check_dataset(a) == fingerprint


def test_a_directory_named_like_a_shard_is_refused(tmp_path):
    make_shards(tmp_path, "train", [100])
    (tmp_path / "t_train_000001.bin").mkdir()
    with pytest.raises(ValueError, match=r"t_train_000001.bin is named like a shard but is not a "
                                         r"file; rename or remove it"):
        data.ShardLoader(tmp_path, 2, 8)
    with pytest.raises(SystemExit, match=r"t_train_000000.bin is a file; give a folder$"):
        prepare.main(["synthetic", "--task", "repeat", "--vocab", "5", "--tokens", "1000",
                   "--out", str(tmp_path / "t_train_000000.bin")])


def test_fingerprint_follows_content_not_path_and_check_records_foreign_shards(tmp_path, capsys):
    for name in ("x", "y"):
        prepare_small_text(tmp_path / name, "Same text.\n" * 300)
    assert store.check_dataset(tmp_path / "x") == store.check_dataset(tmp_path / "y")
    make_shards(tmp_path / "foreign", "train", [100])
    make_shards(tmp_path / "foreign", "val", [50])
    sizes_only = store.check_dataset(tmp_path / "foreign")   # no manifest: accepted as it is
    store.main(["check", str(tmp_path / "foreign")])
    assert "wrote" in capsys.readouterr().out
    assert store.check_dataset(tmp_path / "foreign") not in (sizes_only, None)
    assert set(store.read_manifest(tmp_path / "foreign")["files"]) == \
        {"t_train_000000.bin", "t_val_000000.bin"}


def test_text_files_are_tokenized_once_into_a_cache(tmp_path, monkeypatch):
    text = tmp_path / "story.txt"
    text.write_text("Once upon a time.\n" * 300, encoding="utf-8")
    cache = tmp_path / "cache"
    folder = prepare.text_dataset([text], cache_root=cache, workers=1)
    assert folder.parent == cache and folder.name.startswith("story-")
    fingerprint = store.check_dataset(folder)
    monkeypatch.setattr(prepare, "tokenize_texts", None)       # a second tokenizing would fail
    assert prepare.text_dataset([text], cache_root=cache) == folder
    monkeypatch.undo()
    text.write_text("Once upon another time.\n" * 300, encoding="utf-8")
    edited = prepare.text_dataset([text], cache_root=cache, workers=1)
    assert edited != folder and store.check_dataset(edited) != fingerprint
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["source"]["key"] = "0" * 64                    # the cache changed under its name
    store.write_atomic(folder / "manifest.json", json.dumps(manifest))
    text.write_text("Once upon a time.\n" * 300, encoding="utf-8")
    with pytest.raises(ValueError, match=f"the cached dataset {re.escape(str(folder))} does not "
                                         f"hold the tokens of .*story.txt"):
        prepare.text_dataset([text], cache_root=cache)


# ----------------------------------------------------------------------------- command line
@pytest.mark.parametrize("script, argv, message", [
    (store, ["bench", "--data", "x", "--steps", "-5"],
     "argument --steps: -5 is invalid; give an integer > 0"),
    (store, ["bench", "--data", "x", "--batch_size", "0"],
     "argument --batch_size: 0 is invalid; give an integer > 0"),
    (prepare, ["fineweb", "--shards", "0"], "argument --shards: 0 is invalid"),
    (prepare, ["synthetic", "--task", "repeat", "--vocab", "5", "--tokens", "-1", "--out", "x"],
     "argument --tokens: -1 is invalid"),
    (prepare, ["synthetic", "--task", "repeat", "--vocab", "5", "--tokens", "99", "--out", "x",
               "--seed", "-1"], "argument --seed: -1 is invalid; give an integer >= 0"),
    (prepare, ["text", "a.txt", "--out", "x", "--val_fraction", "1.5"],
     "argument --val_fraction: 1.5 is invalid; give a number strictly between 0 and 1"),
    (prepare, ["text", "a.txt", "--out", "x", "--workers", "two"],
     "argument --workers: 'two' is not a number"),
])
def test_nonsense_numbers_are_refused(script, argv, message, capsys):
    with pytest.raises(SystemExit) as exit:
        script.main(argv)
    assert exit.value.code == 2 and message in capsys.readouterr().err


def test_the_loader_works_without_tiktoken(tmp_path):
    make_shards(tmp_path, "train", [100])
    script = f"""
import sys
sys.modules["tiktoken"] = None                              # `import tiktoken` fails
import data
x, y = data.ShardLoader({str(tmp_path)!r}, 2, 8).next_batch()
assert y[0, 0].item() == 1
import prepare
try:
    prepare.gpt2_encoding()
except RuntimeError as err:
    print(err)
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("tokenizing text needs tiktoken, which is not installed; "
                                   "run `pip install tiktoken`")


def test_two_runs_caching_the_same_text_at_once_share_one_folder(tmp_path, monkeypatch):
    text = tmp_path / "story.txt"
    text.write_text("Once upon a time.\n" * 300, encoding="utf-8")
    real, calls, theirs = prepare.tokenize_texts, [], {}

    def meanwhile_another_run_finishes(texts, workers=None):
        calls.append(1)
        if len(calls) == 1:                                 # the other run, while we tokenize
            other = prepare.text_dataset([text], cache_root=tmp_path / "cache", workers=1)
            theirs.update({p.name: p.stat().st_ino for p in other.iterdir()})
        return real(texts, workers)
    monkeypatch.setattr(prepare, "tokenize_texts", meanwhile_another_run_finishes)
    folder = prepare.text_dataset([text], cache_root=tmp_path / "cache", workers=1)
    assert len(calls) == 2 and [p.name for p in (tmp_path / "cache").iterdir()] == [folder.name]
    assert {p.name: p.stat().st_ino for p in folder.iterdir()} == theirs  # used, not replaced


# ----------------------------------------------------------------------------- through train.py
def test_a_run_in_random_order_resumes_bit_for_bit(tmp_path):
    import train                                             # the data order as train.py uses it
    prepare.prepare_synthetic("markov", vocab=64, n_tokens=40_000, out_dir=tmp_path / "d",
                              seq_len=32)

    def run(out, *extra):
        return train.main(["--size", "tiny", "--device", "cpu", "--vocab_size", "64", "--data",
                           str(tmp_path / "d"), "--out_dir", str(tmp_path / out), "--steps", "6",
                           "--warmup", "1", "--seq_len", "32", "--batch_size", "4",
                           "--micro_batch", "2", "--eval_tokens", "256", "--stat_tokens", "64",
                           "--save_every", "2", "--data_order", "random", *extra])
    whole = run("whole")
    run("cut", "--stop_at", "3")                            # killed after step 3, saved at 2
    resumed = run("cut", "--resume")
    for name, tensor in whole.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), name
    in_order = run("sequential", "--data_order", "sequential")  # same seed, same initial weights
    assert not torch.equal(whole.wte.weight, in_order.wte.weight)
