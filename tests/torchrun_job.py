"""A bundle workflow under torchrun, as the tests launch it: ``python -m torch.distributed.run`` with gloo processes on
the CPU (no GPU visible to them) and the loopback (127.0.0.1, a free port, ``GLOO_SOCKET_IFNAME=lo``), one thread
each, in a session of their own, and stopped whole when a test is done with them or they overrun. The one launcher of
the torchrun tests of training, evaluation and inference."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(run_args: Sequence[str], import_dirs: Sequence[str | os.PathLike] = (), nproc: int = 2) -> subprocess.Popen:
    """``python -m monai.bundle run_workflow scripts.GLAMWorkflow --run_id *run_args`` under torchrun on ``nproc``
    processes, from the repository root, its output (stdout and stderr together) on a pipe. ``import_dirs`` go first
    on the workers' PYTHONPATH (the folders of the probes a test's config names), then ``tests/``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr", "127.0.0.1"]
    cmd += [
        "--master_port",
        str(free_port()),
        "-m",
        "monai.bundle",
        "run_workflow",
        "scripts.GLAMWorkflow",
        "--run_id",
        *run_args,
    ]
    paths = [*(str(p) for p in import_dirs), str(REPO_ROOT / "tests"), os.environ.get("PYTHONPATH", "")]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        "GLOO_SOCKET_IFNAME": "lo",  # loopback only
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",  # gloo processes on the CPU, also where a GPU is (one GPU takes one process)
    }
    return subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )


def workers(proc: subprocess.Popen) -> dict[int, int]:
    """rank -> pid of torchrun's workers (children of the torchrun process, RANK in their environment; torchrun starts
    each in a session of its own, so a signal to torchrun's process group does not reach them)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == proc.pid:
            ranks = [int(v[5:]) for v in environ if v.startswith(b"RANK=")]
            if ranks:
                found[ranks[0]] = int(entry.name)
    return found


def kill_job(proc: subprocess.Popen) -> None:
    """SIGKILL every worker, then torchrun: the whole job at once (as a scheduler's cancel does)."""
    for pid in workers(proc).values():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # it ended meanwhile
            pass
    os.killpg(proc.pid, signal.SIGKILL)


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    """The job's output once it ends; a test failure (with the output's end) when it runs past ``timeout`` seconds,
    the whole job killed."""
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_job(proc)
        output, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish in {timeout} s:\n{output.decode(errors='replace')[-4000:]}")
    return output.decode(errors="replace")


def run(
    run_args: Sequence[str], log_dir: Path, import_dirs: Sequence[str | os.PathLike] = (), timeout: float = 240
) -> str:
    """:func:`start` then :func:`finish`; the output is kept as ``log_dir/torchrun.log`` and returned. A job that
    exits with an error fails the test, showing its first traceback (else the output's end)."""
    proc = start(run_args, import_dirs)
    log = finish(proc, timeout)
    (Path(log_dir) / "torchrun.log").write_text(log)
    first_error = log.find("Traceback")
    assert proc.returncode == 0, log[first_error : first_error + 6000] if first_error >= 0 else log[-4000:]
    return log
