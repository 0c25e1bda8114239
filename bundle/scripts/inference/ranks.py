"""Inference over many processes under ``torchrun``: each rank runs its share, rank 0 merges the tables at the end."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import ignite.distributed as idist
import torch.distributed as dist

from ..distributed import TORCHRUN_ENV, init_distributed
from ..errors import UsageError
from .files import OutputSelection
from .folder import RUN_RECORD, InferenceOutputFolder, InferencePlan, OutputFolderRefused, _differences
from .tables import ERROR_KEY, InferenceTables, csv_cell, error_record

logger = logging.getLogger(__name__)

#: the error type of an input that a failed rank did not reach (errors.csv)
NOT_RUN = "NotRun"
#: inputs named in the log line of a failed rank (errors.csv lists them all)
_NAMED = 10


def input_share(paths: Sequence[str], rank_: int, world_size_: int) -> list[str]:
    """The inputs rank ``rank_`` of ``world_size_`` runs: ``sorted(set(paths))[rank_::world_size_]``, done or not.

    Raises:
        ValueError: when the rank is not in ``[0, world_size_)``.
    """
    if not 0 <= int(rank_) < int(world_size_):
        raise UsageError(f"rank must be in [0, {world_size_}), got {rank_}")
    return sorted(set(paths))[int(rank_) :: int(world_size_)]


def _label_log_records(label: str) -> None:
    """Prefix every log message of this process with ``[label]``: the ranks' lines interleave on one terminal."""
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if isinstance(record.msg, str):
            record.msg = f"[{label}] {record.msg}"
        return record

    logging.setLogRecordFactory(factory)


class InferenceRanks:
    """This process's place in a ``torchrun`` job (``device``, ``rank``, ``world_size``, ``host``); joins the group.

    Args:
        backend: the process group's backend; None: NCCL on CUDA, gloo on the CPU.
        timeout_s: how long a rank waits for the others, the slowest share included.
        label_logs: prefix this process's log lines with ``[rank r/N]``.

    Raises:
        ValueError: when not run under torchrun.
    """

    def __init__(self, backend: str | None = None, timeout_s: float = 86400.0, label_logs: bool = True) -> None:
        missing = [k for k in TORCHRUN_ENV if k not in os.environ]
        if missing and not (dist.is_available() and dist.is_initialized()):
            raise UsageError(
                f"multi_gpu_inference.yaml must run under torchrun (missing environment variables {missing}): "
                "torchrun --nproc_per_node=N -m monai.bundle run inference --config_file "
                "\"['bundle/configs/inference.yaml','bundle/configs/multi_gpu_inference.yaml']\" ... "
                "(docs/inference.md, 'Many GPUs and machines')"
            )
        self.device = init_distributed(backend, float(timeout_s))
        self.rank, self.world_size = idist.get_rank(), idist.get_world_size()
        self.host = socket.gethostname()
        # the ranks' messages go through gloo (CPU objects), whatever the backend: NCCL would move them through the
        # GPU and stop a rank that waits longer than its watchdog allows
        gloo = dist.get_backend() == dist.Backend.GLOO
        self._group = None if gloo else dist.new_group(backend="gloo", timeout=timedelta(seconds=float(timeout_s)))
        if label_logs:
            _label_log_records(self.label)

    @property
    def label(self) -> str:
        return f"rank {self.rank}/{self.world_size}"

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self._group)
        return out

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s ``obj`` on every rank."""
        box = [obj]
        dist.broadcast_object_list(box, src=src, group=self._group)
        return box[0]

    def barrier(self) -> None:
        dist.barrier(group=self._group)

    def leave(self) -> None:
        """Leave the process group (once)."""
        if dist.is_available() and dist.is_initialized():
            if self._group is not None:
                dist.destroy_process_group(self._group)
                self._group = None
            dist.destroy_process_group()


class RankOutputFolder(InferenceOutputFolder):
    """The output folder as one rank opens it: rank 0 alone prepares it and changes its tables.

    Args:
        output_dir: the folder, shared by every rank.
        settings, outputs: as :class:`~.folder.InferenceOutputFolder`'s.
        ranks: the process group (:class:`InferenceRanks`).
    """

    def __init__(
        self,
        output_dir: str | os.PathLike,
        settings: Mapping[str, Any],
        outputs: OutputSelection,
        ranks: InferenceRanks,
    ) -> None:
        super().__init__(output_dir, settings, outputs)
        self.ranks = ranks
        self.main = InferenceTables(self.path)
        self.tables = InferenceTables(self.path, rank=ranks.rank)
        self.inputs: list[str] = []
        self._stale: list[str] = []

    def open(self, items: Sequence[Mapping[str, Any]]) -> InferencePlan:
        """Open the folder for this rank's share of ``items`` and return its plan.

        Raises:
            OutputFolderRefused: on every rank when any rank refuses.
        """
        if self.plan is not None:
            return self.plan
        problem = self._prepare() if self.ranks.rank == 0 else None
        problem = self.ranks.broadcast(problem)
        if problem is not None:
            self._stop(problem)
        plan, problem = None, None
        try:
            if self.ranks.rank != 0:
                self._check_same_folder()
                self._check_writable()
            predictions = self.main.predictions.read_rows()
            self.tables.open()
            plan = self._make_plan(items, predictions)
        except OutputFolderRefused as err:
            problem = str(err)
        except Exception as err:  # noqa: BLE001 - every rank must hear of it, or the others wait for this one
            problem = f"error: output_dir {self.path}: {self.ranks.label}: {type(err).__name__}: {err}"
        reports = self.ranks.all_gather((problem, self._stale))
        problems = [p for p, _ in reports if p is not None]
        if problems:
            self._stop(problems[0])
        if self.ranks.rank == 0:
            stale = {image for _, images in reports for image in images}
            if stale:
                rows = self.main.predictions.read_rows()
                self.main.predictions.replace_rows([row for row in rows if row["image"] not in stale])
                self.main.close()
        self.plan = plan
        done_before = self.ranks.all_gather((plan.total, plan.skipped)) if self.ranks.world_size > 1 else []
        if self.ranks.rank == 0 and done_before:
            total, skipped = sum(t for t, _ in done_before), sum(s for _, s in done_before)
            logger.info(
                "%s: %d inputs over %d processes (%s), %d done already (skipped), %d to run",
                self.path,
                total,
                self.ranks.world_size,
                " / ".join(str(t) for t, _ in done_before),
                skipped,
                total - skipped,
            )
        return plan

    def _prepare(self) -> str | None:
        """Rank 0: the folder prepared as one process does, the ranks' leftover rows taken up; the refusal or None."""
        try:
            self._lock()
            self._take_over()
            self.main.open()
            taken = self.main.absorb()
            self.main.close()
            if taken:
                logger.info(
                    "%s: took up the rows of an interrupted run's processes (ranks %s)",
                    self.path,
                    ", ".join(map(str, taken)),
                )
        except OutputFolderRefused as err:
            return str(err)
        except (OSError, ValueError) as err:
            return str(self._refused(f"its tables cannot be continued: {type(err).__name__}: {err}"))
        return None

    def _stop(self, problem: str) -> None:
        self.close()
        self.ranks.leave()
        raise OutputFolderRefused(problem)

    def _check_same_folder(self) -> None:
        """Refuse a folder whose run.json (rank 0's) this rank cannot see or whose settings differ from its own."""
        try:
            recorded = json.loads((self.path / RUN_RECORD).read_text(encoding="utf-8"))["settings"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise self._refused(
                f"{self.ranks.label} on {self.ranks.host} does not see the {RUN_RECORD} rank 0 wrote there "
                f"({type(err).__name__}): give every node the same output_dir on a file system they share"
            ) from err
        differences = _differences(recorded, self.settings)
        if differences:
            raise self._refused(
                f"{self.ranks.label} on {self.ranks.host} would run another model or settings than rank 0: "
                + "; ".join(differences)
                + " (is the checkpoint the same file on every node?)"
            )

    # what this rank plans: its share; the rows of its share's inputs (rank 0: and those of no input of this run)
    def _my_inputs(self, paths: list[str]) -> list[str]:
        self.inputs = list(paths)
        return input_share(paths, self.ranks.rank, self.ranks.world_size)

    def _rows_to_check(
        self, predictions: list[dict[str, str]], paths: list[str], mine: list[str]
    ) -> list[dict[str, str]]:
        cells = {csv_cell(p) for p in mine}
        listed = {csv_cell(p) for p in paths} if self.ranks.rank == 0 else set()
        return [r for r in predictions if r["image"] in cells or (self.ranks.rank == 0 and r["image"] not in listed)]

    def _drop_rows(self, predictions: list[dict[str, str]], stale: list[dict[str, str]]) -> None:
        self._stale = [row["image"] for row in stale]  # rank 0 drops them once every rank has planned

    def finish(self) -> None:
        """Close this rank's tables; rank 0 merges them (:meth:`merge`)."""
        self.tables.close()

    def merge(self, failed: Mapping[int, str]) -> dict[int, list[str]]:
        """Rank 0: merge the ranks' rows, a ``NotRun`` error per input a ``failed`` rank missed.

        Returns:
            rank -> the inputs it did not run.
        """
        self.main.open()
        taken = self.main.absorb()
        done = {row["image"] for row in self.main.predictions.read_rows()}
        not_run = {}
        for failed_rank, why in sorted(failed.items()):
            tried = {row["image"] for row in taken.get(failed_rank, ([], []))[1] if row[ERROR_KEY]}
            share = input_share(self.inputs, failed_rank, self.ranks.world_size)
            not_run[failed_rank] = [p for p in share if csv_cell(p) not in done and csv_cell(p) not in tried]
            for path in not_run[failed_rank]:
                self.main.add_error(
                    error_record(
                        path,
                        f"{NOT_RUN}: rank {failed_rank} failed before it ran this input ({why}); the same command "
                        "again runs it",
                    )
                )
        self.main.compact()
        self.main.close()
        return not_run

    def close(self) -> None:
        self.main.close()
        super().close()


class RanksFailed(SystemExit):
    """Ranks failed; the message names them and the inputs they did not run (status 1)."""


def _report(ranks: InferenceRanks, writer: Any, throughput: Any, error: str | None) -> dict[str, Any]:
    plan = writer.folder.plan
    timing = None
    if throughput is not None:
        try:
            timing = throughput.summary or throughput.summarise()
        except Exception:  # noqa: BLE001 - the figures of a broken run must not keep this rank from reporting
            logger.warning("%s: no timing figures", ranks.label, exc_info=True)
    return {
        "rank": ranks.rank,
        "host": ranks.host,
        "device": str(ranks.device),
        "inputs": plan.total if plan is not None else 0,
        "error": error,
        "timing": timing,
    }


def _failure_line(failed_rank: int, report: Mapping[str, Any], not_run: Sequence[str]) -> str:
    named = ", ".join(not_run[:_NAMED]) + (f" and {len(not_run) - _NAMED} more" if len(not_run) > _NAMED else "")
    return f"rank {failed_rank} (on {report['host']}, {report['device']}) failed: {report['error']}; " + (
        f"{len(not_run)} of its {report['inputs']} inputs not run ({named})" if not_run else "its inputs were run"
    )


def run_shares(ranks: InferenceRanks, evaluator: Any, writer: Any, throughput: Any = None, timing: Any = None) -> None:
    """Run this rank's share, then, once every rank is done, merge the tables and write timing.json on rank 0.

    Args:
        ranks: the process group.
        evaluator: this rank's evaluator.
        writer: its :class:`~.writer.GLAMInferenceWriter`, over a :class:`RankOutputFolder`.
        throughput: the handler whose figures each rank reports.
        timing: writes timing.json from every rank's report (``timing.write(reports, merge_s)``).

    Raises:
        RanksFailed: on rank 0 naming the failed ranks and their inputs not run, and on each failed rank.
    """
    folder: RankOutputFolder = writer.folder
    error = None
    try:
        evaluator.run()
        writer.finish()
    except Exception as exc:  # noqa: BLE001 - this rank's failure is reported; the other ranks go on
        error = f"{type(exc).__name__}: {exc}"
        logger.error("%s failed: %s; the other ranks finish their shares", ranks.label, error, exc_info=True)
        with contextlib.suppress(Exception):
            writer.finish()
    reports = ranks.all_gather(_report(ranks, writer, throughput, error))
    failed = {r["rank"]: r["error"] for r in reports if r["error"]}
    lines: list[str] = []
    if ranks.rank == 0:
        begin = time.perf_counter()
        try:
            not_run = folder.merge(failed)
            lines = [_failure_line(r, reports[r], not_run.get(r, [])) for r in sorted(failed)]
            if timing is not None:
                timing.write(reports, time.perf_counter() - begin)
        except Exception as exc:  # noqa: BLE001 - the other ranks wait at the barrier below: they must get there
            logger.error("merging the ranks' tables failed", exc_info=True)
            lines.append(
                f"merging the ranks' tables failed: {type(exc).__name__}: {exc} (the same command again merges them)"
            )
    folder.close()
    ranks.barrier()  # a rank that left with an error now would make torchrun stop rank 0 in the middle of the merge
    ranks.leave()
    if lines:
        raise RanksFailed(
            f"error: output_dir {folder.path}: "
            + "; ".join(lines)
            + (
                "; the other ranks finished their shares, predictions.csv and errors.csv account for every input "
                "(the inputs not run as NotRun); the same command again runs them"
                if failed
                else ""
            )
        )
    if error is not None:
        raise RanksFailed(f"error: {ranks.label}: {error} (rank 0 names the inputs not run)")
