"""GLAM inference on a folder of mammograms or a datalist split (``configs/inference.yaml``), and over many processes
under torchrun (``configs/multi_gpu_inference.yaml``).

The submodules are imported here so that a config expression can name them after ``$import scripts.inference``.
"""

from . import dicom, facts, files, folder, inputs, maps, panel, ranks, step, tables, writer

__all__ = ["dicom", "facts", "files", "folder", "inputs", "maps", "panel", "ranks", "step", "tables", "writer"]
