"""The GLAM model settings a baseline network is built with (``@t_global``, ``@global_backbone`` ...)."""

from __future__ import annotations

from typing import Any

from scripts.networks.glam_settings import FROM_CHECKPOINT, GLAM_DEFAULTS, coerce_text


def model_setting(name: str, value: Any) -> Any:
    """The GLAM setting ``name`` as a baseline takes it: command-line text read as the setting's type, and
    evaluate.yaml's ``"checkpoint"`` read as GLAM's default, the record's fallback, since a baseline's checkpoint
    records no settings (the preset, layered after evaluate.yaml, gives the values it trained with).

    Args:
        name: a field of :class:`~scripts.networks.GLAMSettings` (``t_global``, ``pool_in_breast`` ...).
        value: the configuration's value.
    """
    if isinstance(value, str) and value.strip().lower() == FROM_CHECKPOINT:
        value = GLAM_DEFAULTS[name]
    return coerce_text({name: value})[name]
