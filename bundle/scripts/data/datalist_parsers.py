"""CSV layouts ("flavours") a datalist can be built from: one row parser per flavour, behind a registry.

A parser turns one CSV row into a :class:`ParsedRow` (the image, its label, patient/laterality/view, the row's
ROI masks and box annotations); :func:`scripts.data.datalist.items_from_csv` reads the CSV, picks the parser whose
signature columns the header has (:func:`find_datalist_parser`) and merges the rows of one image. Parsers register
themselves with :func:`register_datalist_parser`; a new layout needs one decorated function and nothing else::

    @register_datalist_parser("my-layout", signature=["file", "diagnosis"], columns="file, diagnosis")
    def parse_my_layout_row(row, where, base):
        ...

MONAI's ``ComponentStore`` would be the idiom, but it only accepts Python identifiers as names ("cbis-ddsm" is
not one) and cannot unregister, hence a plain dict.

Rows reach parsers keyed by normalised column names (:func:`normalise_column`: case, surrounding spaces and
underscores ignored, so ``Image_ID`` arrives as ``image id``) with stripped text values ("" when empty).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..enums import CLASS_NAMES, LesionClass
from ..errors import UsageError
from .boxes import parse_boxes
from .errors import CsvRowError
from .geometry import stated_spacing_ok

__all__ = [
    "CsvRow",
    "CsvRowError",
    "ParsedRow",
    "RowParser",
    "DatalistParser",
    "DATALIST_PARSERS",
    "CSV_FLAVOURS",
    "register_datalist_parser",
    "unregister_datalist_parser",
    "find_datalist_parser",
    "normalise_column",
]

CsvRow = Mapping[str, str]  # normalised column name -> stripped cell text
_MISSING = ("", "nan", "none", "null")  # cell texts that mean "not given"


@dataclass(frozen=True)
class ParsedRow:
    """What one CSV row says about one image."""

    image: Path
    label: list[int] | None  # [benign, malignant]; None: unknown
    fields: dict[str, str | None]  # patient_id, laterality, view, official_split; an empty value means "not given"
    # lesion class -> this row's ROI mask of that class: a mask file, or outlines to rasterise (PolygonMask)
    masks: dict[str, Any] = field(default_factory=dict)
    pixel_spacing: float | tuple[float, float] | None = None  # mm, stated by the CSV or the archive's preset
    spacing_source: str | None = None  # where pixel_spacing comes from ("csv:pixel_spacing", "preset:cbis-ddsm")
    notes: tuple[str, ...] = ()  # what the parser decided that the user should know (listed, not errors)
    # the row's box annotations, ``{"label": class, "box": [y0, x0, y1, x1]}`` in the image file's pixels
    boxes: tuple[dict[str, Any], ...] = ()


# (row, where, base) -> ParsedRow; ``where`` ("file.csv:line") starts every CsvRowError message, ``base`` is the
# folder the CSV's paths are relative to
RowParser = Callable[[CsvRow, str, Path], ParsedRow]


@dataclass(frozen=True)
class DatalistParser:
    """A registered flavour: its name, the columns that identify it, a description of its columns, its parser."""

    name: str
    signature: frozenset[str]  # normalised column names; a header with all of them has this layout
    columns: str  # what users are told the layout's columns are (CSV_FLAVOURS, the unknown-layout error)
    parse: RowParser


DATALIST_PARSERS: dict[str, DatalistParser] = {}


def normalise_column(name: str) -> str:
    """A column name compared without case, surrounding spaces or underscores: ``" Image_ID"`` -> ``"image id"``."""
    return " ".join(str(name).strip().lower().replace("_", " ").split())


def register_datalist_parser(name: str, *, signature: Iterable[str], columns: str) -> Callable[[RowParser], RowParser]:
    """Decorator registering a row parser as flavour ``name``, chosen for CSVs whose header has every
    ``signature`` column; ``columns`` describes the layout's columns to users. Returns the function unchanged."""

    def register(parse: RowParser) -> RowParser:
        if name in DATALIST_PARSERS:
            raise UsageError(f"a datalist parser named {name!r} is already registered")
        sig = frozenset(normalise_column(c) for c in signature)
        DATALIST_PARSERS[name] = DatalistParser(name, sig, columns, parse)
        return parse

    return register


def unregister_datalist_parser(name: str) -> DatalistParser:
    """Remove flavour ``name`` from the registry (KeyError if it is not registered); returns its entry."""
    return DATALIST_PARSERS.pop(name)


def find_datalist_parser(columns: Iterable[str]) -> DatalistParser | None:
    """The parser whose signature the header ``columns`` contain, or None. When several match, the one with the
    most signature columns wins (a CBIS-DDSM header also has "image"-like columns), ties in registration order."""
    cols = {normalise_column(c) for c in columns}
    matching = [p for p in DATALIST_PARSERS.values() if p.signature <= cols]
    return max(matching, key=lambda p: len(p.signature), default=None)


class _FlavourColumns(Mapping[str, str]):
    """Flavour name -> description of its columns, read live from the registry (so it cannot drift from it)."""

    def __getitem__(self, name: str) -> str:
        return DATALIST_PARSERS[name].columns

    def __iter__(self) -> Iterator[str]:
        return iter(DATALIST_PARSERS)

    def __len__(self) -> int:
        return len(DATALIST_PARSERS)

    def __repr__(self) -> str:
        return repr(dict(self))


CSV_FLAVOURS: Mapping[str, str] = _FlavourColumns()


# ------------------------------------------------------------------------------------------------------------
# cell values
# ------------------------------------------------------------------------------------------------------------
def _laterality(value: Any) -> str | None:
    v = str(value or "").strip().upper()
    return {"L": "L", "LEFT": "L", "R": "R", "RIGHT": "R"}.get(v)


_BIRADS_TEXT = re.compile(r"^(?:BI[-\s]?RADS)?[\s:_-]*(\d+)\s*([A-Z]?)$", re.IGNORECASE)


def _birads(row: CsvRow, column: str, where: str, highest: int) -> int | None:
    """The BI-RADS category of a ``column`` cell ("BI-RADS 4", "4", "4a"; 4A/4B/4C count as 4), None when the cell
    is empty or NaN. Anything else (another letter, "4D", a category outside 1 to ``highest``, text) raises
    CsvRowError naming ``where``, the column and the value: a guess would turn "BI-RADS 7" into a malignant image."""
    text = str(row.get(column, "") or "").strip()
    if text.lower() in _MISSING:
        return None
    match = _BIRADS_TEXT.match(text)
    category, letter = (int(match.group(1)), match.group(2).upper()) if match else (0, "")
    if not 1 <= category <= highest or letter not in (("", "A", "B", "C") if category == 4 else ("",)):
        raise CsvRowError(
            f"{where}: {column.replace(' ', '_')} must be a BI-RADS category 1-{highest} (4A/4B/4C too), got {text!r}"
        )
    return category


def _binary(value: Any, where: str) -> int | None:
    v = str(value if value is not None else "").strip().lower()
    if v in ("", "nan", "none", "null", "unknown"):
        return None
    if v in ("0", "0.0", "false", "no"):
        return 0
    if v in ("1", "1.0", "true", "yes"):
        return 1
    raise CsvRowError(f"{where}: label must be 0/1 (or empty for unknown), got {value!r}")


def _box(row: CsvRow, columns: tuple[str, str, str, str], label: str | None, where: str) -> dict[str, Any] | None:
    """A row's box from its four coordinate ``columns`` (y0, x0, y1, x1 order): None when all four are empty or NaN
    (a row without a box); one coordinate missing, or a box :func:`~scripts.data.boxes.parse_boxes` refuses, raises
    CsvRowError naming ``where``. ``label``: the box's class (None: the caller decided it has no class)."""
    cells = [str(row.get(c, "") or "").strip() for c in columns]
    if all(cell.lower() in _MISSING for cell in cells):
        return None
    if any(cell.lower() in _MISSING for cell in cells):
        raise CsvRowError(f"{where}: a box needs all of {', '.join(columns)}, got {cells}")
    try:
        box = [float(cell) for cell in cells]
        (cls, coords), *_ = parse_boxes([{"label": label, "box": box}], "box")
    except ValueError as err:
        raise CsvRowError(f"{where}: {str(err).removeprefix('box[0]: ')} ({', '.join(columns)})") from None
    return {"label": cls, "box": [round(v, 3) for v in coords]}


def _image_fields(patient_id: str, laterality: Any, view: str, official_split: str | None = None) -> dict[str, Any]:
    """The item fields every layout gives, in item key order; the view is upper-cased ("cc" -> "CC")."""
    fields = {"patient_id": patient_id, "laterality": _laterality(laterality), "view": view.upper() or None}
    if official_split:
        fields["official_split"] = official_split
    return fields


def parse_spacing(value: Any, where: str) -> float | tuple[float, float] | None:
    """A pixel spacing cell or option in mm: "0.05", "0.05 0.06", "0.05,0.06" or "0.05x0.06" (row, col); empty or
    "none": None. Anything else, or a value <= 0, raises CsvRowError naming ``where``."""
    text = str(value if value is not None else "").strip().lower()
    if text in ("", "none", "null", "nan", "unknown"):
        return None
    parts = text.replace(",", " ").replace("x", " ").replace("\\", " ").split()
    try:
        numbers = [float(p) for p in parts]
    except ValueError:
        numbers = []
    if not stated_spacing_ok(numbers):
        raise CsvRowError(f"{where}: pixel spacing must be one or two numbers in mm (0 < mm < 10), got {value!r}")
    return numbers[0] if len(numbers) == 1 else (numbers[0], numbers[1])


def _dicom_fields(path: Path) -> dict[str, Any]:
    """patient_id (CBIS-DDSM's per-view ids reduced to the woman's ``P_nnnnn``), laterality and view of a DICOM file
    (its header only); {} for other files or unreadable headers."""
    from .cbis_ddsm import cbis_patient_id
    from .readers import DICOM_SUFFIXES, read_dicom_header

    if path.suffix.lower() not in DICOM_SUFFIXES:
        return {}
    try:
        header = read_dicom_header(path)
    except Exception:
        return {}
    pid = header.get("patient_id")
    return {
        "patient_id": cbis_patient_id(pid) or pid,
        "laterality": header.get("laterality"),
        "view": header.get("view"),
    }


# ------------------------------------------------------------------------------------------------------------
# the flavours; registration order is the order users see them listed in
# ------------------------------------------------------------------------------------------------------------
#: the generic layout's box columns (normalised), in [y0, x0, y1, x1] order
GENERIC_BOX_COLUMNS = ("box y0", "box x0", "box y1", "box x1")


@register_datalist_parser(
    "generic",
    signature=["image"],
    columns="image, patient_id, laterality, view, label_benign, label_malignant, mask_benign, mask_malignant, "
    "pixel_spacing, box_y0, box_x0, box_y1, box_x1, box_label",
)
def parse_generic_row(row: CsvRow, where: str, base: Path) -> ParsedRow:
    """The project's own layout, one row per image or per box (repeated rows of an image are merged).

    Columns: ``image`` (path, required); ``patient_id``; ``laterality`` (L/R/left/right); ``view``;
    ``label_benign`` and ``label_malignant`` (0/1, true/false, yes/no; empty, nan, none, null or unknown means
    unknown, and one unknown value makes the whole label unknown); ``mask_benign`` and ``mask_malignant`` (paths);
    ``pixel_spacing`` (mm, one number or "row col"; used for images whose file states none); ``box_y0``, ``box_x0``,
    ``box_y1``, ``box_x1`` and ``box_label`` (benign / malignant): one box in the image file's pixels (rows down,
    columns across the image as displayed; y1 and x1 the far edges), all empty for a row without a box.
    """
    if not row.get("image"):
        raise CsvRowError(f"{where}: empty image path")
    label = [_binary(row.get(f"label {cls}"), where) for cls in CLASS_NAMES]
    spacing = parse_spacing(row.get("pixel spacing"), where)
    box = _box(row, GENERIC_BOX_COLUMNS, row.get("box label", ""), where)
    return ParsedRow(
        image=base / row["image"],
        label=None if None in label else label,
        fields=_image_fields(row.get("patient id", ""), row.get("laterality"), row.get("view", "")),
        masks={cls: base / row[f"mask {cls}"] for cls in CLASS_NAMES if row.get(f"mask {cls}")},
        pixel_spacing=spacing,
        spacing_source=None if spacing is None else "csv:pixel_spacing",
        boxes=() if box is None else (box,),
    )


_CLASS_WORDS = {
    "normal": [0, 0],
    "negative": [0, 0],
    LesionClass.BENIGN.value: [1, 0],
    LesionClass.MALIGNANT.value: [0, 1],
    "cancer": [0, 1],
    f"{LesionClass.BENIGN.value}+{LesionClass.MALIGNANT.value}": [1, 1],
}


@register_datalist_parser("path-label", signature=["path", "label"], columns="path, label, patient_id (optional)")
def parse_path_label_row(row: CsvRow, where: str, base: Path) -> ParsedRow:
    """A hospital export: one row per image, the label as a word.

    Columns: ``path`` (required, relative to the root); ``label``: normal or negative (no lesion), benign,
    malignant or cancer, benign+malignant (both), empty or unknown (unknown); ``patient_id`` (optional: else the
    DICOM PatientID, else the image is its own patient). Laterality and view come from the DICOM header.
    """
    if not row.get("path"):
        raise CsvRowError(f"{where}: empty path")
    word = row.get("label", "").lower()
    if word in ("", "unknown", "nan"):
        label = None
    elif word in _CLASS_WORDS:
        label = _CLASS_WORDS[word]
    else:
        raise CsvRowError(f"{where}: label must be one of {', '.join(_CLASS_WORDS)} or empty, got {row['label']!r}")
    image = base / row["path"]
    header = _dicom_fields(image)
    fields = _image_fields(row.get("patient id") or header.get("patient_id") or "", header.get("laterality"), "")
    fields["view"] = header.get("view")
    return ParsedRow(image=image, label=label, fields=fields)


def _cbis_label(pathology: str, where: str) -> list[int]:
    pathology = pathology.upper()
    if pathology.startswith("MALIGNANT"):
        return [0, 1]
    if pathology.startswith("BENIGN"):  # BENIGN_WITHOUT_CALLBACK too
        return [1, 0]
    raise CsvRowError(f"{where}: pathology must be BENIGN, BENIGN_WITHOUT_CALLBACK or MALIGNANT, got {pathology!r}")


def _image_shape(path: Path) -> tuple[int, int]:
    from .readers import DICOM_SUFFIXES, read_dicom_header, read_mammogram

    if path.suffix.lower() in DICOM_SUFFIXES:
        header = read_dicom_header(path)
        return int(header["rows"]), int(header["cols"])
    return tuple(read_mammogram(path)[0].shape)


@register_datalist_parser(
    "cbis-ddsm",
    signature=["image file path", "pathology"],
    columns="patient_id, left or right breast, image view, pathology, image file path, cropped image file path, "
    "ROI mask file path",
)
def parse_cbis_ddsm_row(row: CsvRow, where: str, base: Path) -> ParsedRow:
    """CBIS-DDSM's case description CSVs: one row per abnormality, so an image has as many rows as lesions.

    Columns: ``image file path`` (required); ``pathology`` (MALIGNANT, or BENIGN / BENIGN_WITHOUT_CALLBACK: both
    benign; other values leave the row out); ``patient_id`` (``P_00173``: the woman, shared by her Mass and Calc
    rows); ``left or right breast``; ``image view``; ``ROI mask file path`` and ``cropped image file path`` (the
    abnormality's mask, found among both because the CSV swaps them on some rows). Paths are used as written when
    they exist under the root, else resolved in the TCIA download (:mod:`scripts.data.cbis_ddsm`). The official
    Train/Test split is kept (``official_split``) and the preset pixel spacing is 0.05 mm.
    """
    from .cbis_ddsm import CBIS_PIXEL_SPACING_MM, _uid_parts, parse_case_folder, resolve_cbis_image, resolve_cbis_roi

    label = _cbis_label(row.get("pathology", ""), where)
    lesion = LesionClass.MALIGNANT if label[1] else LesionClass.BENIGN
    csv_image = row.get("image file path", "")
    resolved = resolve_cbis_image(base, csv_image, where)
    image = resolved if isinstance(resolved, Path) else resolved.path
    case = parse_case_folder(_uid_parts(csv_image)[0]) if csv_image else None
    patient = row.get("patient id", "") or (case.patient if case else "")
    masks, notes = {}, []
    roi, cropped = row.get("roi mask file path", ""), row.get("cropped image file path", "")
    if roi or cropped:
        if isinstance(resolved, Path):
            shape = _image_shape(image)
        else:
            shape = (resolved.rows, resolved.cols)
        mask, swapped = resolve_cbis_roi(base, roi, cropped, shape, where)
        masks[lesion] = mask
        if swapped:
            notes.append(f"{where}: the ROI mask was under 'cropped image file path' (the CSV swaps the two)")
    return ParsedRow(
        image=image,
        label=label,
        fields=_image_fields(
            patient,
            row.get("left or right breast"),
            row.get("image view", ""),
            case.official_split if case else None,
        ),
        masks=masks,
        pixel_spacing=CBIS_PIXEL_SPACING_MM,
        spacing_source="preset:cbis-ddsm",
        notes=tuple(notes),
    )


#: VinDr-Mammo's box columns (normalised), in [y0, x0, y1, x1] order
VINDR_BOX_COLUMNS = ("ymin", "xmin", "ymax", "xmax")


def _birads_class(category: int | None) -> list[int]:
    """VinDr's BI-RADS proxy: 1 normal [0, 0], 2-3 benign [1, 0], 4-5 malignant [0, 1]."""
    return [int(category in (2, 3)), int(category is not None and category >= 4)]


@register_datalist_parser(
    "vindr-mammo",
    signature=["study id", "image id"],
    columns="study_id, image_id, laterality, view_position, breast_birads (finding_birads, xmin, ymin, xmax, ymax, "
    "split optional)",
)
def parse_vindr_mammo_row(row: CsvRow, where: str, base: Path) -> ParsedRow:
    """VinDr-Mammo's annotation CSVs (breast-level_annotations.csv, finding_annotations.csv); images are
    ``images/<study_id>/<image_id>.dicom`` under the root.

    Columns: ``study_id`` and ``image_id`` (required; the study is the patient); ``laterality``;
    ``view_position``; ``breast_birads`` and/or ``finding_birads`` (at least one); ``split`` (training/test: the
    official split, kept); ``xmin``, ``ymin``, ``xmax``, ``ymax`` (finding_annotations.csv: the finding's box in the
    DICOM's pixels; empty or NaN on rows without a finding). VinDr has no pathology, so the label is a BI-RADS proxy
    on the higher category: 1 normal, 2-3 benign, 4-5 malignant (suspicious); a category cell that is not empty and
    not BI-RADS 1-5 ("BI-RADS 7", "4D", "x") leaves the row out, named. A box takes the class of its own
    finding's BI-RADS by the same rule (the breast's where the finding states none), and the image's label includes
    that class (a BI-RADS 3 finding in a BI-RADS 4 breast is a benign box: label [1, 1]); a box whose category is 1
    or missing is left out (noted).
    """
    study, image_id = row.get("study id", ""), row.get("image id", "")
    if not study or not image_id:
        raise CsvRowError(f"{where}: study_id and image_id are required")
    breast, finding = (_birads(row, column, where, 5) for column in ("breast birads", "finding birads"))
    scores = [b for b in (breast, finding) if b]
    if not scores:
        raise CsvRowError(f"{where}: no BI-RADS category in breast_birads/finding_birads")
    split = row.get("split", "").lower()
    if split not in ("", "training", "test"):
        raise CsvRowError(f"{where}: split must be training or test, got {row['split']!r}")
    label = _birads_class(max(scores))
    finding = finding or breast
    box_class = _birads_class(finding)
    cls = CLASS_NAMES[box_class.index(1)] if any(box_class) else None
    box = _box(row, VINDR_BOX_COLUMNS, cls or CLASS_NAMES[0], where)
    notes = []
    if box is not None and cls is None:
        notes.append(f"{where}: box left out: its finding's BI-RADS ({finding}) is neither benign nor malignant")
        box = None
    if box is not None:
        label = [max(a, b) for a, b in zip(label, box_class)]
    return ParsedRow(
        image=base / "images" / study / f"{image_id}.dicom",
        label=label,
        fields=_image_fields(study, row.get("laterality"), row.get("view position", ""), split or None),
        boxes=() if box is None else (box,),
        notes=tuple(notes),
    )


@register_datalist_parser(
    "inbreast",
    signature=["file name", "bi-rads"],
    columns="Patient ID;Patient age;Laterality;View;Acquisition date;File Name;ACR;Bi-Rads (';'-separated)",
)
def parse_inbreast_row(row: CsvRow, where: str, base: Path) -> ParsedRow:
    """INbreast's ``INbreast.csv``; images ``AllDICOMs/<File Name>_*.dcm``, outlines ``AllXML/<File Name>.xml``.

    Columns: ``File Name`` and ``Bi-Rads`` (required: 1 normal, 2-3 benign, 4a/4b/4c, 5 and 6 malignant, see
    :data:`scripts.data.inbreast.INBREAST_BIRADS`; anything else leaves the row out, named); ``Laterality``;
    ``View``; ``Patient ID`` (used unless "removed", as published: else the woman's hash in the DICOM file name).
    Every ROI of an image's XML goes into the mask of the image's class; a BI-RADS 1 image's ROIs are ignored
    (noted).
    """
    from .inbreast import (
        INBREAST_BIRADS,
        PolygonMask,
        find_inbreast_dicom,
        find_inbreast_xml,
        inbreast_patient_id,
        read_inbreast_rois,
    )

    name = row.get("file name", "")
    if not name:
        raise CsvRowError(f"{where}: empty File Name")
    birads = _birads(row, "bi-rads", where, max(INBREAST_BIRADS))
    if birads is None:
        raise CsvRowError(f"{where}: empty Bi-Rads")
    label = INBREAST_BIRADS[birads]
    image = find_inbreast_dicom(base, name)
    if image is None:
        raise CsvRowError(f"{where}: no DICOM '{name}_*.dcm' under {base / 'AllDICOMs'} (or anywhere under {base})")
    patient = row.get("patient id", "")
    if patient.lower() in ("", "removed"):
        patient = inbreast_patient_id(image) or _dicom_fields(image).get("patient_id") or ""
    masks, notes = {}, []
    xml = find_inbreast_xml(base, name)
    if xml is not None:
        try:
            rois = read_inbreast_rois(xml)
        except ValueError as err:
            raise CsvRowError(f"{where}: {err}") from None
        if rois and label == [0, 0]:
            notes.append(f"{where}: BI-RADS 1 image with {len(rois)} outline(s) in {xml.name}: outlines ignored")
        elif rois:
            cls = LesionClass.MALIGNANT if label[1] else LesionClass.BENIGN
            masks[cls] = PolygonMask(xml, _image_shape(image), tuple(points for _, points in rois))
    return ParsedRow(
        image=image,
        label=label,
        fields=_image_fields(patient, row.get("laterality"), row.get("view", "")),
        masks=masks,
        notes=tuple(notes),
    )
