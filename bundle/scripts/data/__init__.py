"""From files on disk to arrays: readers for every supported format, datalists, data checks."""

from .checks import DataCheckError, DataCheckReport, DataProblem, assert_datalist_ok, check_data, check_datalist
from .datalist import (
    DatalistError,
    check_patient_splits,
    load_datalist,
    save_datalist,
    split_by_patient,
)
from .dicom_files import read_dicom_header
from .readers import SUPPORTED_SUFFIXES, MammogramReader, MammogramReadError, read_mammogram

__all__ = [
    "SUPPORTED_SUFFIXES",
    "MammogramReader",
    "MammogramReadError",
    "read_mammogram",
    "read_dicom_header",
    "DatalistError",
    "load_datalist",
    "save_datalist",
    "split_by_patient",
    "check_patient_splits",
    "DataProblem",
    "DataCheckReport",
    "DataCheckError",
    "check_datalist",
    "assert_datalist_ok",
    "check_data",
]
