"""A datalist checked before any work: every file read once, every problem reported in one go, nothing modified."""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from monai.utils import str2bool

from ..enums import CLASS_NAMES, MASK_KEYS
from ..errors import UsageError
from .boxes import BOXES_KEY, parse_boxes
from .datalist import DatalistError, check_patient_splits, check_split_sizes, iter_items, load_datalist
from .geometry import as_pixel_spacing, format_spacing, stated_spacing_ok

logger = logging.getLogger(__name__)

#: what to do about images whose file states no pixel spacing (the check's spacing line and training's warning)
SPACING_HINT = (
    "if you know their mm per pixel, state it: tools/make_datalist.py --pixel_spacing MM (every item of the "
    "datalist), a pixel_spacing key per item, or --input_spacing MM on the training / inference command line"
)


@dataclass(frozen=True)
class DataProblem:
    """One problem: where (split, index, key, file) and what."""

    message: str
    split: str | None = None
    index: int | None = None
    key: str | None = None
    file: str | None = None

    def __str__(self) -> str:
        where = []
        if self.split is not None:
            where.append(f"{self.split}[{self.index}]" if self.index is not None else self.split)
        if self.key is not None:
            where.append(self.key)
        if self.file is not None:
            where.append(f"'{self.file}'")
        return f"{' '.join(where)}: {self.message}" if where else self.message


@dataclass
class DataCheckReport:
    """Outcome of a check: every problem, the items that were fine and the spacings the images state."""

    source: str
    problems: list[DataProblem] = field(default_factory=list)
    n_items: int = 0
    ok_items: list[tuple[str, int, str]] = field(default_factory=list)  # (split, index, image)
    # image path -> the (row, col) mm its file states, None when it states none; only for images that were read
    spacings: dict[str, tuple[float, float] | None] = field(default_factory=dict)
    # images read whose file states no spacing but whose item has a ``pixel_spacing`` key (make_datalist's
    # --pixel_spacing, a CSV column or an archive preset), which inference uses for them
    stated_by_datalist: set[str] = field(default_factory=set)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def unknown_spacing(self) -> list[str]:
        """The images read whose file states no pixel spacing."""
        return [image for image, spacing in self.spacings.items() if spacing is None]

    def spacing_summary(self) -> str | None:
        """One line on the pixel spacings the images state; None when no image was read."""
        if not self.spacings:
            return None
        known = [s for s in self.spacings.values() if s is not None]
        line = f"pixel spacing: {len(known)} of {len(self.spacings)} image(s) state one"
        if known:
            values = np.asarray(known, dtype=float)
            low, high = float(values.min()), float(values.max())
            line += f" ({low:.4g} mm)" if np.isclose(low, high, rtol=1e-3) else f" ({low:.4g}-{high:.4g} mm)"
        unknown = self.unknown_spacing
        if unknown:
            shown = ", ".join(f"'{p}'" for p in unknown[:3]) + (", ..." if len(unknown) > 3 else "")
            line += f"; without: {shown}"
            stated = sum(1 for p in unknown if p in self.stated_by_datalist)
            if stated:
                line += f"; {stated} of those {len(unknown)} have a pixel_spacing in the datalist"
            if stated < len(unknown):
                line += f"; {SPACING_HINT}"
        return line

    def format(self, list_ok: bool = False) -> str:
        """A summary line, then one line per problem (and per valid item with ``list_ok``)."""
        bad = {(p.split, p.index) for p in self.problems if p.index is not None}
        lines = [
            f"{self.source}: {self.n_items} item(s) checked, {len(self.ok_items)} ok, {len(bad)} with problems, "
            f"{len(self.problems)} problem(s) in total"
        ]
        spacing = self.spacing_summary()
        if spacing is not None:
            lines.append(spacing)
        lines += [f"ERROR {p}" for p in self.problems]
        if list_ok:
            lines += [f"ok    {split}[{index}] '{image}'" for split, index, image in self.ok_items]
        return "\n".join(lines)


class DataCheckError(UsageError):
    """A datalist with problems; ``report`` holds all of them."""

    def __init__(self, report: DataCheckReport):
        super().__init__(report.format())
        self.report = report


def _resolve(value: str, base_dir: Path | None) -> Path:
    p = Path(value)
    return p if p.is_absolute() or base_dir is None else base_dir / p


def _read(path: Path, mask: bool) -> tuple[np.ndarray | None, str | None, Any]:
    """``(array, None, meta)`` or ``(None, problem, None)``, never raising, so that every bad file is reported."""
    from .readers import MammogramReadError, read_mammogram

    try:
        arr, meta = read_mammogram(path, mask=mask)
    except MammogramReadError as err:
        return None, getattr(err, "problem", None) or str(err), None
    except Exception as err:  # a reader bug or an exotic file must not stop the other items from being checked
        return None, f"cannot be read ({type(err).__name__}: {err})", None
    arr = np.asarray(arr)
    if arr.ndim != 2:
        return None, f"expected a 2-D (H, W) array, got shape {arr.shape}", None
    return arr, None, meta


def _label_problem(label: Any) -> str | None:
    if not isinstance(label, (list, tuple)) or len(label) != 2:
        return f"label must be [benign, malignant] with two values 0/1 (or absent/null if unknown), got {label!r}"
    bad = [v for v in label if isinstance(v, bool) or not isinstance(v, (int, float)) or v not in (0, 1)]
    if bad:
        return f"label values must be 0 or 1, got {list(label)!r}"
    return None


def run_data_checks(
    datalist: str | os.PathLike | Mapping[str, Any],
    base_dir: str | os.PathLike | None = None,
    *,
    read_files: bool = True,
    strict_masks: bool = True,
) -> DataCheckReport:
    """Check a datalist and return the full report.

    Args:
        datalist: a datalist JSON file or the loaded dict.
        base_dir: the folder relative paths resolve against (default: the file's folder, or the working directory).
        read_files: read every image and mask; False checks structure, labels and splits only.
        strict_masks: an empty mask under label 1 is a problem.
    """
    if isinstance(datalist, (str, os.PathLike)):
        source = str(datalist)
        base = Path(base_dir) if base_dir is not None else Path(datalist).parent
        try:
            data: Mapping[str, Any] = load_datalist(datalist)
        except DatalistError as err:
            return DataCheckReport(source=source, problems=[DataProblem(str(err))])
    else:
        source = "datalist"
        base = Path(base_dir) if base_dir is not None else None
        data = datalist
        if not isinstance(data, Mapping) or any(not isinstance(v, list) for v in data.values()):
            return DataCheckReport(source, [DataProblem("a datalist must map split names to lists of items")])

    report = DataCheckReport(source=source)
    seen_images: dict[str, list[str]] = defaultdict(list)
    for split, index, item in iter_items(data):
        report.n_items += 1
        found = _check_item(
            split, index, item, base, read_files, strict_masks, report.spacings, report.stated_by_datalist
        )
        report.problems += found
        if isinstance(item, Mapping) and isinstance(item.get("image"), str):
            seen_images[str(_resolve(item["image"], base))].append(f"{split}[{index}]")
            if not found:
                report.ok_items.append((split, index, item["image"]))
    for image, places in seen_images.items():
        if len(places) > 1:
            report.problems.append(DataProblem(f"image listed {len(places)} times: {', '.join(places)}", file=image))
    report.problems += [DataProblem(msg) for msg in check_patient_splits(data)]
    report.problems += [
        DataProblem(f"{msg}; use other --fractions in make_datalist, or an external validation list")
        for msg in check_split_sizes(data)
    ]
    return report


def _check_item(
    split: str,
    index: int,
    item: Any,
    base: Path | None,
    read_files: bool,
    strict_masks: bool,
    spacings: dict[str, tuple[float, float] | None],
    stated_by_datalist: set[str] | None = None,
) -> list[DataProblem]:
    problems: list[DataProblem] = []

    def add(message: str, key: str | None = None, file: str | os.PathLike | None = None) -> None:
        problems.append(DataProblem(message, split, index, key, None if file is None else str(file)))

    if not isinstance(item, Mapping):
        add(f"item must be an object with an 'image' path, got {type(item).__name__}")
        return problems
    image_value = item.get("image")
    label = item.get("label")
    label_ok = label is None or _label_problem(label) is None
    if label is not None and not label_ok:
        add(_label_problem(label), "label")
    for key, allowed in (("laterality", ("L", "R")), ("facing", ("left", "right"))):
        if key in item and item[key] is not None and item[key] not in allowed:
            add(f"{key} must be one of {allowed}, got {item[key]!r}", key)
    spacing = item.get("pixel_spacing")
    if spacing is not None:
        values = spacing if isinstance(spacing, (list, tuple)) else [spacing]
        if not stated_spacing_ok(values):
            add(f"pixel_spacing must be a number or [row, col] in mm (0 < mm < 10), got {spacing!r}", "pixel_spacing")
    if not isinstance(image_value, str) or not image_value:
        add(f"missing 'image' path (got {image_value!r})", "image")
        return problems

    image_shape = None
    if read_files:
        image_path = _resolve(image_value, base)
        arr, problem, meta = _read(image_path, mask=False)
        if problem is not None:
            add(problem, "image", image_path)
        else:
            image_shape = arr.shape
            spacings[str(image_path)] = meta.get("spacing")  # the readers' (row, col) mm, None when unknown
            if item.get("pixel_spacing") is not None and stated_by_datalist is not None:
                stated_by_datalist.add(str(image_path))
    for message in _box_problems(item.get(BOXES_KEY), label if label_ok else None, image_shape):
        add(message, BOXES_KEY)
    for cls, key in enumerate(MASK_KEYS):
        value = item.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not value:
            add(f"mask path must be a non-empty string, got {value!r}", key)
            continue
        if not read_files:
            continue
        mask_path = _resolve(value, base)
        mask, problem, _ = _read(mask_path, mask=True)
        if problem is not None:
            add(problem, key, mask_path)
            continue
        if image_shape is not None and mask.shape != image_shape:
            add(
                f"mask size {mask.shape[0]}x{mask.shape[1]} differs from the image size "
                f"{image_shape[0]}x{image_shape[1]}",
                key,
                mask_path,
            )
        values = np.unique(mask)
        if values.size > 2 or values.min() < 0 or (values.size == 2 and values[0] != 0):
            shown = ", ".join(f"{v:g}" for v in values[:6]) + (", ..." if values.size > 6 else "")
            add(f"mask is not binary (values {shown}); expected 0 and one positive value", key, mask_path)
            continue
        positives = int(np.count_nonzero(mask))
        if label is not None and label_ok:
            if positives and label[cls] == 0:
                add(f"mask has {positives} lesion pixel(s) but label {CLASS_NAMES[cls]} is 0", key, mask_path)
            elif strict_masks and not positives and label[cls] == 1:
                add(f"label {CLASS_NAMES[cls]} is 1 but the mask is empty", key, mask_path)
    return problems


def _box_problems(boxes: Any, label: Any, image_shape: tuple[int, ...] | None) -> list[str]:
    """An item's malformed boxes, boxes beyond the image and boxes of a class whose label is 0."""
    try:
        entries = parse_boxes(boxes, BOXES_KEY)
    except ValueError as err:
        return [str(err).split(": ", 1)[-1] if str(err).startswith(f"{BOXES_KEY}: ") else str(err)]
    problems = []
    for i, (cls, (y0, x0, y1, x1)) in enumerate(entries):
        if image_shape is not None and (y1 > image_shape[0] or x1 > image_shape[1]):
            problems.append(
                f"{BOXES_KEY}[{i}]: box [y0, x0, y1, x1] = [{y0:g}, {x0:g}, {y1:g}, {x1:g}] reaches beyond the image "
                f"({image_shape[0]}x{image_shape[1]} pixels); boxes are in the image file's pixels"
            )
        if label is not None and label[CLASS_NAMES.index(cls)] == 0:
            problems.append(f"{BOXES_KEY}[{i}]: a {cls} box but label {cls} is 0")
    return problems


def check_datalist(
    datalist: str | os.PathLike | Mapping[str, Any],
    base_dir: str | os.PathLike | None = None,
    *,
    read_files: bool = True,
    strict_masks: bool = True,
) -> list[DataProblem]:
    """Every problem of a datalist (empty when usable); see :func:`run_data_checks`."""
    return run_data_checks(datalist, base_dir, read_files=read_files, strict_masks=strict_masks).problems


def assert_datalist_ok(
    datalist: str | os.PathLike | Mapping[str, Any],
    base_dir: str | os.PathLike | None = None,
    *,
    strict_masks: bool = True,
    pixel_spacing: float | Sequence[float] | None = None,
) -> DataCheckReport:
    """Check a datalist and return its report.

    Args:
        datalist: a datalist JSON file or the loaded dict.
        base_dir: the folder relative paths resolve against.
        strict_masks: an empty mask under label 1 is a problem.
        pixel_spacing: the model's; when set, images that state no spacing are logged as a warning.

    Raises:
        DataCheckError: listing every problem.
    """
    as_pixel_spacing(pixel_spacing)  # a bad value fails here, before every file is read
    return assert_report_ok(run_data_checks(datalist, base_dir, strict_masks=strict_masks), pixel_spacing)


def check_data(datalist: Any, pixel_spacing: Any = None, enabled: bool | str = True, split: str | None = None) -> Any:
    """:func:`assert_datalist_ok` as the configs' component, unless ``enabled`` is false.

    With ``split``, ``datalist`` is that split's items. Returns the report, or None when off.
    """
    if not str2bool(str(enabled)):
        return None
    if split is not None:
        datalist = {split: datalist}
    return assert_datalist_ok(datalist, pixel_spacing=pixel_spacing)


def assert_report_ok(report: DataCheckReport, pixel_spacing: float | Sequence[float] | None = None) -> DataCheckReport:
    """:func:`assert_datalist_ok` for a report already made (such as the ranks' of a distributed evaluation).

    Raises:
        DataCheckError: when the report has a problem.
    """
    model_spacing = as_pixel_spacing(pixel_spacing)
    if not report.ok:
        raise DataCheckError(report)
    unknown = [image for image in report.unknown_spacing if image not in report.stated_by_datalist]
    if model_spacing is not None and unknown:
        logger.warning(
            "%s: %d of %d image(s) state no pixel spacing, in the file or the datalist; unless input_spacing says it, "
            "the preprocessing estimates it so that the breast fits the window of the model's %s mm "
            "(spacing_fallback): %s; %s",
            report.source,
            len(unknown),
            len(report.spacings),
            format_spacing(model_spacing),
            ", ".join(unknown[:5]) + (", ..." if len(unknown) > 5 else ""),
            SPACING_HINT,
        )
    return report
