"""The multi-stage run as a MONAI workflow (scripts.training.workflow.GLAMWorkflow) and the stage loop: each
stage in its own copy of the merged configuration, MONAI's tracking handlers in every copy, the rank-0-only handlers
disabled in the copies of the other ranks, and the process group owned by initialize / finalize.

The stages' ``run_stage`` is replaced by cheap expressions here: training itself is tested in test_training.py."""

from __future__ import annotations

import copy

import pytest
from conftest import TINY_CONFIG, TRAIN_CONFIG, tiny_overrides
from monai.bundle import ConfigParser

import scripts.training.workflow as runner
from scripts.training.workflow import GLAMWorkflow, run_stages

META = str(TRAIN_CONFIG.parent / "metadata.json")
MULTI_GPU_CONFIG = TRAIN_CONFIG.parent / "multi_gpu_train.yaml"


@pytest.fixture
def torchrun_env(monkeypatch):
    """The environment torchrun gives a 1-process group on 127.0.0.1."""
    from torchrun_job import free_port

    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    yield
    from scripts.distributed import destroy_distributed

    destroy_distributed()


def test_workflow_runs_every_stage_in_its_own_copy_without_the_stack(tmp_path, tiny_datalist):
    shared = tmp_path / "shared.yaml"  # a new id comes in a file: an override must name an id of the files
    shared.write_text('shared_list: "$[]"\n')
    wf = GLAMWorkflow(
        config_file=[str(TRAIN_CONFIG), str(TINY_CONFIG), str(shared)],
        meta_file=META,
        **tiny_overrides(tmp_path, tiny_datalist, stage="all", check_data=False),
        # what each stage evaluates: its own stage id, its checkpoint folder, a counter that leaks if copies are shared
        run_stage=["$@stage", "$@ckpt_dir", "$@shared_list.append(@stage) or list(@shared_list)"],
    )
    assert wf.workflow == "training"  # train.yaml's default run id names `training`
    wf.initialize()
    before = copy.deepcopy(wf.parser.get())
    results = wf.run()[-1]
    wf.finalize()
    assert results == [["global"], ["local"], ["joint"]]  # the last entry of each stage: a fresh list every stage
    assert wf.parser.get() == before and wf.parser["stage"] == "all"  # the parser is never modified


def test_one_stage_and_a_bad_stage(tmp_path, tiny_datalist):
    config = {"stage": "all", "run_stage": ["$@stage"]}
    assert run_stages(ConfigParser(config), "local") == ["local"]
    with pytest.raises(ValueError, match="stage must be 'all' or one of"):
        run_stages(ConfigParser(config), "both")


def test_tracking_handlers_reach_every_stage(tmp_path, tiny_datalist):
    """MONAI's --tracking patches its handler into train#handlers of the merged config: every stage's copy has it."""
    settings = {
        "handlers_id": {"trainer": {"id": "train#trainer", "handlers": "train#handlers"}},
        "configs": {
            "trainer": {"_target_": "collections.Counter", "stage": "@stage"},  # a cheap stand-in for MLFlowHandler
            "save_execute_config": False,
        },
    }
    wf = GLAMWorkflow(
        config_file=[str(TRAIN_CONFIG), str(TINY_CONFIG)],
        meta_file=META,
        tracking=settings,
        **tiny_overrides(tmp_path, tiny_datalist, stage="all", check_data=False),
    )
    last = len(wf.parser["train"]["handlers"]) - 1
    wf.parser["run_stage"] = [f"$@train#handlers#{last}"]
    wf.initialize()
    assert [dict(c) for c in wf.run()[-1]] == [{"stage": s} for s in ("global", "local", "joint")]


def test_other_ranks_build_no_rank_zero_only_handler(monkeypatch):
    """On a rank other than 0 the stage copies leave out the `rank_zero_only` classes (never built: the class below
    does not exist); rank 0 builds them."""
    config = {
        "stage": "all",
        "rank_zero_only": "$['NoSuchLogger']",
        "handlers": [{"_target_": "NoSuchLogger"}, {"_target_": "collections.OrderedDict"}],
        "run_stage": ["$len(@handlers)"],
    }
    monkeypatch.setattr(runner.idist, "get_rank", lambda: 1)
    parser = ConfigParser(config)
    assert run_stages(parser, "all") == [1, 1, 1]
    assert "_disabled_" not in parser["handlers"][0]  # only the copies were changed
    monkeypatch.setattr(runner.idist, "get_rank", lambda: 0)
    with pytest.raises(Exception, match="NoSuchLogger"):
        run_stages(ConfigParser(config), "global")


def test_initialize_and_finalize_own_the_process_group(tmp_path, tiny_datalist, torchrun_env):
    import torch
    import torch.distributed as dist

    wf = GLAMWorkflow(
        config_file=[str(TRAIN_CONFIG), str(TINY_CONFIG), str(MULTI_GPU_CONFIG)],
        meta_file=META,
        **tiny_overrides(tmp_path, tiny_datalist, stage="all", check_data=False),
        run_stage=["$@stage", "$torch.distributed.get_world_size()"],
    )
    assert not dist.is_initialized()
    wf.initialize()
    assert dist.is_initialized() and dist.get_backend() == ("nccl" if torch.cuda.is_available() else "gloo")
    assert wf.run()[-1] == [1, 1, 1]
    wf.finalize()
    assert not dist.is_initialized()
    # a workflow that is finalised without having run leaves the group too
    wf.initialize()
    assert dist.is_initialized()
    wf.finalize()
    assert not dist.is_initialized()


def test_the_stages_run_on_the_workflows_own_parser(tmp_path, tiny_datalist, monkeypatch):
    """GLAMWorkflow runs the stages on its own parser, the one MONAI's run_workflow built (no second workflow,
    nothing read again), and `run` (train.yaml's default run id) names `training`."""
    overrides = tiny_overrides(tmp_path, tiny_datalist, stage="all", check_data=False)
    overrides["run_stage"] = ["$@stage", "$@ckpt_dir"]
    wf = GLAMWorkflow(config_file=[str(TRAIN_CONFIG), str(TINY_CONFIG)], meta_file=META, **overrides)
    assert wf.workflow == "training"
    wf.initialize()
    seen = []
    real_run_stages = runner.run_stages
    monkeypatch.setattr(
        runner, "run_stages", lambda parser, stage: seen.append(parser) or real_run_stages(parser, stage)
    )
    result = wf.run()
    assert seen == [wf.parser]
    # [per stage, the last entry of its run_stage]
    assert result == [[str(tmp_path / "models" / s) for s in ("global", "local", "joint")]]
