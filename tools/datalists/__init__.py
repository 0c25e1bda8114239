"""Datalist makers of ``tools/make_datalist.py``: the CSV layouts of known archives (CBIS-DDSM, VinDr-Mammo, INbreast,
generic), folder and DICOM-folder scans, and the split that keeps an archive's official test set.

Importable as ``datalists`` with ``tools/`` on ``sys.path`` and the bundle folder before it (``import scripts`` is
the bundle's package, which reads the files and writes the datalist).
"""

from .builders import (
    OFFICIAL_SPLIT_KEY,
    detect_csv_flavour,
    items_from_csv,
    items_from_dicom_dir,
    items_from_folder,
    path_for_datalist,
    split_choices,
    split_items,
    unique_boxes,
)
from .parsers import (
    CSV_FLAVOURS,
    DATALIST_PARSERS,
    FOLDER_LABELS,
    ParsedRow,
    register_datalist_parser,
    unregister_datalist_parser,
)

__all__ = [
    "CSV_FLAVOURS",
    "DATALIST_PARSERS",
    "FOLDER_LABELS",
    "OFFICIAL_SPLIT_KEY",
    "ParsedRow",
    "detect_csv_flavour",
    "items_from_csv",
    "items_from_dicom_dir",
    "items_from_folder",
    "path_for_datalist",
    "register_datalist_parser",
    "split_choices",
    "split_items",
    "unique_boxes",
    "unregister_datalist_parser",
]
