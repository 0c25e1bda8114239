"""The benchmark's configuration: the models it compares (:data:`MODELS`), the budget a size preset declares
(:class:`Budget`, :func:`read_preset`), the YAML/JSON reader the presets and the search file share, and
:class:`BenchmarkError`, the error that names the file or run the benchmark cannot use."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts.enums import STAGES, Stage
from scripts.networks.global_network import PADDING_MODES

from . import CONFIGS, EVAL_CONFIG, REPO_ROOT, TRAIN_CONFIG
from .files import write_json


@dataclass(frozen=True)
class ModelSpec:
    """One benchmarked model: its name (folder and search-space key), its title in the tables and the bundle
    overlay that turns train.yaml's ``global`` stage into it (None: GLAM itself)."""

    name: str
    title: str
    overlay: Path | None

    def configs(self, preset: Path, evaluate: bool = False) -> list[Path]:
        """Its config files for training on ``preset``, or for evaluation with evaluate.yaml: after the preset for
        GLAM, whose checkpoint records its model settings, before it for a baseline, whose checkpoint records none
        (evaluate.yaml uses the preset's as given, GLAM's defaults, train.yaml's, for the others)."""
        overlay = [self.overlay] if self.overlay else []
        if not evaluate:
            return [TRAIN_CONFIG, preset, *overlay]
        return [TRAIN_CONFIG, *([preset, EVAL_CONFIG] if self.overlay is None else [EVAL_CONFIG, preset]), *overlay]


MODELS: dict[str, ModelSpec] = {
    "glam": ModelSpec("glam", "GLAM", None),
    "cam": ModelSpec("cam", "CAM", CONFIGS / "baseline_cam.yaml"),
    "gmic": ModelSpec("gmic", "GMIC", CONFIGS / "baseline_gmic.yaml"),
    "unet": ModelSpec("unet", "U-Net", CONFIGS / "baseline_unet.yaml"),
}


# What a model's network holds of another model's, for a preset's ``start_from``: {its submodule: the prefix of that
# submodule's weights in the other model's file ("" = the whole file)}, and which of its searched hyper-parameters
# the other's selected trial gives ({its config id: the other's config id}). GMIC's global module is a CAM.
HELD_MODELS: dict[tuple[str, str], tuple[dict[str, str], dict[str, str]]] = {
    ("gmic", "cam"): ({"global_network": ""}, {"t_global": "cam_t", "lambda_sparsity": "lambda_sparsity"}),
}


@dataclass(frozen=True)
class WarmStart:
    """A model whose trials start from the model another model's trials selected in the same run (GMIC from CAM:
    its global module trained first on the same budget as GLAM's, then the whole network, as GLAM's later stages
    follow its global stage): ``epochs`` of training each, the learning rate drawn from ``search_space``, the
    other hyper-parameters the selected trial's (:data:`HELD_MODELS`)."""

    model: str
    epochs: int
    search_space: str


class BenchmarkError(ValueError):
    """A preset, search space or previous run that the benchmark cannot use; the message names it."""

    #: the driver's exit status for this error (argparse's, for a usage error)
    exit_status = 2


@dataclass(frozen=True)
class Budget:
    """The same budget for every model: ``trials`` random-search trials of ``epochs`` epochs of the model's one stage
    (GLAM: its global stage), then GLAM's local and joint stages with ``local_epochs`` / ``joint_epochs`` from the
    selected global module; ``examples`` test images in the qualitative figure. ``model_overrides``: per model, config
    ids set on its command lines (they win over the overlays, which are layered after the preset). ``variation_seeds``:
    data seeds on which every model is trained again with its selected hyper-parameters (the variation of the table
    across data sets); ``wall_limit_h``: the run's wall-time target, checked in the results (None: no target).
    ``local_learning_rate`` / ``joint_learning_rate``, ``patch_shift``, ``centre_patches`` and ``local_padding_mode``:
    GLAM's later stages as the preset sets them (reported in the results; None: not a number in the preset),
    ``local_lambda_sparsity`` / ``joint_lambda_sparsity`` likewise when the preset sets the sparsity weight per stage
    (None: the trial's drawn weight for every stage), and ``local_t_local`` / ``joint_t_local`` when it sets the local
    pooling's share per stage (None: one value for every stage). ``init_from``: the work folder of an earlier
    benchmark run whose selected models the trials start from (None: fresh initialisations); ``init_modules``: per
    model, the submodules taken from that model (the others start fresh: GLAM's ``[global_network]`` gives its trials
    a fresh local module); a model not named takes all of it. ``start_from``: per model, the :class:`WarmStart` its
    trials take from another model's selection in this run (GMIC from CAM). ``seed_base``: trial k trains from torch
    seed ``seed_base + k`` (another base: the same recipe and hyper-parameter draws on other initialisations, data
    orders and augmentations).
    ``extra_trials``: the retry rule, the same for every model: a model none of whose trials learnt to localise gets up
    to this many more, one after another, until one does (the search's next draws; trial k from torch seed
    ``seed_base + k``)."""

    search_space: str
    trials: int
    epochs: int
    local_epochs: int
    joint_epochs: int
    examples: int
    model_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    variation_seeds: tuple[int, ...] = ()
    wall_limit_h: float | None = None
    local_learning_rate: float | None = None
    joint_learning_rate: float | None = None
    patch_shift: int = 0
    centre_patches: bool = False
    local_padding_mode: str = "zeros"
    init_from: str | None = None
    local_lambda_sparsity: float | None = None
    joint_lambda_sparsity: float | None = None
    local_t_local: float | None = None
    joint_t_local: float | None = None
    init_modules: dict[str, tuple[str, ...]] = field(default_factory=dict)
    start_from: dict[str, WarmStart] = field(default_factory=dict)
    seed_base: int = 0
    extra_trials: int = 0


def load_yaml(path: Path) -> dict[str, Any]:
    """The top-level mapping of a YAML/JSON file, read as MONAI reads bundle configs; a missing, unreadable or
    non-mapping file is a :class:`BenchmarkError` that names it."""
    from monai.bundle import ConfigParser

    if not Path(path).is_file():
        raise BenchmarkError(f"{path}: file not found")
    try:
        content = ConfigParser.load_config_file(str(path))
    except Exception as err:  # yaml/json syntax errors: name the file
        raise BenchmarkError(f"{path}: cannot read ({err})") from err
    if not isinstance(content, dict):
        raise BenchmarkError(f"{path}: expected a mapping at the top level, got {type(content).__name__}")
    return content


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise BenchmarkError(f"{where} must be true or false, got {value!r}")
    return value


def _padding_mode(value: Any, where: str) -> str:
    if value not in PADDING_MODES:
        raise BenchmarkError(f"{where} must be one of {', '.join(PADDING_MODES)}, got {value!r}")
    return value


def _positive_int(value: Any, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value < minimum:
        raise BenchmarkError(f"{where} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _model_overrides(value: Any, preset: Path) -> dict[str, dict[str, Any]]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(v, Mapping) for v in value.values()):
        raise BenchmarkError(f"{preset}: benchmark#model_overrides must map a model to {{config id: value}}")
    unknown = sorted(set(value) - set(MODELS))
    if unknown:
        raise BenchmarkError(f"{preset}: benchmark#model_overrides: unknown model(s) {unknown} (have {sorted(MODELS)})")
    return {str(k): dict(v) for k, v in value.items()}


def _init_modules(value: Any, preset: Path) -> dict[str, tuple[str, ...]]:
    if value is None:
        return {}
    where = f"{preset}: benchmark#init_modules"
    if not isinstance(value, Mapping) or not all(
        isinstance(v, (list, tuple)) and v and all(isinstance(m, str) and m for m in v) for v in value.values()
    ):
        raise BenchmarkError(f"{where} must map a model to a list of submodule names, got {value!r}")
    unknown = sorted(set(value) - set(MODELS))
    if unknown:
        raise BenchmarkError(f"{where}: unknown model(s) {unknown} (have {sorted(MODELS)})")
    return {str(k): tuple(v) for k, v in value.items()}


def _seeds(value: Any, preset: Path) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise BenchmarkError(f"{preset}: benchmark#variation_seeds must be a list of data seeds, got {value!r}")
    return tuple(_positive_int(v, f"{preset}: benchmark#variation_seeds", minimum=0) for v in value)


def _hours(value: Any, preset: Path) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise BenchmarkError(f"{preset}: benchmark#wall_limit_h must be a positive number of hours, got {value!r}")
    return float(value)


def _start_from(value: Any, preset: Path) -> dict[str, WarmStart]:
    if value is None:
        return {}
    where = f"{preset}: benchmark#start_from"
    if not isinstance(value, Mapping) or not all(isinstance(v, Mapping) for v in value.values()):
        raise BenchmarkError(f"{where} must map a model to {{model, epochs, search_space}}, got {value!r}")
    out = {}
    for name, spec in value.items():
        source = spec.get("model")
        if (name, source) not in HELD_MODELS:
            known = ", ".join(f"{a} from {b}" for a, b in HELD_MODELS)
            raise BenchmarkError(f"{where}: {name} cannot start from {source!r} (known: {known})")
        if not isinstance(spec.get("search_space"), str):
            raise BenchmarkError(f"{where}#{name}: needs a search_space (the learning rate's), got {spec!r}")
        epochs = _positive_int(spec.get("epochs"), f"{where}#{name}#epochs")
        out[str(name)] = WarmStart(str(source), epochs, spec["search_space"])
    return out


def read_preset(preset: Path) -> tuple[dict[str, Any], Budget]:
    """The merged ``train.yaml`` + preset configuration (raw, unparsed) and the benchmark budget it declares.

    The preset must set ``benchmark: {search_space, trials, examples}`` (optionally ``extra_trials``,
    ``model_overrides`` ...) and per-stage ``epochs``; the epochs of the ``global`` entry are every model's trial
    length.
    """
    from monai.bundle import ConfigParser

    content = load_yaml(preset)
    section = content.get("benchmark")
    if not isinstance(section, Mapping):
        raise BenchmarkError(
            f"{preset}: a benchmark preset needs a 'benchmark' section (search_space, trials, examples)"
        )
    for key in ("search_space", "trials", "examples"):
        if key not in section:
            raise BenchmarkError(f"{preset}: 'benchmark' lacks {key!r}")
    parser = ConfigParser()
    parser.read_config([str(TRAIN_CONFIG), str(preset)])
    config = parser.get()
    epochs = config.get("epochs")
    if not isinstance(epochs, Mapping) or not all(k in epochs for k in STAGES):
        raise BenchmarkError(f"{preset}: 'epochs' must give the global, local and joint epochs, got {epochs!r}")
    learning_rate = config.get("learning_rate")
    if not isinstance(learning_rate, Mapping):
        raise BenchmarkError(f"{preset}: 'learning_rate' must be per stage (global, local, joint)")
    lambdas = config.get("lambda_sparsity")
    lambdas = lambdas if isinstance(lambdas, Mapping) else {}
    shares = config.get("t_local")
    shares = shares if isinstance(shares, Mapping) else {}
    budget = Budget(
        search_space=str(section["search_space"]),
        trials=_positive_int(section["trials"], f"{preset}: benchmark#trials"),
        epochs=_positive_int(epochs[Stage.GLOBAL], f"{preset}: epochs#global"),
        local_epochs=_positive_int(epochs[Stage.LOCAL], f"{preset}: epochs#local"),
        joint_epochs=_positive_int(epochs[Stage.JOINT], f"{preset}: epochs#joint"),
        examples=_positive_int(section["examples"], f"{preset}: benchmark#examples", minimum=0),
        model_overrides=_model_overrides(section.get("model_overrides"), preset),
        variation_seeds=_seeds(section.get("variation_seeds"), preset),
        wall_limit_h=_hours(section.get("wall_limit_h"), preset),
        local_learning_rate=_number(learning_rate.get(Stage.LOCAL)),
        joint_learning_rate=_number(learning_rate.get(Stage.JOINT)),
        patch_shift=_positive_int(config.get("patch_shift", 0), f"{preset}: patch_shift", minimum=0),
        centre_patches=_flag(config.get("centre_patches", False), f"{preset}: centre_patches"),
        local_padding_mode=_padding_mode(config.get("local_padding_mode", "zeros"), f"{preset}: local_padding_mode"),
        init_from=_optional_text(section.get("init_from"), f"{preset}: benchmark#init_from"),
        local_lambda_sparsity=_number(lambdas.get(Stage.LOCAL)),
        joint_lambda_sparsity=_number(lambdas.get(Stage.JOINT)),
        local_t_local=_number(shares.get(Stage.LOCAL)),
        joint_t_local=_number(shares.get(Stage.JOINT)),
        init_modules=_init_modules(section.get("init_modules"), preset),
        start_from=_start_from(section.get("start_from"), preset),
        seed_base=_positive_int(section.get("seed_base", 0), f"{preset}: benchmark#seed_base", minimum=0),
        extra_trials=_positive_int(section.get("extra_trials", 0), f"{preset}: benchmark#extra_trials", minimum=0),
    )
    if budget.init_from and budget.start_from:
        raise BenchmarkError(f"{preset}: benchmark#start_from and init_from exclude each other (one start per model)")
    return config, budget


def flatten_preset(preset: Path, merged: Path) -> tuple[Path, list[Path]]:
    """A preset that names a base (``benchmark#base``: another preset, relative to the repository, itself possibly
    on a base) layered over it the way MONAI layers config files (each top-level key of the later file replaces
    the earlier one's, so an overlay states only what differs, and ``benchmark`` whole), written to ``merged``.

    Returns the file the workflows read (``preset`` itself when it has no base) and the chain of presets, base
    first (for the report)."""
    chain: list[Path] = []
    path = Path(preset).resolve()
    while True:
        if path in chain:
            raise BenchmarkError(f"{path}: benchmark#base leads back to {path.name}")
        chain.insert(0, path)
        section = load_yaml(path).get("benchmark")
        base = section.get("base") if isinstance(section, Mapping) else None
        if base is None:
            break
        base_path = Path(str(base)) if Path(str(base)).is_absolute() else REPO_ROOT / str(base)
        if not base_path.is_file():
            raise BenchmarkError(f"{path}: benchmark#base {base}: file not found (paths are relative to {REPO_ROOT})")
        path = base_path.resolve()
    if len(chain) == 1:
        return chain[0], chain
    content: dict[str, Any] = {}
    for part in chain:
        content.update(load_yaml(part))
    write_json(merged, content)
    return merged, chain


def _optional_text(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise BenchmarkError(f"{where} must be a folder path, got {value!r}")
    return value


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
