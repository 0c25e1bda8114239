"""The bundle's functions train.yaml, evaluate.yaml and the overlays call (as components or one-line expressions):
each on hand-computed cases, and train.yaml's per-stage wiring through MONAI's parser."""

from __future__ import annotations

import functools
import json
import os
from types import SimpleNamespace

import pytest
import torch
from conftest import TINY_CONFIG, TRAIN_CONFIG
from ignite.engine import Engine, Events
from monai.bundle import ConfigParser
from monai.handlers import EarlyStopHandler

from scripts.data.checks import check_data
from scripts.distributed import is_rank_zero
from scripts.errors import UsageError
from scripts.handlers.training_state import key_metric
from scripts.precision import as_dtype
from scripts.training.checkpoints import StageCheckpointer
from scripts.training.datasets import read_datalist
from scripts.training.preflight import per_stage
from scripts.training.selection import choose_selection, configured_selection
from scripts.training.stage import previous_modules, previous_stage, train_stage

LR = {"global": 3.0e-5, "local": 2.0e-5, "joint": 1.0e-5}


# -- scripts.training.stage --------------------------------------------------------------------------------------------
def test_previous_stage_and_model_follow_the_training_order():
    assert [previous_stage(s) for s in ("global", "local", "joint")] == [None, "global", "local"]
    assert [_parser(s).get_parsed_content("previous_model") for s in ("global", "local", "joint")] == [
        None,
        "/ck/global/model.pt",
        "/ck/local/model.pt",
    ]


def test_a_model_to_start_from_reaches_the_global_stage_only_with_its_modules():
    """train.yaml's ``global_init`` and previous_modules (the quick start's shipped global module; None: from
    scratch)."""
    starts = [_parser(s, global_init="m.pt").get_parsed_content("previous_model") for s in ("global", "local", "joint")]
    assert starts == ["m.pt", "/ck/global/model.pt", "/ck/local/model.pt"]
    kept = [previous_modules(s, init="m.pt", modules=("global_network",)) for s in ("global", "local", "joint")]
    assert kept == [["global_network"], None, None]
    assert previous_modules("global", init=None, modules=["global_network"]) is None
    assert previous_modules("global", init="m.pt") is None


def test_the_optimizer_gets_the_trainable_parameters_in_order():
    """train.yaml's optimizer#params: the local stage freezes the global module, so Adam holds none of its tensors."""
    parser = _parser("local")
    network, params = parser.get_parsed_content("network"), parser.get_parsed_content("optimizer#params")
    expected = [p for p in network.parameters() if p.requires_grad]
    assert 0 < len(expected) < len(list(network.parameters()))
    assert [id(p) for p in params] == [id(p) for p in expected]


def test_train_stage_hands_the_trainer_to_early_stopping_runs_it_and_summarises():
    calls = []
    trainer = SimpleNamespace(run=lambda: calls.append("run"))
    stopper = SimpleNamespace(set_trainer=lambda t: calls.append(("set_trainer", t)))
    best = SimpleNamespace(best_metric=0.25, best_metric_epoch=3)
    summary = train_stage("local", trainer, best, "/ck/local", early_stop=stopper)
    assert calls == [("set_trainer", trainer), "run"]
    assert summary == {"stage": "local", "best_metric": 0.25, "best_epoch": 3, "model": "/ck/local/model.pt"}
    calls.clear()
    assert train_stage("global", trainer, best, "/x")["model"] == "/x/model.pt" and calls == ["run"]


# -- per-stage values, precision, datasets, selection, tracking ----------------------------------------------------
def test_per_stage_takes_the_stage_value_or_the_one_number_and_scales_it():
    assert per_stage(LR, "local", "learning_rate") == 2.0e-5
    assert per_stage(4, "joint", "epochs") == 4 and type(per_stage(4, "joint", "epochs")) is int
    assert per_stage(LR, "joint", "learning_rate", scale=0.1) == 1.0e-5 * 0.1
    assert per_stage(3.0e-5, "global", "learning_rate", scale=0.1) == 3.0e-5 * 0.1
    with pytest.raises(UsageError, match="learning_rate has no value for the joint stage"):
        per_stage({"global": 1.0}, "joint", "learning_rate", scale=0.1)


def test_train_yaml_splits_the_amp_plan_and_reads_channels_last():
    assert as_dtype("bfloat16") is torch.bfloat16 and as_dtype("torch.float16") is torch.float16
    assert as_dtype(torch.bfloat16) is torch.bfloat16

    def parsed(config_id: str, **overrides):
        return _parser("global", **overrides).get_parsed_content(config_id)

    assert parsed("autocast_dtype", amp="true", amp_dtype="bfloat16", device="cpu") is torch.bfloat16
    assert parsed("autocast_dtype", amp=False, amp_dtype=torch.bfloat16, device="cpu") is None
    assert parsed("autocast_dtype", amp=True, amp_dtype="float16", device="cuda:0") is None
    assert parsed("engine_amp", amp=True, amp_dtype="float16", device="cuda:0") is True
    assert parsed("engine_amp", amp=True, amp_dtype="bfloat16", device="cuda:0") is False
    assert parsed("engine_amp", amp="false", amp_dtype="float16", device="cpu") is False
    with pytest.raises(Exception) as err:  # the parser's error says which expression; its cause says why
        parsed("engine_amp", amp=True, amp_dtype="float16", device="cpu")
    assert "needs a CUDA device" in str(err.value.__cause__)
    for text, layout in (
        ("true", torch.channels_last),
        (True, torch.channels_last),
        ("false", torch.contiguous_format),
    ):
        assert parsed("memory_format", channels_last=text) == layout
    assert parsed("memory_format", channels_last=0) == torch.contiguous_format


def test_datalist_is_read_with_paths_made_absolute_and_split_by_name(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    listing = {
        "training": [{"image": "img/a.png", "label": [1, 0], "mask_benign": "m/a.png"}],
        "validation": [{"image": "/abs/b.png", "label": [0, 0]}],
    }
    (folder / "datalist.json").write_text(json.dumps(listing))
    content = read_datalist(str(folder / "datalist.json"), splits=["training", "validation"])
    assert content["training"][0]["image"] == str(folder / "img" / "a.png")
    assert content["training"][0]["mask_benign"] == str(folder / "m" / "a.png")
    assert content["validation"][0]["image"] == "/abs/b.png"
    with pytest.raises(KeyError, match=r"datalist.json has no 'test' split \(it has \['training', 'validation'\]\)"):
        read_datalist(str(folder / "datalist.json"), splits=["training", "test"])
    # train.yaml: both splits needed, each read by name
    parser = _parser("global", datalist=str(folder / "datalist.json"))
    assert parser.get_parsed_content("val_datalist") == content["validation"]
    (folder / "datalist.json").write_text(json.dumps({"training": listing["training"]}))
    with pytest.raises(Exception) as err:
        _parser("global", datalist=str(folder / "datalist.json")).get_parsed_content("train_datalist")
    assert "has no 'validation' split" in str(err.value.__cause__ or err.value)


def test_cache_folder_and_persistent_workers():
    assert _parser("global", output_root="/runs/eval").get_parsed_content("cache_dir") == "/runs/cache"
    relative = os.path.join(os.path.dirname(os.path.abspath("eval")), "cache")
    assert _parser("global", output_root="eval").get_parsed_content("cache_dir") == relative
    for workers, persistent in ((4, True), (0, False), ("2", True)):
        parser = _parser("global", num_workers=workers)
        assert parser.get_parsed_content("train#dataloader#persistent_workers") is persistent


def test_configured_selection_is_what_choose_selection_keeps():
    assert configured_selection("val_auc_mean") == {"metric": "val_auc_mean", "reason": "selection_metric"}
    items = [{"image": "a", "label": [1, 0], "mask_benign": "m.png"}]
    assert choose_selection("val_soft_dice", items) == configured_selection("val_soft_dice")


def test_run_name_and_distributed_helpers():
    assert _parser("joint").get_parsed_content("run_name") == "train_joint"
    for device, ids in (("cpu", None), (torch.device("cuda", 1), [torch.device("cuda", 1)])):
        parser = ConfigParser()
        parser.read_config([str(TRAIN_CONFIG), str(TRAIN_CONFIG.parent / "multi_gpu_train.yaml")])
        parser["device"] = device
        assert parser.get_parsed_content("network#device_ids") == ids
    assert is_rank_zero() is True  # no process group: the only process


def test_check_data_is_off_with_check_data_false_and_names_the_split_otherwise(tmp_path):
    missing = str(tmp_path / "nope.png")
    assert check_data({"training": [{"image": missing, "label": [0, 0]}]}, enabled="false") is None
    with pytest.raises(Exception) as err:
        check_data([{"image": missing, "label": [0, 0]}], split="test", enabled=True)
    assert "nope.png" in str(err.value)


def test_the_prepare_batch_of_each_stage():
    """Random patches for the lesion-free images in the local stage only; patch shifts in local and joint."""
    got = {}
    for stage in ("global", "local", "joint"):
        prepare = _parser(stage, seed=5, patch_shift="16").get_parsed_content("train#prepare_batch")
        got[stage] = (prepare.random_negatives, prepare.patch_shift, prepare.seed, prepare.with_masks)
    assert got == {"global": (False, 0, 5, False), "local": (True, 16, 5, False), "joint": (False, 16, 5, False)}
    assert _parser("local", train_masks="true").get_parsed_content("train#prepare_batch").with_masks


def test_checkpointer_records_the_size_of_the_validation_split(tmp_path):
    net = torch.nn.Linear(1, 1)
    assert StageCheckpointer(tmp_path, {"network": net}, validation_items=[{}, {}, {}]).validation_items == 3
    assert StageCheckpointer(tmp_path, {"network": net}, validation_items=7).validation_items == 7


# -- validation metrics and handlers --------------------------------------------------------------------------------
def test_key_and_additional_metrics_split_the_metrics_by_the_selection():
    metrics = {"a": 1, "b": 2, "c": 3}
    assert key_metric(metrics, {"metric": "b", "reason": "x"}) == {"b": 2}
    assert key_metric(metrics, "c") == {"c": 3}
    with pytest.raises(ValueError, match="selection_metric 'd' is not a validation metric"):
        key_metric(metrics, "d")
    # train.yaml: the other validation metrics, in their order, the same objects as the evaluator's
    parser = _parser("global", selection={"metric": "val_pointing_game", "reason": "selection_metric"})
    every = parser.get_parsed_content("validate#metrics")
    additional = parser.get_parsed_content("validate#additional_metrics")
    assert list(additional) == [name for name in every if name != "val_pointing_game"] and len(additional) == 7
    assert all(additional[name] is every[name] for name in additional)
    assert list(parser.get_parsed_content("validate#key_metric")) == ["val_pointing_game"]


def test_early_stopping_is_off_at_patience_0_and_stops_on_the_key_metric():
    for patience in (0, "0"):
        assert _parser("global", early_stop_patience=patience).get_parsed_content("validate#early_stop") is None
    handler = _parser("global", early_stop_patience="2").get_parsed_content("validate#early_stop")
    assert isinstance(handler, EarlyStopHandler) and handler.patience == 2
    # a trainer validated every epoch on a key metric that peaks at epoch 2: stopped 2 epochs later, at epoch 4
    scores = iter([0.5, 0.8, 0.7, 0.6, 0.9, 0.9])
    evaluator = Engine(lambda e, b: None)

    @evaluator.on(Events.STARTED)
    def _name(engine):
        engine.state.key_metric_name = "val_x"

    @evaluator.on(Events.EPOCH_COMPLETED)  # where MONAI's metric handlers publish (before early stopping)
    def _score(engine):
        engine.state.metrics["val_x"] = next(scores)

    trainer = Engine(lambda e, b: None)
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda t: evaluator.run([0]))
    trainer.run = functools.partial(trainer.run, [0], max_epochs=6)  # a SupervisedTrainer holds its data and epochs
    handler.attach(evaluator)
    train_stage("global", trainer, SimpleNamespace(best_metric=0, best_metric_epoch=0), "/c", early_stop=handler)
    assert trainer.state.epoch == 4
    assert handler.score_function(evaluator) == 0.6  # the key metric of the last validation


# -- train.yaml's per-stage wiring through MONAI's parser ----------------------------------------------------------
def _parser(stage: str, **overrides) -> ConfigParser:
    parser = ConfigParser()
    parser.read_config([str(TRAIN_CONFIG), str(TINY_CONFIG)])
    parser["stage"] = stage
    parser["ckpt_root"] = "/ck"
    parser["output_root"] = "/runs/eval"
    parser["datalist"] = "/data/datalist.json"
    for key, value in overrides.items():
        parser[key] = value
    return parser


@pytest.mark.parametrize("stage", ["global", "local", "joint"])
def test_train_yaml_reads_each_stage_s_values(stage):
    epochs = {"global": 3, "local": 2, "joint": 1}
    batch = {"global": 4, "local": 3, "joint": 2}
    parser = _parser(stage, learning_rate=LR, epochs=epochs, batch_size=batch, lambda_sparsity=2.0e-4, patch_shift=8)
    assert parser.get_parsed_content("max_epochs") == epochs[stage]
    assert parser.get_parsed_content("stage_learning_rate") == LR[stage]
    assert parser.get_parsed_content("lr_scheduler#eta_min") == LR[stage] * 0.1
    assert parser.get_parsed_content("train#dataloader#batch_size") == batch[stage]
    assert parser.get_parsed_content("loss#lambda_sparsity") == 2.0e-4
    assert parser.get_parsed_content("key_map") == {"global": "S_g", "local": "S_l", "joint": "S_c"}[stage]
    assert parser.get_parsed_content("ckpt_dir") == f"/ck/{stage}"
    assert parser.get_parsed_content("output_dir") == f"/runs/eval/{stage}"
    assert parser.get_parsed_content("cache_dir") == "/runs/cache"
    assert (
        parser.get_parsed_content("previous_model")
        == {
            "global": None,
            "local": "/ck/global/model.pt",
            "joint": "/ck/local/model.pt",
        }[stage]
    )
    assert (
        parser.get_parsed_content("validate#stage_score")
        == {
            "global": "y_global",
            "local": "y_local",
            "joint": "y_fusion",
        }[stage]
    )
    prepare = parser.get_parsed_content("train#prepare_batch")
    assert prepare.random_negatives == (stage == "local") and prepare.patch_shift == (0 if stage == "global" else 8)
    assert parser.get_parsed_content("run_name") == f"train_{stage}"
    assert "worker_init_fn" not in parser["train#dataloader"]  # MONAI's DataLoader seeds its workers itself
    assert parser.get_parsed_content("train#dataloader#persistent_workers") is False  # tiny.yaml: num_workers 0


def test_train_yaml_defaults_off_cuda_and_command_line_texts():
    parser = _parser("global", amp="true", channels_last="false", pool_in_breast="true", train_masks="false")
    cuda = torch.cuda.is_available()
    assert parser.get_parsed_content("device") == torch.device("cuda:0" if cuda else "cpu")
    assert parser.get_parsed_content("autocast_dtype") is torch.bfloat16  # `--amp true`: bf16 on any device
    assert parser.get_parsed_content("engine_amp") is False
    assert parser.get_parsed_content("memory_format") == torch.contiguous_format
    assert parser.get_parsed_content("glam_settings").pool_in_breast is True
    assert parser.get_parsed_content("train_with_masks") is False
    assert parser.get_parsed_content("pin_memory") is cuda
    assert parser.get_parsed_content("datalist") == "/data/datalist.json"
    assert parser.get_parsed_content("tracking_uri").startswith("sqlite:") and parser.get_parsed_content(
        "tracking_uri"
    ).endswith("/runs/eval/mlruns.db")
    fresh = ConfigParser()
    fresh.read_config([str(TRAIN_CONFIG)])
    fresh["dataset_dir"] = "/mammo"
    assert fresh.get_parsed_content("datalist") == "/mammo/datalist.json"
    assert fresh.get_parsed_content("amp") is cuda and fresh.get_parsed_content("channels_last") is cuda
    assert fresh.get_parsed_content("early_stop_patience") == 0
    assert fresh.get_parsed_content("validate#early_stop") is None


def test_lambda_sparsity_per_stage_is_read_and_checked_before_the_first_stage():
    from scripts.training.preflight import _check_per_stage

    per = {"global": 1.0e-5, "local": 1.0e-3, "joint": 0.0}
    for stage in per:
        assert _parser(stage, lambda_sparsity=per).get_parsed_content("loss").lambda_sparsity == per[stage]
    _check_per_stage(_parser("all", lambda_sparsity=per), ["global", "local", "joint"])  # 0 and fractions: fine
    with pytest.raises(UsageError, match=r"lambda_sparsity has no value for the joint stage"):
        _check_per_stage(_parser("all", lambda_sparsity={"global": 1.0e-5}), ["global", "joint"])
    with pytest.raises(UsageError, match=r"lambda_sparsity must be positive numbers"):
        _check_per_stage(_parser("all", lambda_sparsity=-1.0e-4), ["global"])


def test_t_local_per_stage_builds_each_stage_s_pooling_and_is_checked_before_the_first_stage(tmp_path):
    """train.yaml's ``t_local`` as a dict: each stage's network pools its patch maps with the stage's share (the
    concat module's top-t, and the attention module's in the joint stage), its checkpoint records it, and a
    value outside (0, 1] or a missing stage is refused before any stage starts."""
    from scripts.networks.settings import checkpoint_setting
    from scripts.training.preflight import _check_per_stage

    per = {"global": 0.2, "local": 0.05, "joint": 0.3}
    for stage in per:
        parser = _parser(stage, t_local=per)
        network = parser.get_parsed_content("network")
        assert network.concat_aggregation.t == per[stage]
        if stage == "joint":
            assert network.attention.t == per[stage]
        torch.save(network.state_dict(), tmp_path / f"{stage}.pt")
        assert checkpoint_setting(tmp_path / f"{stage}.pt", "t_local") == per[stage]
    assert _parser("local", t_local=0.1).get_parsed_content("glam_settings").t_local == 0.1
    _check_per_stage(_parser("all", t_local=per), ["global", "local", "joint"])
    _check_per_stage(_parser("all", t_local=1.0), ["global"])  # the whole pool (average pooling): fine
    with pytest.raises(UsageError, match=r"t_local has no value for the joint stage"):
        _check_per_stage(_parser("all", t_local={"global": 0.2, "local": 0.05}), ["global", "local", "joint"])
    for bad in (0.0, 1.5, -0.1, {"global": 0.2, "local": 0.0, "joint": 0.2}, {"global": 0.2, "local": True}):
        with pytest.raises(UsageError, match=r"t_local must be fractions in \(0, 1\]"):
            _check_per_stage(_parser("all", t_local=bad), ["global", "local"])


def test_local_negatives_choose_the_lesion_free_images_patches_in_the_local_stage_only(tmp_path):
    from scripts.training.preflight import preflight_training

    chosen = {
        (stage, negatives): _parser(stage, local_negatives=negatives).get_parsed_content(
            "train#prepare_batch#random_negatives"
        )
        for stage in ("global", "local", "joint")
        for negatives in ("random", "salient")
    }
    assert chosen == {
        (s, n): s == "local" and n == "random" for s in ("global", "local", "joint") for n in ("random", "salient")
    }
    parser = _parser("local", local_negatives="salent", ckpt_root=str(tmp_path / "m"), output_root=str(tmp_path / "e"))
    with pytest.raises(UsageError, match=r"^local_negatives must be one of \['random', 'salient'\], got 'salent'$"):
        preflight_training(parser)
    assert not (tmp_path / "m").exists()  # refused before the run's folders are made


def test_glam_settings_read_command_line_text_as_each_setting_s_type():
    from scripts.networks.glam_settings import GLAMSettings

    settings = GLAMSettings(pool_in_breast="true", local_width="16", t_global="0.05", activation_checkpointing="no")
    assert settings.pool_in_breast is True and settings.activation_checkpointing is False
    assert settings.local_width == 16 and isinstance(settings.local_width, int) and settings.t_global == 0.05
    assert GLAMSettings(stage="local", aggregation="concat").aggregation == "concat"  # texts without a type stay


def test_evaluation_refuses_a_missing_checkpoint_or_a_training_only_stage_before_building_the_network(tmp_path):
    from scripts.evaluation.model import evaluation_settings

    with pytest.raises(FileNotFoundError, match=r"checkpoint to evaluate not found: .*nope.pt \(train the 'local'"):
        evaluation_settings(tmp_path / "nope.pt", "local")
    (tmp_path / "model.pt").write_bytes(b"")
    with pytest.raises(UsageError, match=r"stage must be one of .* to evaluate a model, got 'all'"):
        evaluation_settings(tmp_path / "model.pt", "all")


def test_inference_without_weights_is_one_line_naming_the_file(tmp_path):
    from scripts.networks.fast_inference import load_for_inference

    with pytest.raises(UsageError, match=r"^model weights not found: .*nope.pt: train GLAM") as err:
        load_for_inference(torch.nn.Linear(1, 1), tmp_path / "nope.pt")
    assert "\n" not in str(err.value) and "--ckpt_path" in str(err.value)
