"""GLAM inference on a folder of mammograms or a datalist split: ``configs/inference.yaml``.

The way in: :mod:`.inputs` (the items, the reader, the loader), :mod:`.folder` (the output folder: run record,
resume, the plan), :mod:`.step` (the evaluator's iteration). The way out, one image after the other in the writer
threads of :mod:`.writer`: :mod:`.geometry` (back onto the file) -> :mod:`.facts` (what it was read as) ->
:mod:`.maps` (NIfTI / PNG maps) -> :mod:`.panel` -> :mod:`.dicom` -> :mod:`.tables` (predictions.csv, errors.csv);
:mod:`.files` names what a run writes and stages one image's files. :mod:`.ranks`: the same over many processes
under torchrun (``configs/multi_gpu_inference.yaml``).

The submodules are imported here so that a config expression can name them after ``$import scripts.inference``.
"""

from . import dicom, facts, files, folder, geometry, inputs, maps, panel, ranks, step, tables, writer

__all__ = [
    "dicom",
    "facts",
    "files",
    "folder",
    "geometry",
    "inputs",
    "maps",
    "panel",
    "ranks",
    "step",
    "tables",
    "writer",
]
