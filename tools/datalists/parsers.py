"""CSV layouts ("flavours") a datalist can be built from: one row parser per flavour, in a registry.

A new layout is one decorated function::

    @register_datalist_parser("my-layout", signature=["file", "diagnosis"], columns="file, diagnosis")
    def parse_my_layout_row(row, where, base):
        ...

A dict, not MONAI's ``ComponentStore``: that one accepts only identifiers as names and cannot unregister. Rows reach
parsers keyed by :func:`normalise_column` names with stripped text values. INbreast's DICOM names and XML (OsiriX
plist) outlines are read here too: images ``AllDICOMs/<File Name>_<hash>_MG_<side>_<view>_ANON.dcm``, the hash one
per woman; outlines ``AllXML/<File Name>.xml``, ``Images[].ROIs[].Point_px`` as "(x, y)" strings.
"""

from __future__ import annotations

import plistlib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scripts.data.boxes import parse_boxes
from scripts.data.errors import CsvRowError
from scripts.data.geometry import stated_spacing_ok
from scripts.enums import CLASS_NAMES, LesionClass

__all__ = [
    "CsvRow",
    "CsvRowError",
    "ParsedRow",
    "RowParser",
    "DatalistParser",
    "DATALIST_PARSERS",
    "FOLDER_LABELS",
    "CSV_FLAVOURS",
    "register_datalist_parser",
    "unregister_datalist_parser",
    "find_datalist_parser",
    "normalise_column",
    "INBREAST_BIRADS",
    "PolygonMask",
    "read_inbreast_rois",
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
    """Decorator registering a row parser as flavour ``name``.

    Args:
        name: the flavour's name.
        signature: the columns a header must have to be of this layout.
        columns: the layout's columns, as users are told them.
    """

    def register(parse: RowParser) -> RowParser:
        if name in DATALIST_PARSERS:
            raise ValueError(f"a datalist parser named {name!r} is already registered")
        sig = frozenset(normalise_column(c) for c in signature)
        DATALIST_PARSERS[name] = DatalistParser(name, sig, columns, parse)
        return parse

    return register


def unregister_datalist_parser(name: str) -> DatalistParser:
    """Remove flavour ``name`` from the registry and return its entry."""
    return DATALIST_PARSERS.pop(name)


def find_datalist_parser(columns: Iterable[str]) -> DatalistParser | None:
    """The parser whose signature the header ``columns`` contain, or None; the largest signature wins, then
    registration."""
    cols = {normalise_column(c) for c in columns}
    matching = [p for p in DATALIST_PARSERS.values() if p.signature <= cols]
    return max(matching, key=lambda p: len(p.signature), default=None)


class _FlavourColumns(Mapping[str, str]):
    """Flavour name -> description of its columns, read live from the registry."""

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
    """The BI-RADS category of a ``column`` cell ("BI-RADS 4", "4", "4a"), None when empty.

    Raises:
        CsvRowError: for another letter or a category outside 1 to ``highest``: a guess would make "BI-RADS 7"
            malignant.
    """
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
    """A row's ``{"label", "box"}`` from its four coordinate ``columns`` (y0, x0, y1, x1), None when all are empty.

    Raises:
        CsvRowError: naming ``where``, for a missing coordinate or a box :func:`parse_boxes` refuses.
    """
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
    """The item fields every layout gives, in item key order, the view upper-cased."""
    fields = {"patient_id": patient_id, "laterality": _laterality(laterality), "view": view.upper() or None}
    if official_split:
        fields["official_split"] = official_split
    return fields


def parse_spacing(value: Any, where: str) -> float | tuple[float, float] | None:
    """A pixel spacing cell or option in mm: "0.05", "0.05 0.06", "0.05,0.06" or "0.05x0.06" (row, col); empty: None.

    Raises:
        CsvRowError: naming ``where``, for anything else or a value out of (0, 10) mm.
    """
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
    """patient_id, laterality and view from a DICOM header; {} for other or unreadable files."""
    from scripts.data.dicom_files import read_dicom_header
    from scripts.data.header_facts import cbis_patient_id
    from scripts.data.readers import DICOM_SUFFIXES

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
    """The project's own layout, one row per image or per box.

    Columns: ``image`` (required), ``patient_id``, ``laterality``, ``view``, ``label_benign`` / ``label_malignant``
    (0/1; one unknown makes the label unknown), ``mask_benign`` / ``mask_malignant``, ``pixel_spacing`` (mm),
    ``box_y0``, ``box_x0``, ``box_y1``, ``box_x1``, ``box_label`` (one box in the image file's pixels).
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


# folder name (lower case) -> [benign, malignant], for a hospital folder sorted by class
FOLDER_LABELS = {
    "normal": [0, 0],
    "negative": [0, 0],
    LesionClass.BENIGN.value: [1, 0],
    LesionClass.MALIGNANT.value: [0, 1],
    "cancer": [0, 1],
}
_CLASS_WORDS = {**FOLDER_LABELS, f"{LesionClass.BENIGN.value}+{LesionClass.MALIGNANT.value}": [1, 1]}


@register_datalist_parser("path-label", signature=["path", "label"], columns="path, label, patient_id (optional)")
def parse_path_label_row(row: CsvRow, where: str, base: Path) -> ParsedRow:
    """A hospital export, one row per image; laterality and view come from the DICOM header.

    Columns: ``path`` (required); ``label``: normal, negative, benign, malignant, cancer, benign+malignant or empty
    (unknown); ``patient_id`` (else the DICOM's PatientID, else the image is its own patient).
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
    from scripts.data.dicom_files import read_dicom_header
    from scripts.data.readers import DICOM_SUFFIXES, read_mammogram

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
    """CBIS-DDSM's case description CSVs, one row per abnormality; the official split is kept, the spacing is the
    preset's.

    Columns: ``image file path`` (required; else resolved in the TCIA download, :mod:`datalists.cbis_ddsm`),
    ``pathology`` (MALIGNANT, BENIGN, BENIGN_WITHOUT_CALLBACK), ``patient_id``, ``left or right breast``, ``image
    view``, ``ROI mask file path`` and ``cropped image file path`` (the mask is looked for under both: the CSV swaps
    them).
    """
    from scripts.data.header_facts import parse_case_folder

    from .cbis_ddsm import CBIS_PIXEL_SPACING_MM, _uid_parts, resolve_cbis_image, resolve_cbis_roi

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
    """VinDr-Mammo's annotation CSVs; images are ``images/<study_id>/<image_id>.dicom``, the study is the patient.

    Columns: ``study_id``, ``image_id``, ``laterality``, ``view_position``, ``breast_birads`` / ``finding_birads``,
    ``split`` (the official split, kept), ``xmin``, ``ymin``, ``xmax``, ``ymax``. VinDr has no pathology: the label is
    the BI-RADS proxy of the higher category; a box takes its finding's class (left out, noted, for BI-RADS 1) and adds
    it to the label.
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


# BI-RADS category (first digit of "4a", "4b", ...) -> [benign, malignant]: 1 negative (no lesion), 2-3 benign
# (3: probably benign), 4-6 malignant (4-5 suspicious, 6 biopsy-proven); a proxy, INbreast has no pathology for most
INBREAST_BIRADS = {1: [0, 0], 2: [1, 0], 3: [1, 0], 4: [0, 1], 5: [0, 1], 6: [0, 1]}

_NAME = re.compile(r"^(?P<file>\d+)_(?P<hash>[0-9a-fA-F]+)_MG_(?P<side>[LR])_(?P<view>[A-Z]+)", re.IGNORECASE)
_POINT = re.compile(r"\(\s*([-+0-9.eE]+)\s*,\s*([-+0-9.eE]+)\s*(?:,\s*[-+0-9.eE]+\s*)?\)")


@dataclass(frozen=True)
class PolygonMask:
    """Lesion outlines to rasterise at an image's size: polygons of (x = column, y = row) pixel coordinates."""

    source: Path
    shape: tuple[int, int]  # (H, W) of the image
    polygons: tuple[tuple[tuple[float, float], ...], ...]

    def rasterise(self) -> np.ndarray:
        """(H, W) bool: every polygon filled, its outline included; one point marks its pixel, two a line."""
        from PIL import Image, ImageDraw

        canvas = Image.new("L", (self.shape[1], self.shape[0]), 0)
        draw = ImageDraw.Draw(canvas)
        for poly in self.polygons:
            pts = [(float(x), float(y)) for x, y in poly]
            if len(pts) >= 3:
                draw.polygon(pts, fill=1, outline=1)
            elif len(pts) == 2:
                draw.line(pts, fill=1, width=1)
            elif pts:
                draw.point(pts, fill=1)
        return np.asarray(canvas, dtype=np.uint8) > 0


def find_inbreast_dicom(root: Path, file_name: str) -> Path | None:
    """``<root>/AllDICOMs/<file_name>_*.dcm`` (else anywhere under ``root``); None when there is none."""
    folder = root / "AllDICOMs"
    for base, pattern in ((folder, f"{file_name}_*.dcm"), (root, f"**/{file_name}_*.dcm")):
        if base.is_dir():
            found = sorted(base.glob(pattern))
            if found:
                return found[0]
    return None


def inbreast_patient_id(path: Path) -> str | None:
    """The woman's hash from an INbreast file name (``22678622_61b13c59bcba149e_MG_R_CC_ANON.dcm``), else None."""
    m = _NAME.match(path.name)
    return None if m is None else m["hash"].lower()


def find_inbreast_xml(root: Path, file_name: str) -> Path | None:
    """``<root>/AllXML/<file_name>.xml`` (else anywhere under ``root``); None when the image has no annotation."""
    direct = root / "AllXML" / f"{file_name}.xml"
    if direct.is_file():
        return direct
    found = sorted(root.glob(f"**/{file_name}.xml")) if root.is_dir() else []
    return found[0] if found else None


def read_inbreast_rois(xml_path: Path) -> list[tuple[str, tuple[tuple[float, float], ...]]]:
    """``[(roi name, ((x, y), ...)), ...]`` of an INbreast XML.

    Raises:
        ValueError: naming the file, when it is not one.
    """
    try:
        with open(xml_path, "rb") as fh:
            plist = plistlib.load(fh)
    except Exception as err:  # not a plist, truncated, ...
        raise ValueError(f"{xml_path}: not an INbreast XML annotation ({type(err).__name__}: {err})") from None
    images = plist.get("Images") if isinstance(plist, dict) else None
    if not isinstance(images, list):
        raise ValueError(f"{xml_path}: no 'Images' array (expected an OsiriX ROI plist)")
    rois = []
    for image in images:
        for roi in image.get("ROIs", []) or []:
            points = []
            for text in roi.get("Point_px", []) or []:
                m = _POINT.fullmatch(str(text).strip())
                if m is None:
                    raise ValueError(f"{xml_path}: ROI {roi.get('Name')!r}: unreadable point {text!r}")
                points.append((float(m[1]), float(m[2])))
            if points:
                rois.append((str(roi.get("Name", "")), tuple(points)))
    return rois


@register_datalist_parser(
    "inbreast",
    signature=["file name", "bi-rads"],
    columns="Patient ID;Patient age;Laterality;View;Acquisition date;File Name;ACR;Bi-Rads (';'-separated)",
)
def parse_inbreast_row(row: CsvRow, where: str, base: Path) -> ParsedRow:
    """INbreast's ``INbreast.csv``; images ``AllDICOMs/<File Name>_*.dcm``, outlines ``AllXML/<File Name>.xml``.

    Columns: ``File Name``, ``Bi-Rads`` (the label by :data:`INBREAST_BIRADS`), ``Laterality``, ``View``, ``Patient ID``
    (else the hash in the file name: the CSV's reads "removed"). Every outline goes into the mask of the image's class;
    a BI-RADS 1 image's are ignored (noted).
    """
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
