"""Synthetic data sets on disk: :func:`make_synthetic_dataset` generates the views of whole screening exams, writes
their images and masks, the patient-split ``datalist.json`` and ``generator.json``; :func:`ensure_synthetic_dataset`
does so once per settings, in a folder named after the settings (a hash of them), and reuses it afterwards."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from scripts.atomic import atomic_path, move_into_place
from scripts.data.boxes import BOXES_KEY
from scripts.enums import CLASS_NAMES

from .config import SIDES, VIEWS, SyntheticConfig
from .generator import SyntheticMammogramGenerator
from .writers import deterministic_uid, write_mammogram_dicom, write_mask_png, write_nifti, write_png16

__all__ = ["make_synthetic_dataset", "ensure_synthetic_dataset"]

_EXTENSIONS = {"png": ".png", "dcm": ".dcm", "nii": ".nii.gz"}

logger = logging.getLogger(__name__)


def _logged(items: Any, total: int, out: Path) -> list[dict[str, Any]]:
    """``items`` as a list, with a log line at every tenth of ``total`` (generating the quick start's data takes
    minutes)."""
    step, done = max(1, total // 10), []
    for item in items:
        done.append(item)
        if len(done) % step == 0 or len(done) == total:
            logger.info("synthetic data: %d/%d images written into %s", len(done), total, out)
    return done


def _plan_images(n: int) -> list[tuple[int, str, str]]:
    """(patient, side, view) for n images: screening exams of 4 views (L-CC, L-MLO, R-CC, R-MLO) per patient."""
    out = []
    for i in range(n):
        p, k = divmod(i, 4)
        out.append((p, SIDES[k // 2], VIEWS[k % 2]))
    return out


def _lesion_boxes(case: Any, mirrored: bool) -> list[dict[str, Any]]:
    """Each drawn lesion's box, ``{"label": class, "box": [y0, x0, y1, x1]}`` in the written file's pixels (far edges
    exclusive): the bounding box of its class's mask inside the window the lesion was drawn in (a lesion of the
    same class overlapping that window would widen it; lesions cut away by the breast's outline give none).
    ``mirrored``: the file stores the view mirrored (a right breast facing left)."""
    masks = dict(zip(CLASS_NAMES, (case.mask_benign, case.mask_malignant)))
    width = case.image.shape[1]
    boxes = []
    for lesion in case.lesions:
        r0, c0, r1, c1 = lesion["bbox"]
        rows, cols = np.nonzero(masks[lesion["class"]][r0:r1, c0:c1])
        if not len(rows):
            continue
        y0, y1, x0, x1 = r0 + int(rows.min()), r0 + int(rows.max()) + 1, c0 + int(cols.min()), c0 + int(cols.max()) + 1
        if mirrored:
            x0, x1 = width - x1, width - x0
        boxes.append({"label": str(lesion["class"]), "box": [y0, x0, y1, x1]})
    return boxes


def _write_one(args: tuple) -> dict[str, Any]:
    """Generate one view and write its files; returns the datalist item (paths relative to ``out_dir``)."""
    (config, seed, out_dir, fmt, facing_mode, photometric_mode, patient, side, view, index) = args
    gen = SyntheticMammogramGenerator(config, seed)
    case = gen.generate(patient, side, view)
    out = Path(out_dir)
    stem = f"{case.patient_id}_{side}_{view}"
    facing = "left" if facing_mode == "native" and side == "R" else "right"
    flip = (lambda a: a[:, ::-1]) if facing == "left" else (lambda a: a)
    image_rel = f"images/{stem}{_EXTENSIONS[fmt]}"
    spacing = config.spacing_mm
    if fmt == "png":
        write_png16(out / image_rel, flip(case.image), spacing)
    elif fmt == "nii":
        write_nifti(out / image_rel, flip(case.image), spacing)
    else:
        photometric = photometric_mode
        if photometric_mode == "mix":  # every third image MONOCHROME1, for readers' test mixes
            photometric = "MONOCHROME1" if index % 3 == 2 else "MONOCHROME2"
        study = deterministic_uid("glam-synthetic", seed, "study", patient)
        write_mammogram_dicom(
            out / image_rel,
            flip(case.image),
            patient_id=case.patient_id,
            laterality=side,
            view=view,
            facing=facing,
            spacing_mm=spacing,
            study_uid=study,
            series_uid=deterministic_uid("glam-synthetic", seed, "series", patient, side, view),
            sop_uid=deterministic_uid("glam-synthetic", seed, "sop", patient, side, view),
            instance_number=index + 1,
            photometric=photometric,
        )
    mask_ext = ".nii.gz" if fmt == "nii" else ".png"
    item: dict[str, Any] = {"image": image_rel, "label": case.label}
    for cls, mask in zip(CLASS_NAMES, (case.mask_benign, case.mask_malignant)):
        rel = f"masks/{stem}_{cls}{mask_ext}"
        if fmt == "nii":
            write_nifti(out / rel, flip(mask).astype(np.uint8), spacing)
        else:
            write_mask_png(out / rel, flip(mask), spacing)
        item[f"mask_{cls}"] = rel
    item[BOXES_KEY] = _lesion_boxes(case, mirrored=facing == "left")
    item.update(
        patient_id=case.patient_id,
        laterality=side,
        view=view,
        facing=facing,
        density="abcd"[case.density_category],
        lesions=[les["kind"] for les in case.lesions],
    )
    return item


def make_synthetic_dataset(
    out_dir: str | os.PathLike,
    n: int,
    size: tuple[int, int] = (736, 480),
    seed: int = 0,
    fmt: str = "png",
    *,
    fractions: Sequence[float] = (0.7, 0.15, 0.15),
    lesion_prevalence: float | None = None,
    facing: str | None = None,
    photometric: str = "MONOCHROME2",
    config: SyntheticConfig | None = None,
    workers: int = 1,
) -> Path:
    """Generate ``n`` views (4 per patient: L-CC, L-MLO, R-CC, R-MLO) under ``out_dir`` and write
    ``out_dir/datalist.json``; returns its path.

    Layout: ``images/SYN00012_L_CC.<ext>``, ``masks/SYN00012_L_CC_{benign,malignant}.<png|nii.gz>`` (both masks
    always written, all-zero where the image has no lesion of that class: for synthetic data "no lesion" is
    known, not missing; each item lists its lesions' ``boxes`` beside them, in the written file's pixels: the
    preprocessing keeps the mask files, and a box-only copy of the list evaluates the same lesions as boxes),
    ``datalist.json`` in MONAI layout with paths relative to ``out_dir`` and the split by
    patient (``fractions`` of patients for training/validation/test), and ``generator.json`` with the config.

    fmt: "png" (16-bit PNG, masks 0/255 PNG), "dcm" (MG DICOM For Presentation, masks 0/255 PNG) or "nii"
    (NIfTI, masks 0/1 NIfTI). Every file states the pixel spacing the size stands for (``config.spacing_mm``): DICOM
    PixelSpacing, the NIfTI affine, the PNG pHYs chunk (images and masks). facing: "right" (every breast faces
    right) or "native" (right breasts mirrored so the chest wall is at the right edge, as on a detector); default
    "native" for DICOM, "right" otherwise.
    photometric (DICOM only): "MONOCHROME2", "MONOCHROME1" or "mix" (every third image MONOCHROME1).
    The item key ``facing`` records the side the breast faces in the stored pixels.
    """
    from scripts.data.datalist import save_datalist, split_by_patient

    if int(n) != n or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if fmt not in _EXTENSIONS:
        raise ValueError(f"fmt must be one of {sorted(_EXTENSIONS)}, got {fmt!r}")
    facing_mode = facing if facing is not None else ("native" if fmt == "dcm" else "right")
    if facing_mode not in ("right", "native"):
        raise ValueError(f"facing must be 'right' or 'native', got {facing!r}")
    if photometric not in ("MONOCHROME1", "MONOCHROME2", "mix"):
        raise ValueError(f"photometric must be MONOCHROME1, MONOCHROME2 or mix, got {photometric!r}")
    cfg = config or SyntheticConfig()
    cfg = replace(cfg, size=(int(size[0]), int(size[1])))
    if lesion_prevalence is not None:
        cfg = replace(cfg, lesion_prevalence=float(lesion_prevalence))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [
        (cfg, int(seed), str(out), fmt, facing_mode, photometric, p, side, view, i)
        for i, (p, side, view) in enumerate(_plan_images(int(n)))
    ]
    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=int(workers)) as pool:
            # chunks small enough for a progress line about every tenth
            chunks = max(1, len(jobs) // (20 * workers))
            items = _logged(pool.map(_write_one, jobs, chunksize=chunks), len(jobs), out)
    else:
        items = _logged(map(_write_one, jobs), len(jobs), out)
    datalist = split_by_patient(items, fractions=fractions, seed=seed)
    description = {
        "generator": "glam_benchmark.synthetic",
        "seed": int(seed),
        "n": int(n),
        "format": fmt,
        "facing": facing_mode,
        "photometric": photometric,
        "config": asdict(cfg),
        "config_sha1": hashlib.sha1(json.dumps(asdict(cfg), sort_keys=True).encode()).hexdigest(),
    }
    with atomic_path(out / "generator.json") as tmp:
        tmp.write_text(json.dumps(description, indent=2) + "\n")
    return save_datalist(datalist, out / "datalist.json")


def ensure_synthetic_dataset(
    root: str | os.PathLike,
    n: int,
    size: tuple[int, int] = (736, 480),
    seed: int = 0,
    fmt: str = "png",
    **kwargs: Any,
) -> str:
    """The datalist of a synthetic dataset under ``root``, generated on first use.

    The dataset lives in ``root/synthetic_n{n}_{H}x{W}_seed{seed}_{fmt}_{tag}``, ``tag`` a hash of the other keyword
    arguments (``config``, ``lesion_prevalence``…), so other settings never reuse it, and is
    generated into a temporary folder that is renamed when complete, so an interrupted run leaves nothing half
    written. Returns the path of its ``datalist.json``. ``workers`` (processes) changes how the files are made, not
    what they hold (every image is drawn from its own seed), so it is left out of the tag.
    """
    settings = {
        k: (asdict(v) if isinstance(v, SyntheticConfig) else v) for k, v in sorted(kwargs.items()) if k != "workers"
    }
    tag = (
        hashlib.sha1(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:8]
        if settings
        else "default"
    )
    out = Path(root) / f"synthetic_n{int(n)}_{int(size[0])}x{int(size[1])}_seed{int(seed)}_{fmt}_{tag}"
    datalist = out / "datalist.json"
    if datalist.is_file():
        return str(datalist)
    out.parent.mkdir(parents=True, exist_ok=True)
    logger.info("generating %d synthetic images for %s (once: later runs with these settings reuse them)", n, out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        make_synthetic_dataset(tmp, n, size=size, seed=seed, fmt=fmt, **kwargs)
        move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return str(datalist)
