"""GLAM's settings as one record (:class:`GLAMSettings`), each with its :class:`SettingSpec`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from monai.utils import str2bool

from ..aggregation import AGGREGATIONS, AggregationSpec
from ..bundle_info import bundle_version
from ..data.geometry import as_pixel_spacing
from ..enums import Stage
from ..errors import UsageError
from ..patches import as_pair
from ..pooling import check_fraction
from .global_network import PADDING_MODES

#: inference takes the checkpoint's value (the text ``checkpoint`` in inference.yaml)
FROM_CHECKPOINT = "checkpoint"
#: inference chooses the value itself (inference.yaml's, else the record's default)
CHOSEN = "chosen"
#: the largest window or patch side (pixels) a record may have: 41 cm at 0.05 mm, beyond any mammography detector
MAX_WINDOW_SIDE = 8192
_MAX_PATCHES = 256
_MAX_UNITS = 65536


def as_flag(value: Any, name: str) -> bool:
    """A yes/no option that may come from the command line as text."""
    try:
        return str2bool(str(value).strip())  # str(): also bools and the integers 0/1
    except ValueError:
        raise UsageError(f"{name} must be true or false, got {value!r}") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _sides(value: Any) -> bool:
    pair = value if isinstance(value, list) else [value, value]
    return len(pair) == 2 and all(_is_int(v) and 1 <= v <= MAX_WINDOW_SIDE for v in pair)


def _count(value: Any) -> bool:
    return _is_int(value) and 1 <= value <= _MAX_PATCHES


def _units(value: Any) -> bool:
    return _is_int(value) and 1 <= value <= _MAX_UNITS


def _fraction(value: Any) -> bool:
    return _is_number(value) and 0 < value <= 1


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


_SIDES = f"an integer or [rows, cols], integers in 1..{MAX_WINDOW_SIDE}"
_COUNT, _UNITS = f"an integer in 1..{_MAX_PATCHES}", f"an integer in 1..{_MAX_UNITS}"
_FRACTION, _BOOL = "a number in (0, 1]", "true or false"


@dataclasses.dataclass(frozen=True)
class SettingSpec:
    """What the bundle knows of one setting besides its default.

    Args:
        record: its JSON value in a checkpoint's record; None: not recorded.
        check: the check of a recorded value, and ``expected``, what it must be.
        compared: whether loading a checkpoint compares it (False: an inference choice that changes no weight).
        inference: :data:`FROM_CHECKPOINT`, :data:`CHOSEN` or None (not an inference setting).
        text: how command-line text becomes the setting.
    """

    record: Callable[[Any], Any] | None
    check: Callable[[Any], bool] | None = None
    expected: str = ""
    compared: bool = True
    inference: str | None = FROM_CHECKPOINT
    text: Callable[[Any, str], Any] | None = None


def _int_text(value: Any, name: str) -> int:
    return int(value)


def _float_text(value: Any, name: str) -> float:
    return float(value)


def setting(default: Any, record: Callable[[Any], Any] | None, check=None, expected="", **spec: Any) -> Any:
    """A field of :class:`GLAMSettings`: ``default`` and the :class:`SettingSpec` metadata."""
    return dataclasses.field(default=default, metadata={"spec": SettingSpec(record, check, expected, **spec)})


def _pair_record(name: str) -> Callable[[Any], list[int]]:
    return lambda value: list(as_pair(value, name))


def _as_is(value: Any) -> Any:
    return value


def _spacing_record(value: Any) -> list[float] | None:
    spacing = as_pixel_spacing(value)
    return None if spacing is None else list(spacing)


@dataclasses.dataclass(frozen=True)
class GLAMSettings:
    """GLAM's settings (:class:`~scripts.networks.glam.GLAM`'s arguments), the paper's values by default; text (from the
    command line) is read as each setting's type."""

    # "global", "local" or "joint"; not recorded: one checkpoint serves the next stage and inference
    stage: str = setting(Stage.JOINT, None, inference=None)
    # the preprocessing window (rows, cols) the network is trained on, recorded for inference
    image_size: Sequence[int] = setting(
        (2944, 1920),
        _pair_record("image_size"),
        lambda v: isinstance(v, list) and _sides(v),
        f"[rows, cols], integers in 1..{MAX_WINDOW_SIDE}",
    )
    # the (row, col) pixel size in mm of the training images, or None when unknown; inference resamples to it
    pixel_spacing: float | Sequence[float] | None = setting(
        None,
        _spacing_record,
        lambda v: v is None or (isinstance(v, list) and len(v) == 2 and all(_is_number(s) and s > 0 for s in v)),
        "null or [row, col] mm, positive numbers",
    )
    # local patch size in input pixels, int or (rows, cols); a multiple of 4
    patch_size: int | Sequence[int] = setting(512, _pair_record("patch_size"), _sides, _SIDES)
    # K, patches per image in training mode
    num_patches_train: int = setting(6, _as_is, _count, _COUNT, compared=False, inference=None, text=_int_text)
    # M, patches per image in eval mode
    num_patches_eval: int = setting(1, _as_is, _count, _COUNT, compared=False, inference=CHOSEN, text=_int_text)
    # top-t% fraction of the global module's per-scale pooling
    t_global: float = setting(0.03, float, _fraction, _FRACTION, compared=False, text=_float_text)
    # top-t% fraction of the patch aggregation
    t_local: float = setting(0.2, float, _fraction, _FRACTION, compared=False, text=_float_text)
    # weights of S_0, S_1, S_2 in S_g
    gammas: Sequence[float] = setting(
        (0.2, 0.6, 0.2),
        lambda value: [float(g) for g in value],
        lambda v: isinstance(v, list) and len(v) == 3 and all(_is_number(g) and g >= 0 for g in v),
        "three numbers >= 0",
    )
    # weight of S_g in S_c = gamma_c S_g + (1 - gamma_c) S_l
    gamma_c: float = setting(
        0.5,
        float,
        lambda v: _is_number(v) and 0 <= v <= 1,
        "a number in [0, 1]",
        compared=False,
        inference=CHOSEN,
        text=_float_text,
    )
    # the local ResNet-HR's depth and width
    local_depth: int = setting(34, int, _units, _UNITS, text=_int_text)
    local_width: int = setting(64, int, _units, _UNITS, text=_int_text)
    # how the local ResNet-HR's convolutions pad: "zeros" (the paper's) or "replicate" (no cue of the patch's edge)
    local_padding_mode: str = setting(
        "zeros", _as_is, lambda v: v in PADDING_MODES, " or ".join(repr(m) for m in PADDING_MODES)
    )
    # recompute the local module's activations in backward to fit more patches
    activation_checkpointing: bool = setting(False, None, inference=None, text=as_flag)
    # hidden size of the gated attention
    attention_hidden: int = setting(128, int, _units, _UNITS, text=_int_text)
    # keyword arguments of the global module's GlobalBackbone; the paper's ResNet-22 when empty
    global_backbone: Mapping[str, Any] | None = setting(
        None, lambda value: dict(value or {}), lambda v: isinstance(v, dict), "a mapping of the backbone's options"
    )
    # the global module pools only map cells on the breast (GlobalNetwork)
    pool_in_breast: bool = setting(False, bool, _is_bool, _BOOL, text=as_flag)
    # a name in scripts.aggregation.AGGREGATIONS; None: the paper's (concat in local, attention in joint)
    aggregation: str | None = setting(None, _as_is, lambda v: v is None or isinstance(v, str), "null or a name")
    # hold the gated attention and the fusion head; False: the authors' inference layout
    joint_modules: bool = setting(True, bool, _is_bool, _BOOL, text=as_flag)
    # pool every global scale after upsampling it to S_0's size (the authors' code)
    global_pool_after_upsampling: bool = setting(False, bool, _is_bool, _BOOL, compared=False, text=as_flag)

    @classmethod
    def of(cls, settings: GLAMSettings | None = None, **overrides: Any) -> GLAMSettings:
        """``settings`` (default: the paper's) with ``overrides``.

        Raises:
            TypeError: an unknown name.
        """
        if settings is not None and not isinstance(settings, GLAMSettings):
            raise TypeError(f"settings must be a GLAMSettings, got {type(settings).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(overrides) - set(names))
        if unknown:
            raise TypeError(f"GLAM got unexpected keyword arguments {unknown}; its settings: {names}")
        return cls(**overrides) if settings is None else dataclasses.replace(settings, **overrides)

    def __post_init__(self) -> None:
        # a setting given as text (``--pool_in_breast true`` arrives as 'true') is read as the setting's type
        for name, spec in setting_specs(self).items():
            value = getattr(self, name)
            if isinstance(value, str) and spec.text is not None:
                object.__setattr__(self, name, spec.text(value, name))

    def as_kwargs(self) -> dict[str, Any]:
        """``name -> value`` of every field (shallow)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def recorded(self) -> dict[str, Any]:
        """The record a checkpoint carries: each recorded setting as JSON, and the bundle's version."""
        specs = setting_specs(self)
        record = {name: spec.record(getattr(self, name)) for name, spec in specs.items() if spec.record}
        return {**record, "bundle_version": bundle_version()}

    def check(self) -> None:
        """Refuse settings that cannot build a working network, before any weight is drawn.

        Raises:
            ValueError: naming the setting (the modules check their own).
        """
        patch_size = as_pair(self.patch_size, "patch_size")
        if patch_size[0] % 4 or patch_size[1] % 4:
            raise UsageError(f"patch_size must be a multiple of 4 (the local module's stride), got {patch_size}")
        for name, k in (("num_patches_train", self.num_patches_train), ("num_patches_eval", self.num_patches_eval)):
            if isinstance(k, bool) or not isinstance(k, int) or k < 1:
                raise UsageError(f"{name} must be a positive int, got {k!r}")
        if not 0.0 <= float(self.gamma_c) <= 1.0:
            raise UsageError(f"gamma_c must be in [0, 1], got {self.gamma_c}")
        chosen: AggregationSpec | None = None
        if self.aggregation is not None:
            chosen = AGGREGATIONS.look_up(self.aggregation, "aggregation")
        joint = self.stage == Stage.JOINT or (chosen is not None and chosen.joint_module)
        if not self.joint_modules and joint:
            raise UsageError("joint_modules=False leaves no attention/fusion: use stage 'global'/'local' with concat")
        check_fraction(self.t_local, "t_local")
        if self.local_padding_mode not in PADDING_MODES:
            raise UsageError(f"local_padding_mode must be one of {PADDING_MODES}, got {self.local_padding_mode!r}")
        as_pair(self.image_size, "image_size")
        as_pixel_spacing(self.pixel_spacing)


def setting_specs(settings: type[GLAMSettings] | GLAMSettings = GLAMSettings) -> dict[str, SettingSpec]:
    """``name -> SettingSpec`` of every field of ``settings``."""
    return {f.name: f.metadata["spec"] for f in dataclasses.fields(settings)}


def coerce_text(values: Mapping[str, Any], settings: type[GLAMSettings] = GLAMSettings) -> dict[str, Any]:
    """``values`` with command-line texts read as each setting's type."""
    specs = setting_specs(settings)
    return {
        name: specs[name].text(value, name) if name in specs and specs[name].text else value
        for name, value in values.items()
    }


#: GLAM's own default of every setting (the paper's values)
GLAM_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(GLAMSettings)}
