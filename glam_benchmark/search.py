"""The random hyper-parameter search: the search space read from ``glam_benchmark/configs/benchmark_search.yaml``
(:func:`load_search_space`), each model's reproducible trials drawn from it (:func:`sample_trials`) and the bundle
overrides of one trial (:func:`trial_overrides`)."""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scripts.enums import STAGES, Stage

from .presets import MODELS, BenchmarkError, load_yaml


@dataclass(frozen=True)
class SearchSpace:
    """Per parameter name, ``("log10_uniform", (lo, hi))`` or ``("choice", values)``; per model, which config id
    each parameter sets."""

    name: str
    params: dict[str, tuple[str, tuple[float, ...]]]
    models: dict[str, dict[str, str]]
    seed: int


def load_search_space(path: Path, name: str) -> SearchSpace:
    """Read ``spaces[name]`` and ``models`` from the search file; every model's parameters must exist in the space."""
    content = load_yaml(path)
    spaces = content.get("spaces")
    if not isinstance(spaces, Mapping) or name not in spaces:
        known = sorted(spaces) if isinstance(spaces, Mapping) else []
        raise BenchmarkError(f"{path}: no search space {name!r} under 'spaces' (have {known})")
    params: dict[str, tuple[str, tuple[float, ...]]] = {}
    for key, spec in spaces[name].items():
        where = f"{path}: spaces#{name}#{key}"
        if not isinstance(spec, Mapping) or len(spec) != 1:
            raise BenchmarkError(f"{where} must be {{log10_uniform: [lo, hi]}} or {{choice: [...]}}, got {spec!r}")
        kind, values = next(iter(spec.items()))
        if kind == "log10_uniform":
            if not (isinstance(values, Sequence) and len(values) == 2 and float(values[0]) <= float(values[1])):
                raise BenchmarkError(f"{where}: log10_uniform needs [lo, hi] with lo <= hi, got {values!r}")
        elif kind == "choice":
            if not (isinstance(values, Sequence) and len(values) > 0):
                raise BenchmarkError(f"{where}: choice needs a non-empty list, got {values!r}")
        else:
            raise BenchmarkError(f"{where}: unknown kind {kind!r} (log10_uniform or choice)")
        params[str(key)] = (kind, tuple(float(v) for v in values))
    models = content.get("models")
    if not isinstance(models, Mapping):
        raise BenchmarkError(f"{path}: needs a 'models' mapping (model -> {{config id: space parameter}})")
    mapping: dict[str, dict[str, str]] = {}
    for model, ids in models.items():
        if model not in MODELS:
            raise BenchmarkError(f"{path}: models#{model}: unknown model (have {sorted(MODELS)})")
        for config_id, param in (ids or {}).items():
            if param not in params:
                raise BenchmarkError(f"{path}: models#{model}#{config_id} uses {param!r}, not in spaces#{name}")
        mapping[str(model)] = {str(k): str(v) for k, v in (ids or {}).items()}
    missing = sorted(set(MODELS) - set(mapping))
    if missing:
        raise BenchmarkError(f"{path}: models lacks {missing}")
    return SearchSpace(name, params, mapping, int(content.get("seed", 0)))


def sample_trials(space: SearchSpace, model: str, n: int) -> list[dict[str, float]]:
    """``n`` trials of ``model``: config id -> value, drawn from a generator seeded by (space seed, model name),
    so a model's trials do not depend on the other models or on the order they run in, and trial k is the same
    whatever ``n`` is. Log-uniform parameters are 10^u, u uniform in [lo, hi]."""
    if model not in space.models:
        raise BenchmarkError(f"no search parameters for model {model!r}")
    rng = np.random.default_rng([space.seed, zlib.crc32(model.encode())])
    trials = []
    for _ in range(int(n)):
        values: dict[str, float] = {}
        for config_id, param in space.models[model].items():
            kind, bounds = space.params[param]
            if kind == "log10_uniform":
                values[config_id] = float(10.0 ** rng.uniform(bounds[0], bounds[1]))
            else:
                values[config_id] = float(bounds[int(rng.integers(len(bounds)))])
        trials.append(values)
    return trials


def trial_overrides(
    params: Mapping[str, float], per_stage: Mapping[str, Mapping[str, float]], seed: int = 0
) -> dict[str, Any]:
    """Bundle overrides of one trial: a drawn value whose config id the preset sets per stage (``per_stage``, e.g.
    ``learning_rate`` and ``lambda_sparsity``: ``{global: ..., local: ..., joint: ...}``) replaces the ``global``
    stage's only (the stage every model's search trains; GLAM's local and joint stages keep the preset's values:
    the local map needs its own sparsity, glam_benchmark/docs/results_findings.md, section 7), the other ids are
    set as drawn, and
    the trial trains from its own torch ``seed`` (initialisation, data order, augmentations): whether the weakly
    supervised maps start to localise within a short budget depends on the initialisation (section 4), so trials
    that shared one would all share that luck."""
    out: dict[str, Any] = {"seed": int(seed)}
    for key, value in params.items():
        stages = per_stage.get(key)
        if isinstance(stages, Mapping):
            out[key] = {**{k: float(v) for k, v in stages.items()}, Stage.GLOBAL: float(value)}
        else:
            out[key] = float(value)
    return out


def per_stage_values(config: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """The ids of a merged preset that are set per stage with a number for every stage (``learning_rate``,
    ``lambda_sparsity`` when given as a mapping, ``epochs``...): what :func:`trial_overrides` keeps beside a
    drawn global value."""
    return {
        str(key): {str(k): float(v) for k, v in value.items()}
        for key, value in config.items()
        if isinstance(value, Mapping)
        and set(value) == set(STAGES)
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values())
    }
