"""GLAM inference on a folder of mammograms or a datalist split: ``configs/inference.yaml``.

The submodules are imported here so that a config expression can name them after ``$import scripts.inference``.
"""

from . import dicom, files, folder, inputs, step, tables, writer

__all__ = ["dicom", "files", "folder", "inputs", "step", "tables", "writer"]
