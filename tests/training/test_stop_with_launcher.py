"""A torchrun job stops whole when its launcher is killed outright: every rank joins the process group through
scripts.distributed.init_distributed (training, evaluation and inference alike), which makes the kernel kill the rank
when torchrun ends."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torchrun_job
from conftest import TRAIN_CONFIG

META = TRAIN_CONFIG.parent / "metadata.json"


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead and waiting for its reaper, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _wait(condition, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table from /proc")
def test_sigkill_of_torchrun_stops_every_rank(tmp_path):
    # each rank joins the group as the workflows do, says so, then works for much longer than the test waits
    config = tmp_path / "sleeper.yaml"
    config.write_text(
        "+imports: [$import scripts.distributed, $import ignite.distributed as idist, $import time]\n"
        "sleeper:\n"
        "  - $scripts.distributed.init_distributed(overlay='sleeper.yaml', command='sleeper')\n"
        f"  - $open(os.path.join({json.dumps(str(tmp_path))}, f'ready{{idist.get_rank()}}'), 'w').close()\n"
        "  - $time.sleep(600)\n"
    )
    args = ["sleeper", "--config_file", json.dumps([str(TRAIN_CONFIG), str(config)]), "--meta_file", str(META)]
    proc = torchrun_job.start(args)
    pids: dict[int, int] = {}
    try:
        ready = _wait(lambda: all((tmp_path / f"ready{r}").exists() for r in range(2)) or proc.poll() is not None, 240)
        pids = torchrun_job.workers(proc)
        assert ready and sorted(pids) == [0, 1], torchrun_job.finish(proc, 5)[-3000:]
        os.kill(proc.pid, signal.SIGKILL)  # torchrun alone, as an out-of-memory kill or a scheduler does
        proc.wait(10)
        assert _wait(lambda: not any(_alive(p) for p in pids.values()), 10), {r: _alive(p) for r, p in pids.items()}
    finally:
        for pid in pids.values():
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            torchrun_job.kill_job(proc)
        proc.communicate()
