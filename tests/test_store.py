"""store.py: a dataset replaced in place is the old one or the new one after a kill at any moment
of the writer, and of the recovery that the next check_dataset runs."""
import os
import shutil
import signal

import numpy as np
import pytest

import data
import store

# Every file-system change write_dataset and _move_in make goes through one of these.
CHANGES = ("mkdir", "replace", "rename", "unlink", "rmdir")


def killed_at(step, action):
    """Run action() in a forked child that SIGKILLs itself just before its step-th file-system
    change; True if it was killed, False if action() ended first (an exception fails the test)."""
    pid = os.fork()
    if pid == 0:                                      # the child: never returns into pytest
        status = 1
        try:
            done = [0]
            for name in CHANGES:
                def change(*args, _real=getattr(os, name), **kwargs):
                    done[0] += 1
                    if done[0] == step:
                        os.kill(os.getpid(), signal.SIGKILL)
                    return _real(*args, **kwargs)
                setattr(os, name, change)
            action()
            status = 0
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) or os.waitstatus_to_exitcode(status) == 0, "the child failed"
    return os.WIFSIGNALED(status)


def files(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def tokens(n, seed):
    return np.random.default_rng(seed).integers(0, 100, n).astype(np.uint16)


def test_a_kill_at_any_moment_of_a_replacement_leaves_the_old_or_the_new_dataset(tmp_path,
                                                                                   monkeypatch):
    """The old dataset has 3 train shards, the new one 2 (one old shard must go), both an extra
    file; a file of the user's sits beside them. For every k, the writer is killed before its
    k-th change; if that left a replacement half-way, the recovery is killed before each of its
    own changes in turn too. Whatever was killed, check_dataset then opens the old dataset or
    the new one, byte for byte, `store.py check` passes, and the user's file is untouched."""
    monkeypatch.setattr(data, "SHARD_TOKENS", 40)
    old, out, snapshot = tmp_path / "old", tmp_path / "ds", tmp_path / "snapshot"
    store.write_dataset(old, "syn", {"train": tokens(120, 0), "val": tokens(10, 1)},
                        {"kind": "old"}, {"ids.npy": b"old ids"})
    (old / "notes.txt").write_text("the user's own file")
    new_splits, new_extras = {"train": tokens(80, 2), "val": tokens(12, 3)}, {"ids.npy": b"new"}
    new = tmp_path / "new"
    store.write_dataset(new, "syn", new_splits, {"kind": "new"}, new_extras)
    (new / "notes.txt").write_text("the user's own file")
    expected = {"old": files(old), "new": files(new)}
    assert len(expected["old"]) == 7 and len(expected["new"]) == 6  # shards, extra, manifest, notes

    def opened():  # the dataset check_dataset and `store.py check` find there now
        store.check_dataset(out)
        store.main(["check", str(out)])
        found = [name for name, content in expected.items() if files(out) == content]
        assert found, f"neither the old nor the new dataset: {sorted(files(out))}"
        return found[0]

    outcomes, recoveries, k = [], [], 0
    while True:
        k += 1
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(old, out)
        if not killed_at(k, lambda: store.write_dataset(out, "syn", new_splits, {"kind": "new"},
                                                        new_extras)):
            break                                     # the writer finished: every step was hit
        if (out / store.NEW_DATASET).exists():
            shutil.rmtree(snapshot, ignore_errors=True)
            shutil.copytree(out, snapshot)
            j = 0
            while killed_at(j := j + 1, lambda: store.check_dataset(out)):
                assert opened() == "new"              # what the killed recovery left, finished
                shutil.rmtree(out)
                shutil.copytree(snapshot, out)
            recoveries.append(j - 1)                  # the kill points it had
        outcomes.append(opened())
    assert opened() == "new" and not (out / store.NEW_DATASET).exists()
    assert k > 10 and outcomes[0] == "old" and outcomes[-1] == "new"
    assert max(recoveries) == 7  # 4 files moved in, 1 old shard removed, the manifest, the folder
    assert outcomes == sorted(outcomes, reverse=True)  # old until the commit, new after it


def test_a_replacement_that_cannot_be_finished_is_refused_in_one_sentence(tmp_path, monkeypatch):
    out = tmp_path / "ds"
    store.write_dataset(out, "syn", {"train": tokens(50, 0), "val": tokens(10, 1)}, {"kind": "a"})
    monkeypatch.setattr(store, "_move_in", lambda folder: None)   # the writer "dies" after commit
    store.write_dataset(out, "syn", {"train": tokens(60, 2), "val": tokens(10, 3)}, {"kind": "b"})
    monkeypatch.undo()

    def read_only(source, target):
        raise store.write_error(PermissionError(13, "Permission denied"), target)
    monkeypatch.setattr(store, "rename", read_only)
    with pytest.raises(ValueError, match=rf"^{out} is half-way through a replacement that a "
                       rf"stopped prepare.py began and could not be finished here \(could not "
                       rf"write {out}/\S+ \(Permission denied\)\); run `python store.py check "
                       rf"{out}` as one who may write it$"):
        store.check_dataset(out)
    monkeypatch.undo()
    store.check_dataset(out)                          # a user who may write it finishes it
    assert store.read_manifest(out)["source"] == {"kind": "b"}


def test_a_kill_while_writing_into_an_empty_folder_leaves_what_a_rerun_completes(tmp_path):
    """The text cache writes with replace=False into a folder named for its text: a kill at
    any moment leaves it empty to the next writer (a killed writer's staging folder is no
    dataset) or holding the whole dataset, which the next writer keeps."""
    splits = {"train": tokens(50, 0), "val": tokens(10, 1)}
    new, out = tmp_path / "new", tmp_path / "a"
    store.write_dataset(new, "syn", splits, {"kind": "new"})
    write = lambda: store.write_dataset(out, "syn", splits, {"kind": "new"}, replace=False)
    k = 0
    while True:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        killed = killed_at(k := k + 1, write)
        kept = (out / store.NEW_DATASET).exists() or (out / store.MANIFEST).exists()
        try:
            write()                                   # the next writer: one like the killed one
        except FileExistsError:
            assert kept                               # a whole dataset was there: it stays
        store.check_dataset(out)
        assert files(out) == files(new)
        assert sorted(p.name for p in out.iterdir()) == sorted(files(new))  # no folder left
        if not killed:
            break
    assert k > 5
