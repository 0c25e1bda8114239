"""Checkpoints of a GLAM stage: the best model, the last epoch's state, resumption and the previous stage's model."""

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

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events
from ignite.handlers import Checkpoint, DiskSaver

from ..atomic import atomic_write
from ..errors import UsageError
from ..networks.glam_settings import as_flag
from ..networks.settings import INFERENCE_CHOICES, SETTINGS_KEY, decode_settings
from ..networks.weights import load_checkpoint_file, plain_state_dict, save_atomic, state_dict_problems, weights_of

logger = logging.getLogger(__name__)


def _number(value: Any) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def read_record(ckpt_dir: str | os.PathLike) -> dict[str, Any] | None:
    """A stage folder's ``selection.json``; None if absent or unreadable."""
    try:
        return json.loads((Path(ckpt_dir) / "selection.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def why_no_model(model: str | os.PathLike) -> str:
    """Why a stage's ``model.pt`` does not exist, in one line, from its folder's selection record."""
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
    """``previous_modules`` as ``{submodule: prefix of its weights in the file}``; None for the whole network.

    Args:
        previous_modules: submodule names (each under its own prefix), or a mapping to prefixes (``""``: the whole
            file is that submodule's).
    """
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
    """``obj`` with every nested tensor on the CPU; ``obj`` itself when they all are (a plain ``torch.save``)."""
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


#: a scheduler's position, restored from ``last.pt``; the rest of its state is the run's settings
_SCHEDULER_STATE = frozenset({"last_epoch", "_step_count", "_last_lr", "_get_lr_called_within_step", "_is_initial"})


def _hyperparameters(group: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in group.items() if k not in ("params", "lr")}


def _run_settings(save_dict: Mapping[str, Any]) -> dict[str, Any]:
    """The optimizer's and scheduler's settings as this run configured them, before ``last.pt`` replaces them."""
    settings: dict[str, Any] = {}
    optimizer, scheduler = save_dict.get("optimizer"), save_dict.get("lr_scheduler")
    if isinstance(optimizer, torch.optim.Optimizer):
        settings["optimizer"] = [copy.deepcopy(_hyperparameters(g)) for g in optimizer.param_groups]
    if scheduler is not None and hasattr(scheduler, "state_dict"):
        state = scheduler.state_dict()
        settings["lr_scheduler"] = copy.deepcopy({k: v for k, v in state.items() if k not in _SCHEDULER_STATE})
    return settings


def _use_run_settings(save_dict: Mapping[str, Any], configured: Mapping[str, Any]) -> list[str]:
    """Put back the run's optimizer and scheduler settings that ``last.pt`` replaced.

    Returns:
        ``"name old -> new"`` for each setting changed.
    """
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
    """``"model <name> old -> new"`` for each of :data:`INFERENCE_CHOICES` that differs from the checkpoint's."""
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
    """Ignite's ``DiskSaver`` writing CPU tensors atomically through :func:`~scripts.networks.weights.save_atomic`.

    Args:
        dirname: the stage's checkpoint folder.
    """

    def __init__(self, dirname: str | os.PathLike) -> None:
        super().__init__(dirname, atomic=True, create_dir=True, require_empty=False, save_on_rank=0)

    def __call__(self, checkpoint: Mapping, filename: str, metadata: Mapping | None = None) -> None:
        if idist.get_rank() == self.save_on_rank:
            save_atomic(_on_cpu(checkpoint), self.dirname / filename)

    def remove(self, filename: str) -> None:
        """Nothing: the next save of ``filename`` replaces it atomically."""


class _PlainWeights:
    """The network as ``Checkpoint`` saves it: its plain CPU state dict (the model zoo's ``model.pt``)."""

    def __init__(self, network: Any) -> None:
        self.network = network

    def state_dict(self) -> dict[str, torch.Tensor]:
        return plain_state_dict(self.network)


class StageCheckpointer:
    """Best-model and last-epoch checkpoints of one training stage, resumption, and loading the previous stage.

    Writes ``model.pt`` on each new best key metric, ``last.pt`` after every epoch and ``selection.json`` after every
    validation, atomically and on the CPU, unlike MONAI's ``CheckpointSaver``.

    Args:
        ckpt_dir: this stage's checkpoint folder.
        save_dict: name -> object with ``state_dict``/``load_state_dict``; must include ``network``.
        evaluator: the validation evaluator whose best key metric selects ``model.pt``.
        previous_model: the previous stage's ``model.pt``; required when given.
        previous_modules: the submodules to take from ``previous_model`` (:func:`module_sources`); None: all.
        resume: continue from ``last.pt`` when it exists (up to this run's ``max_epochs``).
        selection: ``{"metric", "reason"}`` of :func:`~scripts.training.selection.choose_selection`.
        validation_items: the validation split, or its size.

    Raises:
        ValueError: ``save_dict`` lacks the network; on start, an unreadable or mismatched file (naming it).
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
        self.best_path, self.last_path = self.ckpt_dir / "model.pt", self.ckpt_dir / "last.pt"
        self.record_path = self.ckpt_dir / "selection.json"
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

    def _checkpoint(self, name: str) -> Checkpoint:
        """The Ignite ``Checkpoint`` writing ``model.pt`` (the network) or ``last.pt`` (all of ``save_dict``)."""
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

    def _write_record(self) -> None:
        if idist.get_rank() != 0:
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
        """``module.load_state_dict(state, strict=True)``, its problems said in one line first."""
        problems = state_dict_problems(module, state)
        if problems:
            raise UsageError(", ".join(problems))
        module.load_state_dict(state, strict=True)

    def _load_modules(self, network: Any, state: Mapping[str, Any]) -> None:
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
        """Restore ``save_dict`` from ``last.pt``, keeping the run's own settings."""
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
        # the configured number of epochs wins, so that a finished stage can be extended
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
        """Write ``last.pt`` (rank 0)."""
        if idist.get_rank() == 0:
            self._checkpoint(self.last_path.name)(engine)

    def save_best(self, evaluator: Engine) -> None:
        """Write ``model.pt`` on a new best of the evaluator's key metric, then the selection record."""
        state = evaluator.state
        if idist.get_rank() == 0 and getattr(state, "best_metric_epoch", -1) == state.epoch:
            self._checkpoint(self.best_path.name)(evaluator)
            logger.info(
                "new best %s = %.4f at epoch %d: %s",
                state.key_metric_name,
                state.best_metric,
                state.epoch,
                self.best_path,
            )
        if self.record:
            epoch = int(self.trainer.state.epoch) if self.trainer is not None else int(state.epoch)
            self.record["history"][str(epoch)] = {k: _number(v) for k, v in state.metrics.items()}
            self.record["epochs_run"] = epoch
            best_epoch = int(getattr(state, "best_metric_epoch", -1))
            if best_epoch > 0:
                self.record["best_epoch"] = best_epoch
                self.record["best_value"] = _number(state.best_metric)
            self._write_record()
