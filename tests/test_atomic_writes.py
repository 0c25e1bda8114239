"""Write failures of scripts.atomic's writers (a full disk, a full quota, the file size limit) as one line naming the
file; the temporaries a killed writer leaves; the folder lock a run holds."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]

# in a subprocess: the file size limit at 64 KiB (SIGXFSZ ignored, so a write past it fails with EFBIG instead of
# killing the process); each writer's error reported as JSON, then a checkpoint save's printed as GLAMWorkflow does
_LIMITED = textwrap.dedent(
    """
    import errno, json, resource, signal, sys
    import torch
    sys.path.insert(0, "bundle")
    from scripts.atomic import atomic_path, atomic_write
    from scripts.errors import error_line, user_error
    from scripts.training.checkpoints import CheckpointFiles

    folder = sys.argv[1]
    CheckpointFiles(folder)({"w": torch.ones(10)}, "last.pt")  # a small earlier checkpoint, under the limit
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (65536, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    def report(err):
        print(json.dumps({"type": type(err).__name__, "errno": getattr(err, "errno", None),
                          "filename": getattr(err, "filename", None), "chained": err.__cause__ is not None
                          or (err.__context__ is not None and not err.__suppress_context__)}), flush=True)

    try:
        with atomic_write(folder + "/report.json", "w") as f:
            f.write("x" * 200000)
    except BaseException as err:
        report(err)
    try:
        with atomic_path(folder + "/image.bin") as tmp:
            tmp.write_bytes(b"y" * 200000)
    except BaseException as err:
        report(err)
    try:  # as GLAMWorkflow prints a user's error
        CheckpointFiles(folder)({"w": torch.zeros(100000)}, "last.pt")
    except Exception as err:
        print(error_line(user_error(err)), file=sys.stderr)
        sys.exit(1)
    """
)


def test_the_file_size_limit_is_one_line_naming_the_file_and_leaves_the_earlier_files(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", _LIMITED, str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    reports = [json.loads(line) for line in proc.stdout.splitlines()]
    names = [str(tmp_path / "report.json"), str(tmp_path / "image.bin")]
    assert reports == [{"type": "OSError", "errno": errno.EFBIG, "filename": n, "chained": False} for n in names]
    assert proc.returncode == 1
    last = tmp_path / "last.pt"
    assert proc.stderr.splitlines() == [
        f"error: file too large for the file size limit (ulimit -f) writing {last}; the last good checkpoint is "
        f"{last} (raise the limit: ulimit -f unlimited, then continue with --resume true)",
    ], proc.stderr[-3000:]
    assert torch.equal(torch.load(last, weights_only=True)["w"], torch.ones(10))  # the earlier checkpoint, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]  # no temporary, no partial file


class _FailingFile:
    """A file object whose writes fail with ``code`` once ``after`` bytes went through (a disk or quota filling up)."""

    def __init__(self, f, code: int, after: int = 1000) -> None:
        self.f, self.code, self.left = f, code, after

    def write(self, data) -> int:
        if len(data) > self.left:
            raise OSError(self.code, os.strerror(self.code))
        self.left -= len(data)
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)


@pytest.mark.parametrize(
    "code, words",
    [(errno.ENOSPC, "no space left on device"), (getattr(errno, "EDQUOT", errno.ENOSPC), "disk quota exceeded")],
)
def test_a_full_disk_or_quota_during_a_checkpoint_save_is_one_oserror_naming_the_file(
    tmp_path, monkeypatch, code, words
):
    from scripts.errors import disk_full_message, user_error
    from scripts.networks.weights import save_atomic

    target = tmp_path / "model.pt"
    save_atomic({"w": torch.ones(3)}, target)
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f, **kw: real_save(obj, _FailingFile(f, code), **kw))
    with pytest.raises(OSError) as caught:
        save_atomic({"w": torch.zeros(100000)}, target)
    err = caught.value
    assert (type(err), err.errno, err.filename) == (OSError, code, str(target))
    assert err.__cause__ is None and err.__suppress_context__  # one error, not torch's RuntimeError chained to it
    assert user_error(err) is err
    assert disk_full_message(err).startswith(f"{words} writing {target}; the last good checkpoint is {target} (")
    monkeypatch.undo()
    assert torch.equal(torch.load(target, weights_only=True)["w"], torch.ones(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]


def test_remove_temporaries_clears_the_writers_own_names_only(tmp_path, caplog):
    from scripts.atomic import atomic_path, atomic_write, remove_temporaries

    # the names the writers really use, caught mid-write
    with atomic_write(tmp_path / "last.pt"):
        (written,) = [p.name for p in tmp_path.iterdir()]
    with atomic_path(tmp_path / "map.nii.gz") as tmp:
        tmp.write_bytes(b"")
        staged = tmp.name
    (tmp_path / "map.nii.gz").unlink()
    leftovers = [written, staged]
    (tmp_path / "last.pt").unlink()
    others = [".last.pt.tmp", "last.pt", ".hidden", "a.tmp", ".tmp-3-x.png", ".last.pt.ABCDEFGH.tmp", "notes.txt"]
    for name in leftovers + others:
        (tmp_path / name).write_bytes(b"")
    (tmp_path / ".model.pt.abcd1234.tmp").mkdir()  # a folder with the pattern's name is not a writer's file
    with caplog.at_level("INFO", logger="scripts.atomic"):
        removed = remove_temporaries(tmp_path)
    assert removed == sorted(leftovers)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*others, ".model.pt.abcd1234.tmp"])
    assert "removed 2 temporary file(s) an interrupted write left" in caplog.text


# -- the folder lock ---------------------------------------------------------------------------------------------------
_HOLD = "import sys, time; sys.path.insert(0, 'bundle'); from scripts.atomic import FolderLock; "


def test_a_folder_lock_refuses_a_second_process_naming_the_first_and_a_dead_holders_lock_is_taken_over(
    tmp_path, caplog
):
    from scripts.atomic import FolderLock

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _HOLD + f"FolderLock({str(tmp_path)!r}, 'training').acquire(); print('held', flush=True); time.sleep(120)",
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(BlockingIOError) as caught:
            FolderLock(tmp_path, "training").acquire()
        assert caught.value.holder["pid"] == holder.pid
        assert f"is held by training pid {holder.pid} on host " in str(caught.value)
        assert ", started 20" in str(caught.value)
    finally:
        holder.kill()
        holder.wait()
    # killed holding it: the kernel freed the lock, the record stays; the next process takes it over, saying so
    with caplog.at_level("WARNING", logger="scripts.atomic"):
        lock = FolderLock(tmp_path, "training").acquire()
    assert lock.stale["pid"] == holder.pid
    assert f"took over the lock of training pid {holder.pid} on host" in caplog.text
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
    lock.release()
    assert (tmp_path / ".lock").read_text() == ""  # released: a free lock, no stale record
    with FolderLock(tmp_path) as again:
        assert again.stale is None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks a child as a data loader worker is made")
def test_a_forked_child_does_not_keep_the_folder_locked_once_the_holder_lets_go(tmp_path):
    from scripts.atomic import FolderLock, lock_exclusive, unlock

    folder_fd = os.open(tmp_path, os.O_RDONLY)  # the inference folder's lock: an flock on the folder itself
    lock_exclusive(folder_fd)
    lock = FolderLock(tmp_path, "training").acquire()
    ready_r, ready_w = os.pipe()
    child = os.fork()  # a data loader worker: alive for a while after its parent stops
    if child == 0:
        os.write(ready_w, b"1")  # running: fork's handlers in the child have run
        time.sleep(5)
        os._exit(0)
    try:
        assert os.read(ready_r, 1) == b"1"
        unlock(folder_fd)
        lock.release()
        other_fd = os.open(tmp_path, os.O_RDONLY)
        try:
            lock_exclusive(other_fd)  # EWOULDBLOCK if the child's copy of the descriptor still held the folder
        finally:
            unlock(other_fd)
        with FolderLock(tmp_path, "training") as again:
            assert again.stale is None
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        os.close(ready_r)
        os.close(ready_w)
