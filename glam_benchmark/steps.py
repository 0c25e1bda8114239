"""Running the bundle's own workflows: the ``python -m monai.bundle run_workflow ...`` command line of a step
(:func:`bundle_command`), a :class:`Step` and its proof of completion, and the :class:`Runner` that runs steps as
subprocesses, logs them, records their wall times and skips those already done (resumability)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from scripts.atomic import NO_ROOM_ERRNOS, disk_full
from scripts.errors import disk_full_message

from . import BUNDLE_ROOT, META_FILE, REPO_ROOT
from .files import write_json

#: how a write that found no room reads in a step's log ("[Errno 28] No space left on device: ..."); the log may
#: end mid-line, since it is written to the disk that filled up
_NO_ROOM = tuple(os.strerror(code).lower() for code in NO_ROOM_ERRNOS)


def _cli_value(value: Any) -> str:
    """A value as MONAI's command line (python-fire) parses it back."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list, tuple, float, int)):
        return repr(value)
    return str(value)


def bundle_command(run_id: str, configs: Sequence[Path], overrides: Mapping[str, Any]) -> list[str]:
    """``python -m monai.bundle run_workflow scripts.GLAMWorkflow --run_id <run_id> --config_file [...] --meta_file
    ... --<id> <value>...`` (the runner's environment puts the bundle on ``PYTHONPATH``)."""
    cmd = [sys.executable, "-m", "monai.bundle", "run_workflow", "scripts.GLAMWorkflow", "--run_id", run_id]
    cmd += ["--config_file", repr([str(c) for c in configs]), "--meta_file", str(META_FILE)]
    for key, value in overrides.items():
        cmd += [f"--{key}", _cli_value(value)]
    return cmd


@dataclass
class Step:
    """One unit of work: a bundle command whose ``done_file`` proves it finished (then it is skipped)."""

    name: str
    command: list[str]
    done_file: Path
    marker: bool = False  # the driver writes done_file itself (training); else the workflow writes it (metrics.json)


@dataclass
class Runner:
    """Runs steps as subprocesses of ``threads`` threads each, at most ``jobs`` at a time: any number of the
    driver's threads may call :meth:`run` at once and a step waits for a free slot, so that each model's chain of
    steps goes on as soon as its own previous step ends, not when every model's has. It logs each step to
    ``<work_dir>/logs/<name>.log``, records step wall times in ``<work_dir>/timings.json`` and remembers failures.
    A step that exits non-zero (killed, out of memory, a crash) is run again up to ``retries`` times in the same
    invocation: training steps resume from their ``last.pt`` and evaluations rewrite their files atomically, so an
    interrupted step costs its unfinished epoch, not the run. It also keeps the wall time of every invocation of the
    driver on this work folder in ``<work_dir>/invocations.json`` (updated after each step and every
    ``heartbeat_s`` seconds, so an invocation that is killed still counts), so a run resumed over several sessions
    knows its whole wall time (:meth:`run_wall_s`). A full disk stops the run instead: the step that found no room
    is not run again and no later step starts (:attr:`full_disk` says why), since every one would fail the same way
    and the finished steps are what a rerun after freeing space keeps."""

    work_dir: Path
    threads: int
    jobs: int = 1
    quiet: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    heartbeat_s: float = 60.0
    retries: int = 2
    full_disk: str | None = None

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._print_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max(1, int(self.jobs)))
        self._started = time.monotonic()
        path = self.work_dir / "timings.json"
        if path.is_file():
            self.timings = {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
        record = self.work_dir / "invocations.json"
        self._invocations: list[dict[str, Any]] = json.loads(record.read_text()) if record.is_file() else []
        self._invocations.append({"started": datetime.now().isoformat(timespec="seconds"), "wall_s": 0.0})
        self._stopped = threading.Event()
        threading.Thread(target=self._heartbeat, daemon=True).start()

    def _heartbeat(self) -> None:
        while not self._stopped.wait(self.heartbeat_s):
            try:
                self.record_invocation()
            except OSError as err:
                if disk_full(err) is None:
                    raise
                self._stop_for_full_disk(disk_full_message(err))

    def close(self) -> None:
        """Stop the heartbeat, so that a later Runner on the same work folder (in this process or another) owns
        invocations.json. The invocation's last record is the one :meth:`run_wall_s` wrote for the report (or the
        last heartbeat or step, when the run stopped on an error)."""
        self._stopped.set()

    def record_invocation(self) -> None:
        """Store this invocation's wall time so far."""
        with self._lock:
            self._invocations[-1]["wall_s"] = time.monotonic() - self._started
            write_json(self.work_dir / "invocations.json", self._invocations)

    def run_wall_s(self) -> float:
        """Wall time of every invocation on this work folder, this one up to now."""
        self.record_invocation()
        return float(sum(i["wall_s"] for i in self._invocations))

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[key] = str(self.threads)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BUNDLE_ROOT), env.get("PYTHONPATH", "")) if p)
        return env

    def _log(self, message: str) -> None:
        if not self.quiet:
            with self._print_lock:  # print writes the line and its newline apart: two threads would mix them
                try:
                    print(f"[benchmark {datetime.now():%H:%M:%S}] {message}", flush=True)
                except OSError as err:  # output redirected to the disk that filled up: the run stops on it anyway
                    if disk_full(err) is None:
                        raise

    def _stop_for_full_disk(self, reason: str) -> None:
        """Remember the first full-disk failure: :meth:`run` starts no step after it."""
        with self._lock:
            first = self.full_disk is None
            if first:
                self.full_disk = reason
        if first:
            self._log(f"stopping: {reason}")

    def run(self, step: Step) -> bool:
        """Run ``step`` unless its output exists, again after a failure up to ``retries`` times; False when its last
        attempt failed (the reason is in :attr:`failures`)."""
        if step.done_file.is_file():
            self._log(f"{step.name}: done already ({step.done_file})")
            return True
        with self._slots:
            if self.full_disk is not None:
                self.skip(step.name, f"the disk is full ({self.full_disk})")
                return False
            try:
                return self._run(step)
            except OSError as err:  # the runner's own log or records found no room
                if disk_full(err) is None:
                    raise
                self._stop_for_full_disk(disk_full_message(err))
                self.skip(step.name, f"the disk is full ({self.full_disk})")
                return False

    def _run(self, step: Step) -> bool:
        """:meth:`run`'s work, in one of the ``jobs`` slots."""
        log = self.work_dir / "logs" / f"{step.name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log(f"{step.name}: running (log {log})")
        start = time.monotonic()
        for attempt in range(self.retries + 1):
            # the log keeps every attempt: "w" for the first, then appended under a header
            with open(log, "w" if attempt == 0 else "a", encoding="utf-8") as f:
                if attempt:
                    f.write(f"\n\n[benchmark] attempt {attempt + 1} of {self.retries + 1} (the previous one failed)\n")
                f.write(shlex.join(step.command) + "\n\n")
                f.flush()
                done = subprocess.run(step.command, cwd=REPO_ROOT, env=self.env(), stdout=f, stderr=subprocess.STDOUT)
            if done.returncode == 0:
                break
            text = log.read_text(encoding="utf-8", errors="replace")
            tail = text.strip().splitlines()[-5:]
            reason = f"exit status {done.returncode}; log {log}; last lines: " + " | ".join(tail)
            no_room = next((what for what in _NO_ROOM if what in text[-4000:].lower()), None)
            if no_room is not None:  # another attempt would find no more room
                self._stop_for_full_disk(f"{step.name} stopped: {no_room} (free space on {self.work_dir}'s disk)")
                break
            if attempt < self.retries:
                self._log(f"{step.name}: failed ({reason}); running it again ({attempt + 2} of {self.retries + 1})")
        wall = time.monotonic() - start
        if done.returncode != 0:
            with self._lock:
                self.failures[step.name] = reason
            self._log(f"{step.name}: FAILED after {wall:.0f} s ({self.failures[step.name]})")
            return False
        if step.marker:
            write_json(step.done_file, {"step": step.name, "wall_s": wall, "command": shlex.join(step.command)})
        elif not step.done_file.is_file():
            with self._lock:
                self.failures[step.name] = f"finished without writing {step.done_file}; log {log}"
            return False
        with self._lock:
            self.timings[step.name] = wall
            write_json(self.work_dir / "timings.json", self.timings)
        self.record_invocation()
        self._log(f"{step.name}: finished in {wall:.0f} s" + (f" ({attempt + 1} attempts)" if attempt else ""))
        return True

    def skip(self, step_name: str, reason: str) -> None:
        with self._lock:
            self.failures.setdefault(step_name, f"not run: {reason}")
