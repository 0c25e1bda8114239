"""Checkpoints of a GLAM stage: the best model (by the key metric), the last epoch's full state, resumption and
the hand-over from the previous stage. The files are written by Ignite's ``Checkpoint`` through an atomic
``DiskSaver`` (temporary file + rename), by rank 0 only, and read back with ``torch.load(..., weights_only=True)``."""

from __future__ import annotations

import copy
import json
import logging
import math
import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence, Sized
from pathlib import Path
from typing import Any

import torch
from ignite.engine import Engine, Events
from ignite.handlers import Checkpoint, DiskSaver

from ..atomic import atomic_write
from ..distributed import rank
from ..errors import UsageError
from ..networks.settings import INFERENCE_CHOICES, SETTINGS_KEY, decode_settings
from ..networks.weights import (
    as_flag,
    load_checkpoint_file,
    plain_state_dict,
    save_atomic,
    state_dict_problems,
    weights_of,
)

__all__ = ["read_record", "why_no_model", "CheckpointFiles", "StageCheckpointer"]

logger = logging.getLogger(__name__)


def _number(value: Any) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def read_record(ckpt_dir: str | os.PathLike) -> dict[str, Any] | None:
    """A stage folder's ``selection.json`` (see :class:`StageCheckpointer`); None if absent or unreadable."""
    try:
        return json.loads((Path(ckpt_dir) / "selection.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def why_no_model(model: str | os.PathLike) -> str:
    """Why a stage's ``model.pt`` does not exist, from its folder's selection record: the stage was not run, its
    validation split was empty, or validation never produced a value of the key metric."""
    folder = Path(model).parent
    stage = folder.name
    record = read_record(folder)
    head = f"the previous stage's model {model} does not exist"
    if record is None and not (folder / "last.pt").is_file():
        return (
            f"{head}: the {stage} stage was not run into {folder} (run it first, or the default 'training', which runs "
            "all stages in order; or pass the same --ckpt_root as that run)"
        )
    if record is None:
        return f"{head}: the {stage} stage ran (its last.pt exists) but selected no model"
    metric, epochs = record.get("metric"), record.get("epochs_run", 0)
    if record.get("validation_items") == 0:
        return (
            f"{head}: the {stage} stage ran {epochs} epoch(s) but the validation split is empty, so no model was "
            "selected"
        )
    if not record.get("history"):
        return (
            f"{head}: the {stage} stage ran {epochs} epoch(s) without a validation "
            "(val_interval larger than the epochs, or the run stopped before it)"
        )
    values = [h.get(metric) for h in record["history"].values()]
    return (
        f"{head}: the {stage} stage ran {epochs} epoch(s) but validation never produced the key metric {metric} "
        f"(values {values}; {record.get('reason')}); choose another --selection_metric"
    )


def module_sources(previous_modules: Sequence[str] | Mapping[str, str] | None) -> dict[str, str] | None:
    """``previous_modules`` as {submodule of this network: the prefix of its weights in the previous model's file}:
    a list names submodules found under their own names (``["global_network"]``); a mapping gives the prefix
    (``{"global_network": ""}``: the whole file is this submodule's, e.g. a CAM under GMIC's global module, which is
    one). None or empty: the whole network from the whole file."""
    if not previous_modules:
        return None
    if isinstance(previous_modules, Mapping):
        pairs = list(previous_modules.items())
    elif isinstance(previous_modules, str):
        pairs = [(previous_modules, None)]
    else:
        pairs = [(m, m) for m in previous_modules]
    if not all(isinstance(k, str) and k and isinstance(v, str) for k, v in pairs):
        raise UsageError(
            "previous_modules must be a list of submodule names or a mapping {submodule: prefix in the file}, "
            f"got {previous_modules!r}"
        )
    return dict(pairs)


def _on_cpu(obj: Any) -> Any:
    """``obj`` (nested mappings, lists and tuples of state) with every tensor on the CPU; ``obj`` itself, untouched,
    when all its tensors are there already (the file is then the one a plain ``torch.save`` of it writes)."""
    if isinstance(obj, torch.Tensor):
        return obj if obj.device.type == "cpu" else obj.detach().cpu()
    if isinstance(obj, Mapping):
        moved = {k: _on_cpu(v) for k, v in obj.items()}
        if all(moved[k] is v for k, v in obj.items()):
            return obj
        return OrderedDict(moved) if isinstance(obj, OrderedDict) else moved
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        moved = [_on_cpu(v) for v in obj]
        return obj if all(m is v for m, v in zip(moved, obj)) else type(obj)(moved)
    return obj


#: what a learning-rate scheduler restores from ``last.pt`` besides its settings: its position and bookkeeping
_SCHEDULER_STATE = frozenset({"last_epoch", "_step_count", "_last_lr", "_get_lr_called_within_step", "_is_initial"})


def _hyperparameters(group: Mapping[str, Any]) -> dict[str, Any]:
    """An optimizer param group's settings: all but its parameters and its current (scheduled) learning rate."""
    return {k: v for k, v in group.items() if k not in ("params", "lr")}


def _run_settings(save_dict: Mapping[str, Any]) -> dict[str, Any]:
    """The optimizer's and the scheduler's settings as this run configured them, before ``last.pt`` replaces them."""
    settings: dict[str, Any] = {}
    optimizer, scheduler = save_dict.get("optimizer"), save_dict.get("lr_scheduler")
    if isinstance(optimizer, torch.optim.Optimizer):
        settings["optimizer"] = [copy.deepcopy(_hyperparameters(g)) for g in optimizer.param_groups]
    if scheduler is not None and hasattr(scheduler, "state_dict"):
        state = scheduler.state_dict()
        settings["lr_scheduler"] = copy.deepcopy({k: v for k, v in state.items() if k not in _SCHEDULER_STATE})
    return settings


def _use_run_settings(save_dict: Mapping[str, Any], configured: Mapping[str, Any]) -> list[str]:
    """Put back every optimizer and scheduler setting of this run that ``last.pt`` replaced by another value (the
    learning rate, the schedule's length...), and the learning rate the schedule gives at the restored epoch under
    them; returns ``"name old -> new"`` for each (the learning rate once)."""
    changes: list[str] = []
    optimizer, scheduler = save_dict.get("optimizer"), save_dict.get("lr_scheduler")
    for group, wanted in zip(getattr(optimizer, "param_groups", []), configured.get("optimizer", [])):
        for key, value in wanted.items():
            if group.get(key) != value:
                name = "learning rate" if key == "initial_lr" else f"optimizer {key}"
                changes.append(f"{name} {group.get(key)} -> {value}")
                group[key] = value
    wanted = configured.get("lr_scheduler", {})
    for key, value in wanted.items():
        if getattr(scheduler, key, value) != value:
            if key != "base_lrs":  # the learning rate, said above
                changes.append(f"lr_scheduler {key} {getattr(scheduler, key)} -> {value}")
            setattr(scheduler, key, value)
    changes = list(dict.fromkeys(changes))
    if changes and hasattr(scheduler, "_get_closed_form_lr"):
        lrs = scheduler._get_closed_form_lr()  # the schedule's value at the restored epoch, under the new settings
        for group, lr in zip(optimizer.param_groups, lrs):
            group["lr"] = lr
        scheduler._last_lr = list(lrs)
        changes.append(f"learning rate at epoch {scheduler.last_epoch} now {', '.join(f'{lr:.4g}' for lr in lrs)}")
    return changes


def _inference_choices_changed(network: Any, saved_state: Mapping[str, Any]) -> list[str]:
    """The model settings that may differ from the checkpoint's (:data:`INFERENCE_CHOICES`: they change no weight)
    and do, as ``"model <name> old -> new"``: training goes on with the new values. Every other model setting that
    differs is refused when the network loads."""
    module = getattr(network, "module", network)
    record, current = saved_state.get(SETTINGS_KEY), getattr(module, "settings", None)
    if not isinstance(record, torch.Tensor) or not isinstance(current, Mapping):
        return []
    saved = decode_settings(record)
    return [
        f"model {name} {saved[name]} -> {current[name]}"
        for name in INFERENCE_CHOICES
        if name in saved and name in current and saved[name] != current[name]
    ]


class CheckpointFiles(DiskSaver):
    """Ignite's ``DiskSaver`` with ``atomic=True`` for a stage's checkpoint files, which have fixed names
    (``model.pt``, ``last.pt``), written by rank 0:

    - the write goes through :func:`~scripts.networks.weights.save_atomic`, the bundle's atomic write
      (:mod:`scripts.atomic`: a temporary ``.<name>.<random>.tmp`` beside the file, synced, renamed over it, the
      folder synced; a full disk raises an ``OSError`` naming the file), which also refuses a NaN / Inf tensor
      (:mod:`scripts.networks.checkpoint_file`) and leaves the file as it was. ``DiskSaver``'s own atomic branch
      renames an unsynced anonymous ``tmpXXXX`` and lets a full disk surface as torch's ``RuntimeError``, which
      names no file;
    - every tensor is written on the CPU (:func:`_on_cpu`), so a CUDA run's files load anywhere;
    - ``remove`` does nothing: ``Checkpoint`` removes the file it is about to replace under the same name, which
      would leave a moment with no ``model.pt`` at all, whereas the atomic rename replaces it whole.
    """

    def __init__(self, dirname: str | os.PathLike) -> None:
        super().__init__(dirname, atomic=True, create_dir=True, require_empty=False, save_on_rank=0)

    def __call__(self, checkpoint: Mapping, filename: str, metadata: Mapping | None = None) -> None:
        if rank() == self.save_on_rank:
            save_atomic(_on_cpu(checkpoint), self.dirname / filename)

    def remove(self, filename: str) -> None:
        """Nothing: the next save of ``filename`` replaces it atomically."""


class _PlainWeights:
    """The network as ``Checkpoint`` saves it: :func:`~scripts.networks.weights.plain_state_dict` (unwrapped from
    (Distributed)DataParallel, on the CPU, a plain ``dict``: the model zoo's ``model.pt``)."""

    def __init__(self, network: Any) -> None:
        self.network = network

    def state_dict(self) -> dict[str, torch.Tensor]:
        return plain_state_dict(self.network)


class StageCheckpointer:
    """Best-model and last-epoch checkpoints of one training stage, resumption, and loading the previous stage.

    - on the evaluator's completion, when its key metric reached a new best: ``<ckpt_dir>/model.pt``, the
      network's plain CPU state dict;
    - after every training epoch (after validation): ``<ckpt_dir>/last.pt`` with every object in ``save_dict``
      (network, optimizer, scheduler, trainer state, best-metric record…);
    - when the trainer starts: with ``resume`` and an existing ``last.pt``, everything is restored from it and
      training continues after its epoch up to the run's own ``max_epochs`` (so a finished stage can be
      extended; the data and batch size must be unchanged); otherwise, with ``previous_model`` (the previous
      stage's ``model.pt``), the network is loaded from it, strictly, or only the submodules named in
      ``previous_modules`` (every weight of each, strictly; the others keep their fresh initialisation). An
      unreadable or mismatched file raises a ``ValueError`` naming it.

    Args:
        ckpt_dir: this stage's checkpoint folder.
        save_dict: name -> object with ``state_dict``/``load_state_dict``; must include ``network``; the trainer it
            is attached to is added as ``trainer`` (its epoch and iteration).
        evaluator: the validation evaluator whose best key metric selects ``model.pt``.
        previous_model: path of the previous stage's best model, required when given.
        previous_modules: names of the network's top-level submodules to take from ``previous_model`` (e.g.
            ``["global_network"]``: another model's global module under a freshly initialised local module, whose
            sparse map has to be learnt from the start, docs/results_findings.md, section 7), or a mapping
            {submodule: prefix of its weights in the file} (:func:`module_sources`); None: all of it.
        resume: continue from ``last.pt`` when it exists.
        selection: ``{"metric": ..., "reason": ...}`` of :func:`~scripts.training.selection.choose_selection`:
            recorded in ``<ckpt_dir>/selection.json``.
        validation_items: the validation split (its items, or their number): its size is recorded there too.

    ``<ckpt_dir>/selection.json`` (written atomically after every validation and when the run ends) records the
    selection metric and why it was chosen, every validation's metrics by epoch, the best epoch and value, the
    epochs run and whether the run finished: the next stage names the reason when no model was selected, and a
    rerun into the folder refuses to overwrite an unfinished run (:mod:`scripts.training.preflight`).

    The files are Ignite's: two ``ignite.handlers.Checkpoint`` objects on one :class:`CheckpointFiles` (a
    ``DiskSaver``, atomic) write them, and ``Checkpoint.load_objects`` restores ``last.pt``. MONAI's
    ``CheckpointSaver`` is the same Ignite machinery with four gaps, each closed here:

    - it passes ``atomic=False`` to ``DiskSaver`` (a run killed while saving leaves a torn file): the save handler
      here is atomic, through :mod:`scripts.atomic`;
    - it saves the tensors on the device they live on (a CUDA run's ``model.pt`` would not load on a CPU without
      ``map_location``): the handler writes CPU tensors, and ``model.pt`` is the network's plain state dict;
    - one saver saves one ``save_dict``: here one ``Checkpoint`` saves ``{"network"}`` (a single object, which
      Ignite writes as its state dict itself: ``model.pt``) and another the whole ``save_dict`` (``last.pt``);
    - its key-metric saver keeps the best value in its own state, lost on resume unless that is saved too
      (``key_metric_save_state``), so the first validation after a resume would overwrite a better ``model.pt``:
      here the evaluator's own comparison decides (``state.best_metric_epoch``, the evaluator's key metric and
      comparison), its best value travels in ``last.pt`` through
      :class:`~scripts.handlers.training_state.BestMetricState`, and the best-model ``Checkpoint`` is called only on
      a new best, so its own list of saved files (empty after a restart) never decides.

    On top stay GLAM's parts: the previous stage's hand-over (``previous_model`` / ``previous_modules``, with the
    reason from its ``selection.json`` when the model is missing), the ``epoch_length`` check that refuses an inexact
    resume, one-line errors naming the file, the selection record, and (scripts.training.preflight) the refusal to
    overwrite an unfinished run. ``last.pt`` keeps the layout it always had (``{name: state dict}`` over
    ``save_dict`` and ``trainer``, the network as a plain CPU state dict), so files from earlier versions resume.
    """

    def __init__(
        self,
        ckpt_dir: str | os.PathLike,
        save_dict: Mapping[str, Any],
        evaluator: Engine | None = None,
        previous_model: str | os.PathLike | None = None,
        previous_modules: Sequence[str] | Mapping[str, str] | None = None,
        resume: bool = False,
        selection: Mapping[str, Any] | None = None,
        validation_items: int | Sized | None = None,
    ) -> None:
        if "network" not in save_dict:
            raise UsageError("save_dict must hold the 'network'")
        self.ckpt_dir = Path(ckpt_dir)
        self.save_dict = dict(save_dict)
        self.evaluator = evaluator
        self.previous_model = Path(previous_model) if previous_model else None
        self.previous_modules = module_sources(previous_modules)
        self.resume = as_flag(resume, "resume")
        self.selection = dict(selection or {})
        self.validation_items = len(validation_items) if isinstance(validation_items, Sized) else validation_items
        self.record: dict[str, Any] = {}
        self.trainer: Engine | None = None
        self._files: dict[str, Checkpoint] = {}

    @property
    def best_path(self) -> Path:
        return self.ckpt_dir / "model.pt"

    @property
    def last_path(self) -> Path:
        return self.ckpt_dir / "last.pt"

    @property
    def record_path(self) -> Path:
        return self.ckpt_dir / "selection.json"

    def _checkpoint(self, name: str) -> Checkpoint:
        """The Ignite ``Checkpoint`` that writes ``model.pt`` (the network) or ``last.pt`` (all of ``save_dict``),
        made on first use (its ``DiskSaver`` creates the folder). ``n_saved=None``: every call writes, and the file
        name is fixed, so each write replaces the last (the best model's calls are decided by :meth:`save_best`)."""
        if name not in self._files:
            weights = _PlainWeights(self.save_dict["network"])
            to_save = {"network": weights} if name == self.best_path.name else {**self.save_dict, "network": weights}
            saver = CheckpointFiles(self.ckpt_dir)
            self._files[name] = Checkpoint(to_save, saver, filename_pattern=name, n_saved=None)
        return self._files[name]

    def attach(self, trainer: Engine) -> None:
        self.trainer = trainer
        self.save_dict.setdefault("trainer", trainer)
        self._files.clear()  # built from the complete save_dict on first use
        trainer.add_event_handler(Events.STARTED, self.load)
        trainer.add_event_handler(Events.STARTED, self._start_record)
        trainer.add_event_handler(Events.EPOCH_COMPLETED, self.save_last)
        trainer.add_event_handler(Events.COMPLETED, self._finish_record)
        if self.evaluator is not None:
            self.evaluator.add_event_handler(Events.COMPLETED, self.save_best)

    # -- the selection record ----------------------------------------------------------------------------------
    def _write_record(self) -> None:
        if rank() != 0:
            return
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        with atomic_write(self.record_path, "w") as f:
            json.dump(self.record, f, indent=1, allow_nan=True)

    def _start_record(self, engine: Engine) -> None:
        previous = read_record(self.ckpt_dir) if self.resume else None
        self.record = {
            "stage": self.ckpt_dir.name,
            "metric": self.selection.get("metric"),
            "reason": self.selection.get("reason"),
            "validation_items": self.validation_items,
            "max_epochs": engine.state.max_epochs,
            "epochs_run": int(engine.state.epoch),
            "best_epoch": -1,
            "best_value": None,
            "history": {},
            "finished": False,
        }
        if previous and previous.get("metric") == self.record["metric"]:
            for key in ("history", "best_epoch", "best_value"):
                self.record[key] = previous.get(key, self.record[key])
        self._write_record()

    def _finish_record(self, engine: Engine) -> None:
        self.record["epochs_run"] = int(engine.state.epoch)
        self.record["finished"] = True
        self._write_record()

    def load(self, engine: Engine) -> None:
        if self.resume and self.last_path.is_file():
            self._resume(engine)
            return
        if self.resume:
            logger.warning("resume requested but %s does not exist: starting this stage afresh", self.last_path)
        if self.previous_model is not None:
            if not self.previous_model.is_file():
                raise FileNotFoundError(why_no_model(self.previous_model))
            # refused in one line naming the file: unreadable, not a state dict, a NaN or Inf tensor
            state = weights_of(
                load_checkpoint_file(self.previous_model, "the previous stage's model"), self.previous_model
            )
            network = self.save_dict["network"]
            network = getattr(network, "module", network)
            try:
                if self.previous_modules is None:
                    self._load_strictly(network, state)
                else:
                    self._load_modules(network, state)
            except (RuntimeError, ValueError, TypeError, AttributeError) as err:
                raise UsageError(
                    f"previous stage's model {self.previous_model} does not fit this network: {err}"
                ) from err
            what = "" if self.previous_modules is None else f" ({', '.join(self.previous_modules)} only)"
            logger.info("loaded the previous stage's model %s%s", self.previous_model, what)

    @staticmethod
    def _load_strictly(module: Any, state: Mapping[str, Any]) -> None:
        """``module.load_state_dict(state, strict=True)``, its problems (settings, keys, shapes) said in one line
        first."""
        problems = state_dict_problems(module, state)
        if problems:
            raise UsageError(", ".join(problems))
        module.load_state_dict(state, strict=True)

    def _load_modules(self, network: Any, state: Mapping[str, Any]) -> None:
        """Load each of ``previous_modules`` from its part of ``state``, strictly; the rest of ``network`` is left
        as it is."""
        children = dict(network.named_children())
        for name, source in self.previous_modules.items():
            if name not in children:
                raise UsageError(f"previous_modules names {name!r}, not a submodule (have {sorted(children)})")
            prefix = f"{source}." if source else ""
            part = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
            if not part:
                raise UsageError(f"the file holds no weights of {source!r}")
            try:
                self._load_strictly(children[name], part)
            except ValueError as err:
                raise UsageError(f"{name}: {err}") from err

    def _resume(self, engine: Engine) -> None:
        """Restore every object of ``save_dict`` from ``last.pt``. The run keeps its own settings where they may
        change on resume, with one line naming each that changed: the number of epochs, the optimizer's settings
        (the learning rate...), the schedule's (its length...: the learning rate is then the schedule's at the
        restored epoch under the new settings), the model's inference choices (``INFERENCE_CHOICES``); a model
        setting that shapes the weights, or another number of iterations per epoch, is refused."""
        checkpoint = load_checkpoint_file(self.last_path, "checkpoint")
        if not isinstance(checkpoint, Mapping):
            raise UsageError(
                f"{self.last_path} is not a checkpoint of this workflow (got {type(checkpoint).__name__}): start this "
                "stage afresh without --resume, or pass the --ckpt_root of the run to continue"
            )
        missing = sorted(set(self.save_dict) - set(checkpoint))
        if missing:
            raise UsageError(
                f"{self.last_path} lacks {missing}: it was not written by this workflow with these settings (start "
                "this stage afresh without --resume, or pass the --ckpt_root of the run to continue)"
            )
        # the configured number of epochs wins over the checkpoint's, so that a finished stage can be extended
        max_epochs, epoch_length = engine.state.max_epochs, engine.state.epoch_length
        saved_length = checkpoint["trainer"].get("epoch_length") if "trainer" in self.save_dict else None
        if epoch_length is not None and saved_length is not None and saved_length != epoch_length:
            raise UsageError(
                f"{self.last_path} was written with {saved_length} iterations per epoch, this run has "
                f"{epoch_length}: the training data, batch size or number of processes changed, so the run "
                "cannot be continued exactly (start afresh without --resume)"
            )
        configured = _run_settings(self.save_dict)
        for name, obj in self.save_dict.items():
            try:
                Checkpoint.load_objects(to_load={name: obj}, checkpoint={name: checkpoint[name]}, strict=True)
            except (RuntimeError, ValueError, KeyError, TypeError) as err:
                raise UsageError(f"{self.last_path}: cannot restore {name!r}: {err}") from err
        if max_epochs is not None and engine.state.epoch > max_epochs:
            raise UsageError(
                f"{self.last_path} is at epoch {engine.state.epoch}, beyond this run's {max_epochs} epochs: "
                "raise the number of epochs to continue training from it"
            )
        if max_epochs is not None:
            engine.state.max_epochs = max_epochs
        saved_epochs = checkpoint["trainer"].get("max_epochs") if "trainer" in self.save_dict else None
        changes = [f"epochs {saved_epochs} -> {max_epochs}"] if saved_epochs not in (None, max_epochs) else []
        changes += _inference_choices_changed(self.save_dict["network"], checkpoint["network"])
        changes += _use_run_settings(self.save_dict, configured)
        if changes:
            logger.warning(
                "%s: settings changed on resume, the new values are used: %s", self.last_path, "; ".join(changes)
            )
        logger.info("resumed from %s (epoch %d of %s)", self.last_path, engine.state.epoch, engine.state.max_epochs)

    def save_last(self, engine: Engine) -> None:
        """``last.pt``: every object of ``save_dict`` (rank 0; the others would only gather state dicts)."""
        if rank() == 0:
            self._checkpoint(self.last_path.name)(engine)

    def save_best(self, evaluator: Engine) -> None:
        """``model.pt`` when the evaluator's key metric reached a new best at this validation (MONAI's comparison,
        its best value restored on resume by ``BestMetricState``), then the selection record."""
        state = evaluator.state
        if rank() == 0 and getattr(state, "best_metric_epoch", -1) == state.epoch:
            self._checkpoint(self.best_path.name)(evaluator)
            logger.info(
                "new best %s = %.4f at epoch %d: %s",
                state.key_metric_name,
                state.best_metric,
                state.epoch,
                self.best_path,
            )
        if self.record:
            # the evaluator's epoch is the trainer's (ValidationHandler runs it with the trainer's epoch)
            epoch = int(self.trainer.state.epoch) if self.trainer is not None else int(state.epoch)
            self.record["history"][str(epoch)] = {k: _number(v) for k, v in state.metrics.items()}
            self.record["epochs_run"] = epoch
            best_epoch = int(getattr(state, "best_metric_epoch", -1))
            if best_epoch > 0:
                self.record["best_epoch"] = best_epoch
                self.record["best_value"] = _number(state.best_metric)
            self._write_record()
