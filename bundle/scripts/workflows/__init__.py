"""GLAM's training and evaluation workflows on MONAI / PyTorch-Ignite engines (used from ``configs/train.yaml``)."""

from .batch import GLAMPrepareBatch
from .checkpoints import (
    StageCheckpointer,
    load_weights,
    plain_state_dict,
    read_record,
    require_weights,
    save_atomic,
    why_no_model,
)
from .cli import (
    UsageError,
    check_command_line,
    check_overrides,
    check_unfinished_run,
    check_writable,
    install_excepthook,
    per_stage,
    preflight_training,
)
from .datasets import CACHE_MODES, cache_mode, single_thread_worker, training_dataset
from .distributed import (
    RankBarrier,
    SyncBuffers,
    destroy_distributed,
    disable_on_other_ranks,
    init_distributed,
    local_device,
    quiet_other_ranks,
    rank_share,
    rank_zero_first,
)
from .handlers import BestMetricState, EpochSeeder, key_metric
from .inference import (
    GLAMInferenceStep,
    image_facts,
    image_notes,
    maps_on_original,
    quiet_library_logs,
    spacing_note,
)
from .inference_files import OutputSelection
from .inference_folder import InferenceOutputFolder, OutputFolderRefused, file_sha256
from .inference_inputs import SafeDataset, collate_inference, inference_items, inference_reader, root_cause
from .inference_writer import GLAMInferenceWriter
from .panels import SaliencyPanelWriter
from .postprocessing import MAP_KEYS, GLAMOutputsd
from .precision import AutocastInferer, amp_plan
from .report import MetricsReport, check_checkpoint, eval_split_items
from .runner import (
    STAGE_ORDER,
    GLAMTrainingWorkflow,
    active_parser,
    attach_tracked_config,
    run_stages,
    run_training,
    running_parser,
    stages_to_run,
    track_config_artifact,
    tracking_params,
)
from .sampler import BalancedEpochSampler, positive_flags
from .selection import MASK_METRICS, NegativeBCE, choose_selection, stage_score_key, validation_has_masks
from .throughput import InferenceProgress, InferenceThroughput, show_inference_log

__all__ = [
    "read_record",
    "why_no_model",
    "UsageError",
    "check_command_line",
    "check_overrides",
    "check_unfinished_run",
    "check_writable",
    "install_excepthook",
    "per_stage",
    "preflight_training",
    "tracking_params",
    "attach_tracked_config",
    "track_config_artifact",
    "MASK_METRICS",
    "NegativeBCE",
    "choose_selection",
    "stage_score_key",
    "validation_has_masks",
    "key_metric",
    "InferenceThroughput",
    "InferenceProgress",
    "show_inference_log",
    "InferenceOutputFolder",
    "OutputFolderRefused",
    "OutputSelection",
    "file_sha256",
    "GLAMPrepareBatch",
    "training_dataset",
    "CACHE_MODES",
    "cache_mode",
    "single_thread_worker",
    "AutocastInferer",
    "amp_plan",
    "BalancedEpochSampler",
    "positive_flags",
    "EpochSeeder",
    "BestMetricState",
    "StageCheckpointer",
    "require_weights",
    "load_weights",
    "save_atomic",
    "plain_state_dict",
    "SaliencyPanelWriter",
    "GLAMOutputsd",
    "MAP_KEYS",
    "MetricsReport",
    "check_checkpoint",
    "eval_split_items",
    "STAGE_ORDER",
    "GLAMTrainingWorkflow",
    "active_parser",
    "run_stages",
    "run_training",
    "running_parser",
    "stages_to_run",
    "init_distributed",
    "destroy_distributed",
    "local_device",
    "rank_share",
    "rank_zero_first",
    "disable_on_other_ranks",
    "quiet_other_ranks",
    "RankBarrier",
    "SyncBuffers",
    "SafeDataset",
    "collate_inference",
    "inference_items",
    "inference_reader",
    "image_facts",
    "image_notes",
    "quiet_library_logs",
    "maps_on_original",
    "root_cause",
    "spacing_note",
    "GLAMInferenceStep",
    "GLAMInferenceWriter",
]
