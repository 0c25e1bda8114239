"""CSV layouts ("flavours") a datalist can be built from: one row parser per flavour, behind a registry.

A parser turns one CSV row into a :class:`ParsedRow` (the image, its label, patient/laterality/view and the row's
ROI masks); :func:`scripts.data.datalist.items_from_csv` reads the CSV, picks the parser whose signature columns
the header has (:func:`find_datalist_parser`) and merges the rows of one image. Parsers register themselves with
:func:`register_datalist_parser`; a new layout needs one decorated function and nothing else::

    @register_datalist_parser("my-layout", signature=["file", "diagnosis"], columns="file, diagnosis")
    def parse_my_layout_row(row, where, base):
        ...

MONAI's ``ComponentStore`` would be the idiom, but it only accepts Python identifiers as names ("cbis-ddsm" is
not one) and cannot unregister, hence a plain dict.

Rows reach parsers keyed by normalised column names (:func:`normalise_column`: case, surrounding spaces and
underscores ignored, so ``Image_ID`` arrives as ``image id``) with stripped text values ("" when empty).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..enums import CLASS_NAMES, LesionClass

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


class CsvRowError(ValueError):
    """A row that cannot become an item; ``items_from_csv`` leaves it out and lists the message (which names the
    row) among its problems."""


@dataclass(frozen=True)
class ParsedRow:
    """What one CSV row says about one image."""

    image: Path
    label: list[int] | None  # [benign, malignant]; None: unknown
    fields: dict[str, str | None]  # patient_id, laterality, view; an empty value means "not given"
    masks: dict[str, Path] = field(default_factory=dict)  # lesion class -> this row's ROI mask of that class


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
            raise ValueError(f"a datalist parser named {name!r} is already registered")
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


def _birads(value: Any) -> int | None:
    """The BI-RADS category of "BI-RADS 4A"-like text (its first digit), None when there is none."""
    digits = "".join(ch for ch in str(value or "") if ch.isdigit())
    return int(digits[0]) if digits else None


def _binary(value: Any, where: str) -> int | None:
    v = str(value if value is not None else "").strip().lower()
    if v in ("", "nan", "none", "null", "unknown"):
        return None
    if v in ("0", "0.0", "false", "no"):
        return 0
    if v in ("1", "1.0", "true", "yes"):
        return 1
    raise CsvRowError(f"{where}: label must be 0/1 (or empty for unknown), got {value!r}")


def _image_fields(patient_id: str, laterality: Any, view: str) -> dict[str, str | None]:
    """The item fields every layout gives, in item key order; the view is upper-cased ("cc" -> "CC")."""
    return {"patient_id": patient_id, "laterality": _laterality(laterality), "view": view.upper() or None}


# ------------------------------------------------------------------------------------------------------------
# the flavours; registration order is the order users see them listed in
# ------------------------------------------------------------------------------------------------------------
@register_datalist_parser(
    "generic",
    signature=["image"],
    columns="image, patient_id, laterality, view, label_benign, label_malignant, mask_benign, mask_malignant",
)
def parse_generic_row(row: CsvRow, where: str, base: Path) -> ParsedRow:
    """The project's own layout, one row per image (repeated rows of an image are merged).

    Columns: ``image`` (path, required); ``patient_id``; ``laterality`` (L/R/left/right); ``view``;
    ``label_benign`` and ``label_malignant`` (0/1, true/false, yes/no; empty, nan, none, null or unknown means
    unknown, and one unknown value makes the whole label unknown); ``mask_benign`` and ``mask_malignant`` (paths).
    """
    if not row.get("image"):
        raise CsvRowError(f"{where}: empty image path")
    label = [_binary(row.get(f"label {cls}"), where) for cls in CLASS_NAMES]
    return ParsedRow(
        image=base / row["image"],
        label=None if None in label else label,
        fields=_image_fields(row.get("patient id", ""), row.get("laterality"), row.get("view", "")),
        masks={cls: base / row[f"mask {cls}"] for cls in CLASS_NAMES if row.get(f"mask {cls}")},
    )


def _cbis_label(pathology: str, where: str) -> list[int]:
    pathology = pathology.upper()
    if pathology.startswith("MALIGNANT"):
        return [0, 1]
    if pathology.startswith("BENIGN"):  # BENIGN_WITHOUT_CALLBACK too
        return [1, 0]
    raise CsvRowError(f"{where}: pathology must be BENIGN, BENIGN_WITHOUT_CALLBACK or MALIGNANT")


@register_datalist_parser(
    "cbis-ddsm",
    signature=["image file path", "pathology"],
    columns="patient_id, left or right breast, image view, pathology, image file path, ROI mask file path",
)
def parse_cbis_ddsm_row(row: CsvRow, where: str, base: Path) -> ParsedRow:
    """CBIS-DDSM's case description CSVs: one row per abnormality, so an image has as many rows as lesions.

    Columns: ``image file path`` (required); ``pathology`` (BENIGN, BENIGN_WITHOUT_CALLBACK or MALIGNANT; other
    values leave the row out); ``patient_id``; ``left or right breast``; ``image view``; ``ROI mask file path``
    (the abnormality's mask, a mask of the row's class).
    """
    label = _cbis_label(row.get("pathology", ""), where)
    lesion = LesionClass.MALIGNANT if label[1] else LesionClass.BENIGN
    roi = row.get("roi mask file path", "")
    return ParsedRow(
        image=base / row["image file path"],
        label=label,
        fields=_image_fields(row.get("patient id", ""), row.get("left or right breast"), row.get("image view", "")),
        masks={lesion: base / roi} if roi else {},
    )


@register_datalist_parser(
    "vindr-mammo",
    signature=["study id", "image id"],
    columns="study_id, image_id, laterality, view_position, breast_birads (finding_birads optional)",
)
def parse_vindr_mammo_row(row: CsvRow, where: str, base: Path) -> ParsedRow:
    """VinDr-Mammo's annotation CSVs; images are ``images/<study_id>/<image_id>.dicom`` under the root.

    Columns: ``study_id`` and ``image_id`` (required; the study is the patient); ``laterality``;
    ``view_position``; ``breast_birads`` and/or ``finding_birads`` (at least one). VinDr has no pathology, so
    the label is a BI-RADS proxy on the higher category: 1 normal, 2-3 benign, 4-5 malignant (suspicious).
    """
    study, image_id = row.get("study id", ""), row.get("image id", "")
    if not study or not image_id:
        raise CsvRowError(f"{where}: study_id and image_id are required")
    scores = [b for b in (_birads(row.get("breast birads")), _birads(row.get("finding birads"))) if b]
    if not scores:
        raise CsvRowError(f"{where}: no BI-RADS category in breast_birads/finding_birads")
    top = max(scores)
    return ParsedRow(
        image=base / "images" / study / f"{image_id}.dicom",
        label=[int(top in (2, 3)), int(top >= 4)],
        fields=_image_fields(study, row.get("laterality"), row.get("view position", "")),
    )
