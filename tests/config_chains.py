"""The preprocessing chains as the configs write them, for tests: parsed from bundle/configs/train.yaml and
inference.yaml (the one place a chain is declared) with config-id overrides."""

from __future__ import annotations

from pathlib import Path

from conftest import BUNDLE_ROOT, TRAIN_CONFIG
from monai.bundle import ConfigParser
from monai.transforms import Compose

INFERENCE_CONFIG = BUNDLE_ROOT / "configs" / "inference.yaml"


def parse(files: list[Path] | None = None, **overrides) -> ConfigParser:
    """The configs ``files`` (default inference.yaml) with ``overrides`` set by config id, as the command line sets
    them; inference.yaml without a checkpoint takes GLAM's default model settings."""
    files = [INFERENCE_CONFIG] if files is None else files
    parser = ConfigParser()
    parser.read_config([str(f) for f in files])
    parser["bundle_root"] = str(BUNDLE_ROOT)
    if INFERENCE_CONFIG in files:
        parser["ckpt_path"] = str(BUNDLE_ROOT / "models" / "no_such_checkpoint.pt")
    for key, value in overrides.items():
        parser[key] = value
    return parser


def inference_chains(**overrides) -> tuple[Compose, Compose]:
    """inference.yaml's ``preprocessing`` and ``loading`` (the same transform objects) with ``overrides``, e.g.
    ``pixel_spacing=0.4, image_size=[736, 480]``."""
    parser = parse(**overrides)
    return parser.get_parsed_content("preprocessing"), parser.get_parsed_content("loading")


def training_chain(chain: str = "validate", files: list[Path] | None = None, **overrides) -> Compose:
    """train.yaml's ``<chain>#preprocessing`` then ``<chain>#batch_transforms``: what the model sees of an item."""
    parser = parse([TRAIN_CONFIG] if files is None else files, **overrides)
    cached, steps = (parser.get_parsed_content(f"{chain}#{part}") for part in ("preprocessing", "batch_transforms"))
    return Compose(list(cached.transforms) + list(steps.transforms))


def mammogram_steps(standardize: bool = False, **overrides) -> Compose:
    """``validate#preprocessing``'s mammogram steps and best-centre window (its transforms 1-10: drop empty masks,
    load, boxes into masks, resample, masks to 0/1 bytes, mirror, crop, window) on ``image`` and the
    ``mask_benign`` / ``mask_malignant`` an item has, as MetaTensors that record every geometric step (``Invertd``
    undoes them); then, with ``standardize``, ``validate#batch_transforms``' standardisation. ``overrides``: config
    ids, e.g. ``image_size=[64, 40], crop_iterations=2, crop_buffer=3``."""
    parser = parse([TRAIN_CONFIG], **overrides)
    steps = list(parser.get_parsed_content("validate#preprocessing").transforms[1:11])
    if standardize:
        steps += list(parser.get_parsed_content("validate#batch_transforms").transforms)
    return Compose(steps)
