"""A training run's folder: one run at a time (a lock naming its holder, a dead holder's lock taken over), the
temporaries a killed save left cleared at the start, and settings changed on resume used and stated (or refused)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from conftest import REPO_ROOT, TINY_CONFIG, TRAIN_CONFIG, tiny_overrides
from ignite.engine import Engine, Events

from scripts.errors import UsageError
from scripts.networks.settings import RecordsSettings
from scripts.training.checkpoints import StageCheckpointer
from scripts.training.preflight import preflight_training

META = TRAIN_CONFIG.parent / "metadata.json"


def _parser(tmp_path, **extra):
    from monai.bundle import ConfigWorkflow

    overrides = tiny_overrides(tmp_path, str(tmp_path / "datalist.json"), stage="global", **extra)
    wf = ConfigWorkflow(config_file=[str(TRAIN_CONFIG), str(TINY_CONFIG)], meta_file=str(META), **overrides)
    wf.initialize()
    return wf.parser


def test_a_second_training_into_a_locked_folder_is_refused_naming_the_first_then_a_dead_ones_lock_is_taken_over(
    tmp_path, caplog
):
    from scripts.training.preflight import RUN_LOCK

    models = tmp_path / "models"
    hold = (
        "import sys, time; sys.path.insert(0, 'bundle'); from scripts.atomic import FolderLock; "
        f"FolderLock({str(models)!r}, 'training', name={RUN_LOCK!r}).acquire(); print('held', flush=True); "
        "time.sleep(120)"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for resume in ("false", "true"):  # resumed or not
            with pytest.raises(UsageError) as caught:
                preflight_training(_parser(tmp_path, resume=resume))
            message = str(caught.value)
            assert message.startswith(f"--ckpt_root {models} is in use by another training (training pid {holder.pid}")
            assert ", started 20" in message and "\n" not in message
    finally:
        holder.kill()
        holder.wait()
    # the holder was killed mid-save: its temporary stays beside the checkpoints, with files that are not temporaries
    (models / "global").mkdir(parents=True)
    leftover = models / "global" / ".last.pt.k3x_9q0a.tmp"
    leftover.write_bytes(b"")
    kept = [models / "global" / ".last.pt.tmp", models / "global" / "notes.txt", models / ".model.pt"]
    for path in kept:
        path.write_bytes(b"x")
    with caplog.at_level("INFO"):
        lock = preflight_training(_parser(tmp_path))
    try:
        assert f"took over the lock of training pid {holder.pid} on host" in caplog.text
        assert f"{models / 'global'}: removed 1 temporary file(s) an interrupted write left" in caplog.text
        assert not leftover.exists() and all(path.exists() for path in kept)
    finally:
        lock.release()


# -- settings changed on resume ------------------------------------------------------------------------------------
def _stage(ckpt_dir, lr: float, epochs: int, weight_decay: float = 0.0):
    """A stage as train.yaml builds one: Adam on the stage's learning rate, a cosine schedule over its epochs down to
    a tenth, stepped after each epoch, then the checkpoints; the learning rate of each epoch recorded."""
    torch.manual_seed(0)
    network = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(network.parameters(), lr=lr, weight_decay=weight_decay)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs, eta_min=lr / 10)

    def step(engine, batch):
        optimizer.zero_grad()
        network(torch.ones(1, 3)).sum().backward()
        optimizer.step()

    trainer = Engine(step)
    lrs: dict[int, float] = {}
    trainer.add_event_handler(
        Events.EPOCH_STARTED, lambda e: lrs.__setitem__(e.state.epoch, optimizer.param_groups[0]["lr"])
    )
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda e: scheduler.step())
    save = {"network": network, "optimizer": optimizer, "lr_scheduler": scheduler}
    StageCheckpointer(ckpt_dir, save, resume=True).attach(trainer)
    return trainer, lrs, epochs


def _cosine(lr: float, epochs: int, epoch: int) -> float:
    """The closed-form cosine schedule's learning rate after ``epoch`` steps (eta_min a tenth of ``lr``)."""
    return lr / 10 + (lr - lr / 10) * (1 + math.cos(math.pi * epoch / epochs)) / 2


def test_a_learning_rate_epochs_and_weight_decay_changed_on_resume_are_used_and_stated(tmp_path, caplog):
    trainer, lrs, epochs = _stage(tmp_path, lr=1e-3, epochs=2)
    trainer.run(range(2), max_epochs=epochs)
    assert lrs == pytest.approx({1: 1e-3, 2: _cosine(1e-3, 2, 1)})

    trainer, lrs, epochs = _stage(tmp_path, lr=3e-3, epochs=4, weight_decay=0.01)
    with caplog.at_level("WARNING"):
        trainer.run(range(2), max_epochs=epochs)
    line = next(r.getMessage() for r in caplog.records if "settings changed on resume" in r.getMessage())
    for change in (
        "epochs 2 -> 4",
        "learning rate 0.001 -> 0.003",
        "optimizer weight_decay 0.0 -> 0.01",
        "lr_scheduler T_max 2 -> 4",
        "lr_scheduler eta_min 0.0001 -> 0.0003",
    ):
        assert change in line, line
    # epochs 3 and 4 at the new schedule's rates (the old one had ended at its floor, 1e-4)
    assert lrs == pytest.approx({3: _cosine(3e-3, 4, 2), 4: _cosine(3e-3, 4, 3)}, rel=1e-9)
    assert trainer.state.epoch == 4
    assert trainer.state.max_epochs == 4


def test_an_unchanged_resume_states_nothing_and_keeps_the_checkpoints_rate(tmp_path, caplog):
    trainer, _, epochs = _stage(tmp_path, lr=1e-3, epochs=3)
    trainer.add_event_handler(Events.EPOCH_COMPLETED(once=2), lambda e: e.terminate())  # stopped after epoch 2 of 3
    trainer.run(range(2), max_epochs=epochs)
    saved = torch.load(tmp_path / "last.pt", weights_only=True)["optimizer"]["param_groups"][0]["lr"]
    trainer, lrs, epochs = _stage(tmp_path, lr=1e-3, epochs=3)
    with caplog.at_level("WARNING"):
        trainer.run(range(2), max_epochs=epochs)
    assert "settings changed on resume" not in caplog.text
    assert lrs == {3: saved}  # the very value the checkpoint holds


def test_model_settings_on_resume_an_inference_choice_is_stated_one_that_shapes_weights_is_refused():
    from scripts.training.checkpoints import _inference_choices_changed

    saved, current = RecordsSettings(), RecordsSettings()
    saved.record_settings({"gamma_c": 0.5, "t_global": 0.1, "image_size": [64, 48]})
    current.record_settings({"gamma_c": 0.8, "t_global": 0.1, "image_size": [64, 48]})
    assert _inference_choices_changed(current, saved.state_dict()) == ["model gamma_c 0.5 -> 0.8"]
    other = RecordsSettings()
    other.record_settings({"gamma_c": 0.5, "t_global": 0.1, "image_size": [64, 64]})
    with pytest.raises(ValueError, match="image_size"):
        other.load_state_dict(saved.state_dict())
