"""The documented training command line, run as a subprocess: overrides checked before any work (an unknown key
named with its closest match, one number for every stage), errors as one line, folders checked before the first
epoch, an unfinished run never silently overwritten, labels-only selection, and ``--tracking mlflow`` from the
repository root (where the repository's own ``tools/`` folder used to shadow the bundle's package)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import BUNDLE_ROOT, REPO_ROOT, TINY_CONFIG, TRAIN_CONFIG, workflow_command

from scripts.errors import UsageError
from scripts.training.checkpoints import why_no_model
from scripts.training.preflight import per_stage
from scripts.training.selection import NegativeBCE, choose_selection

META = str(TRAIN_CONFIG.parent / "metadata.json")


def train_command(datalist: str, root: Path, *extra: str) -> list[str]:
    """The training command as docs/training.md writes it, with absolute paths."""
    return [
        *workflow_command("training"),
        "--config_file",
        f"['{TRAIN_CONFIG}','{TINY_CONFIG}']",
        "--meta_file",
        META,
        "--datalist",
        datalist,
        "--ckpt_root",
        str(root / "models"),
        "--output_root",
        str(root / "eval"),
        *extra,
    ]


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(BUNDLE_ROOT)}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error: ")]


# -- refused before any work ---------------------------------------------------------------------------------------
def test_an_unknown_key_is_refused_with_its_closest_match(tmp_path, tiny_datalist):
    result = run(train_command(tiny_datalist, tmp_path, "--epoch", "1"), cwd=tmp_path)
    assert result.returncode == 1
    assert error_lines(result) == [
        "error: unknown option --epoch: the configuration has no 'epoch'; did you mean --epochs?"
    ]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "models").exists()  # refused before anything was made


@pytest.mark.parametrize("how", ["under_a_file", "read_only"])
def test_an_unwritable_ckpt_root_is_refused_before_the_first_epoch(tmp_path, tiny_datalist, how):
    if how == "read_only":
        if os.geteuid() == 0:
            pytest.skip("root writes into read-only folders")
        (tmp_path / "models").mkdir()
        (tmp_path / "models").chmod(0o500)
        folder = tmp_path / "models"
    else:
        (tmp_path / "afile").write_text("x")
        folder = tmp_path / "afile" / "models"
    command = train_command(tiny_datalist, tmp_path, "--epochs", "1")
    command[command.index("--ckpt_root") + 1] = str(folder)
    result = run(command, cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    (line,) = error_lines(result)
    assert line.startswith(f"error: ckpt_root {folder} cannot be written")
    assert "Epoch" not in result.stderr + result.stdout  # no epoch started
    assert not (tmp_path / "eval").exists() or not any((tmp_path / "eval").rglob("events.out*"))


@pytest.mark.parametrize("value", ["1e400", "{'global':1e-3,'local':-1e400,'joint':1e400}"])
def test_a_learning_rate_that_overflows_is_refused_naming_the_flag(tmp_path, tiny_datalist, value):
    """``--learning_rate 1e400`` parses to inf (the first step would make every weight NaN): one line naming the
    flag, before anything is made."""
    result = run(train_command(tiny_datalist, tmp_path, "--learning_rate", value), cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = error_lines(result)
    if value.startswith("{"):  # the negative one is refused as not positive, before the finite check
        assert line.startswith("error: learning_rate must be positive numbers, got {'global': 0.001, 'local': -inf")
    else:
        assert line == (
            "error: --learning_rate must be a finite number, got inf (a value beyond 1.8e+308 overflows to inf)"
        )
    assert not (tmp_path / "models").exists()


def test_epochs_that_overflow_are_refused_naming_the_flag(tmp_path, tiny_datalist):
    result = run(train_command(tiny_datalist, tmp_path, "--epochs", "1e400"), cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert error_lines(result) == [
        "error: --epochs must be a finite number, got inf (a value beyond 1.8e+308 overflows to inf)"
    ]


#: runs ``python -m monai.bundle ...`` as if MLflow were not installed (an import of it fails)
WITHOUT_MLFLOW = (
    "import runpy, sys; sys.modules['mlflow'] = None; sys.argv[0] = 'monai/bundle/__main__.py'; "
    "runpy.run_module('monai.bundle', run_name='__main__', alter_sys=True)"
)


@pytest.mark.parametrize("workflow", ["training", "evaluating"])
def test_tracking_without_mlflow_is_one_line_naming_the_install(tmp_path, tiny_datalist, workflow):
    command = train_command(tiny_datalist, tmp_path, "--epochs", "1", "--stage", "global", "--tracking", "mlflow")
    command[1:3] = ["-c", WITHOUT_MLFLOW]  # python -c ... run training ...
    if workflow == "evaluating":
        command[command.index("--run_id") + 1] = "evaluating"
        files = command.index("--config_file") + 1
        command[files] = f"['{TRAIN_CONFIG}','{TINY_CONFIG}','{TRAIN_CONFIG.parent / 'evaluate.yaml'}']"
    result = run(command, cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) <= 4, result.stderr[-3000:]
    # MLflow hidden; SQLAlchemy and Alembic named too where this Python lacks them (requirements-dev.txt has them)
    missing = ["mlflow-skinny"] + [m for m in ("sqlalchemy", "alembic") if importlib.util.find_spec(m) is None]
    assert error_lines(result) == [
        f"error: --tracking mlflow needs {', '.join(missing)}, not installed in this Python: pip install "
        f"{' '.join(missing)} (the versions requirements-dev.txt pins: pip install -r requirements-dev.txt), or leave "
        "--tracking out"
    ]
    assert not (tmp_path / "models").exists() and not (tmp_path / "eval").exists()


#: a ``sitecustomize`` for the training process: the disk fills while the N-th ``last.pt`` is being written
#: (GLAM_TEST_FULL_AT=N): every write to its temporary file fails with ENOSPC, as a full disk's would
FULL_DISK_SITE = """
import errno
import os

_real_fdopen = os.fdopen
_seen = [0]


class _FullFile:
    def __init__(self, f):
        self._f = f

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()
        return False


def _fdopen(fd, *args, **kwargs):
    f = _real_fdopen(fd, *args, **kwargs)
    try:
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return f
    if name.startswith(".last.pt.") and name.endswith(".tmp"):
        _seen[0] += 1
        if _seen[0] >= int(os.environ["GLAM_TEST_FULL_AT"]):
            return _FullFile(f)
    return f


os.fdopen = _fdopen
"""


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="the test double finds file names in /proc")
def test_a_full_disk_while_saving_a_checkpoint_is_one_line_naming_the_last_good_one(tmp_path, tiny_datalist):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(FULL_DISK_SITE)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(site), str(BUNDLE_ROOT)])}
    env["GLAM_TEST_FULL_AT"] = "2"
    command = train_command(tiny_datalist, tmp_path, "--stage", "global", "--epochs", "2")
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr[-3000:]
    # nowhere a traceback: the bundle's StatsHandler leaves a user's error to GLAMWorkflow
    assert "Traceback" not in result.stderr + result.stdout, result.stdout[-3000:]
    folder = tmp_path / "models" / "global"
    assert error_lines(result) == [
        f"error: no space left on device writing {folder / 'last.pt'}; the last good checkpoint is "
        f"{folder / 'last.pt'} (free space on that disk, then continue with --resume true)"
    ]
    # the epoch-1 checkpoint is whole (the atomic write left it), and no temporary file is left behind
    state = torch.load(folder / "last.pt", weights_only=True)
    assert state["trainer"]["iteration"] == state["trainer"]["epoch_length"]  # epoch 1
    assert sorted(p.name for p in folder.iterdir()) == ["last.pt", "model.pt", "selection.json"]


def test_the_disk_full_message_for_other_files(tmp_path):
    import errno

    from scripts.errors import disk_full_message

    def full(path) -> OSError:
        return OSError(errno.ENOSPC, "No space left on device", None if path is None else str(path))

    assert disk_full_message(full(None)) == "no space left on device (free space on the output disk, then run again)"
    report = tmp_path / "metrics.json"
    assert disk_full_message(full(report)) == (
        f"no space left on device writing {report}; nothing was written to it (free space on that disk, then run again)"
    )
    report.write_text("{}")
    assert "; its previous version is unchanged (" in disk_full_message(full(report))
    assert disk_full_message(full(tmp_path / "model.pt")) == (
        f"no space left on device writing {tmp_path / 'model.pt'}; no checkpoint was written in {tmp_path} yet "
        "(free space on that disk, then continue with --resume true)"
    )
    (tmp_path / "model.pt").write_bytes(b"x")
    assert f"; the last good checkpoint is {tmp_path / 'model.pt'} (" in disk_full_message(full(tmp_path / "model.pt"))


# -- one training run, from the repository root, tracked -----------------------------------------------------------
@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory, tiny_datalist):
    """``--epochs 1 --stage global --tracking mlflow`` from the repository root (the documented folder); its tests
    skip where requirements-dev.txt's tracking packages are not installed."""
    for module in ("mlflow", "sqlalchemy", "alembic"):
        pytest.importorskip(module)
    root = tmp_path_factory.mktemp("tracked")
    command = train_command(tiny_datalist, root, "--epochs", "1", "--stage", "global", "--tracking", "mlflow")
    return root, run(command, cwd=REPO_ROOT)


def test_one_number_of_epochs_means_every_stage(tracked_run):
    root, result = tracked_run
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((root / "models" / "global" / "selection.json").read_text())
    assert record["max_epochs"] == 1 and record["epochs_run"] == 1 and record["finished"] is True
    assert (root / "models" / "global" / "model.pt").is_file()


def test_tracking_from_the_documented_command_records_the_run(tracked_run, tiny_datalist):
    mlflow = pytest.importorskip("mlflow")
    root, result = tracked_run
    assert result.returncode == 0, result.stderr[-3000:]
    client = mlflow.MlflowClient("sqlite:///" + str(root / "eval" / "mlruns.db"))
    (run_,) = client.search_runs([client.get_experiment_by_name("monai_experiment").experiment_id])
    params = run_.data.params
    tiny = TINY_CONFIG.read_text()
    assert run_.info.run_name == "train_global"
    assert params["learning_rate"] == "0.001" and "learning_rate: {global: 1.0e-3" in tiny
    assert params["epochs"] == "1" and params["batch_size"] == "2"
    assert json.loads(params["image_size"]) == [256, 160] and params["patch_size"] == "64"
    assert params["t_global"] == "0.03" and params["t_local"] == "0.2"
    assert params["lambda_sparsity"] == "0.0001" and params["seed"] == "0"
    datalist = json.loads(Path(tiny_datalist).read_text())
    assert params["datalist"] == os.path.abspath(tiny_datalist)
    assert params["train_items"] == str(len(datalist["training"]))
    assert params["validation_items"] == str(len(datalist["validation"]))
    assert params["selection"] == "val_soft_dice"
    assert [a.path for a in client.list_artifacts(run_.info.run_id)] == ["config.json"]
    config = json.loads((root / "eval" / "global" / "config.json").read_text())
    assert config["stage"] == "global" and config["epochs"] == 1 and config["datalist"] == tiny_datalist
    history = client.get_metric_history(run_.info.run_id, "val_soft_dice")
    assert [m.step for m in history] == [1]


def test_a_rerun_over_an_unfinished_run_is_refused(tracked_run, tmp_path, tiny_datalist):
    root, result = tracked_run
    assert result.returncode == 0
    # the folder of a run killed after its first epoch: last.pt, and a record that says it did not finish
    work = tmp_path / "run"
    (work / "models" / "global").mkdir(parents=True)
    for name in ("last.pt", "model.pt"):
        (work / "models" / "global" / name).write_bytes((root / "models" / "global" / name).read_bytes())
    record = json.loads((root / "models" / "global" / "selection.json").read_text())
    record.update(finished=False, max_epochs=3)
    (work / "models" / "global" / "selection.json").write_text(json.dumps(record))
    before = (work / "models" / "global" / "last.pt").read_bytes()
    result = run(train_command(tiny_datalist, work, "--epochs", "3", "--stage", "global"), cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    (line,) = error_lines(result)
    folder = work / "models" / "global"
    assert line == (
        f"error: {folder} holds the checkpoints of an unfinished global run (epoch 1): continue it with "
        "--resume true, or start afresh with --overwrite true (or another --ckpt_root)"
    )
    assert (folder / "last.pt").read_bytes() == before  # untouched


# -- labels only -----------------------------------------------------------------------------------------------------
EPOCH_LINE = re.compile(r"Epoch\[(\d+)\] Metrics -- (.*val_auc_mean.*)")


def test_labels_only_training_selects_by_the_validation_auc(tmp_path, tiny_datalist):
    """Validation without masks (both classes present): model.pt is the epoch of the best mean AUC the run logged.
    Run from a folder other than the repository's, with absolute paths."""
    content = json.loads(Path(tiny_datalist).read_text())
    base = Path(tiny_datalist).parent

    def absolute(item: dict, masks: bool) -> dict:
        out = {k: v for k, v in item.items() if masks or k not in ("mask_benign", "mask_malignant")}
        for key in ("image", "mask_benign", "mask_malignant"):
            if out.get(key):
                out[key] = str(base / out[key])
        return out

    validation = [absolute(i, masks=False) for i in content["validation"] + content["test"]]
    labels = np.array([i["label"] for i in validation])
    assert 0 < labels[:, 0].sum() < len(labels) and 0 < labels[:, 1].sum() < len(labels)  # an AUC per class
    datalist = tmp_path / "labels_only.json"
    training = [absolute(i, masks=False) for i in content["training"]]
    datalist.write_text(json.dumps({"training": training, "validation": validation, "test": []}))
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    result = run(train_command(str(datalist), tmp_path, "--stage", "global", "--epochs", "3"), cwd=folder)
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stderr + result.stdout
    assert "global stage: best-model selection: the validation split (8 images) has no lesion masks" in log
    assert (
        "selecting by val_auc_mean (the mean of val_auc_benign and val_auc_malignant, the ROC AUCs of y_global)" in log
    )
    logged = {}
    for match in EPOCH_LINE.finditer(log):
        values = dict(re.findall(r"(\w+): (\S+)", match.group(2)))
        logged[int(match.group(1))] = float(values["val_auc_mean"])
        # the mean printed is the mean of the two printed beside it (4 decimals each)
        pair = (float(values["val_auc_benign"]), float(values["val_auc_malignant"]))
        assert abs(sum(pair) / 2 - float(values["val_auc_mean"])) <= 1e-4
    assert sorted(logged) == [1, 2, 3]
    record = json.loads((tmp_path / "models" / "global" / "selection.json").read_text())
    assert record["metric"] == "val_auc_mean" and "no lesion masks" in record["reason"]
    for epoch, value in logged.items():  # the record holds what the log printed (4 decimals there)
        assert abs(record["history"][str(epoch)]["val_auc_mean"] - value) < 6e-5
    values = [record["history"][str(e)]["val_auc_mean"] for e in (1, 2, 3)]
    best = 1 + int(np.argmax(values))  # MONAI keeps the first of equal values
    assert record["best_epoch"] == best and math.isclose(record["best_value"], max(values))
    model = torch.load(tmp_path / "models" / "global" / "model.pt", weights_only=True)
    last = torch.load(tmp_path / "models" / "global" / "last.pt", weights_only=True)["network"]
    same = all(torch.equal(model[k], last[k]) for k in last)
    assert same == (best == 3)  # model.pt is the last epoch's weights exactly when the last epoch was best
    assert f"new best val_auc_mean = {max(values):.4f} at epoch {best}" in log


# -- units ---------------------------------------------------------------------------------------------------------
def test_selection_metric_choice():
    with_masks = [{"label": [1, 0], "mask_benign": "m.png"}, {"label": [0, 1], "mask_malignant": ""}]
    assert choose_selection("val_soft_dice", with_masks)["metric"] == "val_soft_dice"
    both = [{"label": [1, 0]}, {"label": [0, 1]}, {"label": [0, 0], "mask_benign": " "}]
    assert choose_selection("val_pointing_game", both)["metric"] == "val_auc_mean"
    no_malignant = [{"label": [1, 0]}, {"label": [0, 0]}]
    chosen = choose_selection("val_soft_dice", no_malignant)
    assert chosen["metric"] == "val_neg_loss" and "no validation image is malignant" in chosen["reason"]
    all_benign = [{"label": [1, 0]}, {"label": [1, 1]}]
    assert "every validation image is benign" in choose_selection("val_dice_benign", all_benign)["reason"]
    kept = {"metric": "val_auc_benign", "reason": "selection_metric"}
    assert choose_selection("val_auc_benign", no_malignant) == kept


def test_negative_bce_against_a_numpy_loop():
    rng = np.random.default_rng(1)
    preds = rng.uniform(0.01, 0.99, (5, 2))
    labels = rng.integers(0, 2, (5, 2))
    total = 0.0
    for p_row, y_row in zip(preds, labels):
        for p, y in zip(p_row, y_row):
            total += -(y * math.log(p) + (1 - y) * math.log(1 - p))
    metric = NegativeBCE()
    metric.update(([torch.tensor(p) for p in preds[:3]], [torch.tensor(y) for y in labels[:3]]))
    metric.update(([torch.tensor(p) for p in preds[3:]], [torch.tensor(y) for y in labels[3:]]))
    assert math.isclose(metric.compute(), -total / 10, rel_tol=1e-5)


def test_per_stage_values():
    assert per_stage(3, "local", "epochs") == 3
    assert per_stage({"global": 1, "local": 2}, "local", "epochs") == 2
    with pytest.raises(UsageError, match=r"epochs has no value for the joint stage .*--epochs#joint 2"):
        per_stage({"global": 1}, "joint", "epochs")
    with pytest.raises(UsageError, match="must be a number or a dict"):
        per_stage("three", "joint", "epochs")


def test_why_no_model_names_the_reason(tmp_path):
    folder = tmp_path / "global"
    assert "the global stage was not run into" in why_no_model(folder / "model.pt")
    folder.mkdir()
    (folder / "last.pt").write_bytes(b"")
    record = {"metric": "val_auc_mean", "epochs_run": 2, "validation_items": 0, "history": {}, "reason": "r"}
    (folder / "selection.json").write_text(json.dumps(record))
    assert "ran 2 epoch(s) but the validation split is empty" in why_no_model(folder / "model.pt")
    record.update(validation_items=4, history={"1": {"val_auc_mean": None}, "2": {"val_auc_mean": None}})
    (folder / "selection.json").write_text(json.dumps(record))
    message = why_no_model(folder / "model.pt")
    assert "ran 2 epoch(s) but validation never produced the key metric val_auc_mean" in message


def test_unfinished_run_without_a_record_is_told_by_the_trainer_state(tmp_path):
    """Folders written before selection.json existed: the trainer state in last.pt says whether the run finished."""
    from scripts.training.preflight import check_unfinished_run

    folder = tmp_path / "global"
    folder.mkdir()
    torch.save({"trainer": {"epoch_length": 8, "iteration": 16, "max_epochs": 2}}, folder / "last.pt")
    check_unfinished_run(tmp_path, ["global"], resume=False, overwrite=False)  # finished: started afresh
    torch.save({"trainer": {"epoch_length": 8, "iteration": 8, "max_epochs": 2}}, folder / "last.pt")
    with pytest.raises(UsageError, match="unfinished global run: continue it with --resume true"):
        check_unfinished_run(tmp_path, ["global"], resume="false", overwrite="false")
    check_unfinished_run(tmp_path, ["global"], resume="true", overwrite=False)
    check_unfinished_run(tmp_path, ["global"], resume=False, overwrite="true")
    check_unfinished_run(tmp_path, ["local"], resume=False, overwrite=False)  # another stage's folder


def test_command_line_overrides_are_checked_against_the_config_files():
    """The overrides MONAI hands GLAMWorkflow: nested ids, tracking ids and new arguments of a component pass; an
    unknown id names its closest sibling."""
    from scripts.training.workflow import _file_config, check_overrides

    files = [str(TRAIN_CONFIG), str(TRAIN_CONFIG.parent / "evaluate.yaml")]
    file_config = _file_config(files, META)

    def check(**overrides):
        check_overrides(list(overrides), file_config)

    check(**{"eval_split": "validation", "validate#metrics#val_auc_mean#average": "micro"})
    check(tracking_uri="sqlite:///x.db", epochs=1)
    with pytest.raises(UsageError, match=r"unknown option --eval_splt: .*did you mean --eval_split\?"):
        check(eval_splt="validation")
    with pytest.raises(
        UsageError, match=r"unknown option --validate#metrics#val_auc_men: .*--validate#metrics#val_auc_mean"
    ):
        check(**{"validate#metrics#val_auc_men": "x"})
    # a new argument of a component passes (MONAI hands it over; the component refuses a name it does not take),
    # unless it is spelled like one the component has
    check(**{"validate#postprocessing#scales": True})
    with pytest.raises(UsageError, match=r"--validate#postprocessing#gama_c: .*--validate#postprocessing#gamma_c"):
        check(**{"validate#postprocessing#gama_c": 0.3})
    with pytest.raises(UsageError, match=r"unknown option --validate#no_such#scales"):
        check(**{"validate#no_such#scales": True})  # no such component
