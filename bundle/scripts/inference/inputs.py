"""What an inference run reads: the inputs of a folder or a datalist split, every one of them accounted for, and the
dataset that turns an input that cannot be read into an error record instead of an exception.

- :func:`inference_items`: every entry of the input folder whose name looks like an image (a supported suffix) is an
  item: regular files (and links to them) to be read, and every other kind of entry with that name (a dangling link,
  a link loop, a folder, a FIFO, a folder that cannot be listed) as an item that carries its error, so that it gets
  its row in errors.csv like a file that fails to decode; a file of another name is read when its first bytes are an
  image's, else it is listed as skipped (no image file);
- :class:`SafeDataset`: loads and preprocesses an item, or returns the error record (timed: ``load_s``);
- :func:`collate_inference`: a batch of the good images stacked, the error records carried along.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from monai.data import DataLoader, Dataset

from ..data.datalist import load_datalist, resolve_paths
from ..data.readers import (
    DEFAULT_MAX_PIXELS,
    SUPPORTED_SUFFIXES,
    MammogramReader,
    MammogramReadError,
    file_format,
    not_a_mammogram,
)
from ..enums import Stage
from ..errors import UsageError
from ..handlers.throughput import LOAD_SECONDS_KEY
from ..networks.weights import as_flag
from .facts import breast_refusal
from .files import DICOM_DIR, MANIFESTS_DIR, MAPS_DIR, PANELS_DIR
from .tables import ERROR_KEY, error_record

__all__ = [
    "looks_like_an_input",
    "scan_input_folder",
    "inference_items",
    "inference_reader",
    "SafeDataset",
    "collate_inference",
    "root_cause",
    "batch_size_for",
    "cores_per_process",
    "loader_workers",
    "inference_loader",
]

# an inference output folder holds this record (folder.RUN_RECORD) and writes into these sub-folders
_RUN_RECORD = "run.json"
_OUTPUT_SUBFOLDERS = (MAPS_DIR, PANELS_DIR, DICOM_DIR, MANIFESTS_DIR)


def looks_like_an_input(name: str) -> bool:
    """Whether a directory entry's name has a supported image suffix (``SUPPORTED_SUFFIXES``, any case)."""
    lower = name.lower()
    return any(lower.endswith(s) for s in SUPPORTED_SUFFIXES)


def _entry_error(path: str, problem: str) -> dict[str, str]:
    return error_record(path, MammogramReadError(f"{path}: {problem}", path=path, problem=problem))


#: the reason of a file that is no image (errors.csv)
NO_IMAGE_FILE = "no image file (neither its suffix nor its first bytes are of a supported type)"


def _skipped(path: str) -> dict[str, str]:
    return error_record(path, not_a_mammogram(path, NO_IMAGE_FILE))


def _classify(entry: os.DirEntry) -> str | None:
    """None for an entry to read (a regular file, or a link to one); otherwise what is wrong with it."""
    try:
        st = os.stat(entry.path)  # follows links
    except FileNotFoundError:
        return f"broken symbolic link (its target {os.readlink(entry.path)!r} does not exist)"
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "symbolic link loop (the link points back to itself through other links)"
        return f"cannot be opened ({type(err).__name__}: {err.strerror or err})"
    link = "a symbolic link to " if entry.is_symlink() else ""
    if stat.S_ISREG(st.st_mode):
        return None
    if stat.S_ISDIR(st.st_mode):
        return f"{link}a folder, not an image file"
    kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device"
    return f"not a regular file ({link}{kind})"


def scan_input_folder(folder: str | os.PathLike, exclude: Sequence[str | os.PathLike] = ()) -> list[dict[str, str]]:
    """Every entry under ``folder`` whose name looks like an input, sorted by path: ``{"image": path}`` for a file to
    read, ``{"image": path, "error": "MammogramReadError: <path>: <problem>"}`` for any other entry with such a
    name; every other file is read when its first bytes are an image's (a DICOM export without a suffix), else
    listed as skipped (``"NotAMammogram: <path>: skipped, not a mammogram: no image file ..."``). Hidden entries (a
    name starting with ".") are skipped; real sub-folders are searched (a folder named like an image is both reported
    and searched), linked folders are not (a link could lead in a circle). A sub-folder that cannot be listed is
    itself an error item (what it holds cannot be known). Folders in ``exclude`` (the run's
    output folder, when it lies inside the input folder) are not searched, nor any folder holding a ``run.json`` (an
    inference run's output folder), nor, when ``folder`` itself is excluded (output folder = input folder), its
    ``maps``, ``panels`` and ``dicom`` sub-folders: a run must never take its own outputs for inputs."""
    excluded = {os.path.realpath(p) for p in exclude if str(p)}
    items: list[dict[str, str]] = []
    root = os.fspath(Path(folder))  # normalised as pathlib writes it: "x/a.png" for "./x/"
    if os.path.realpath(root) in excluded:  # the output folder is the input folder: its own sub-folders are not read
        excluded |= {os.path.realpath(os.path.join(root, name)) for name in _OUTPUT_SUBFOLDERS}
    pending = [root]
    while pending:
        current = pending.pop()
        at_output_root = current == root and os.path.realpath(root) in excluded  # its own tables are no inputs
        try:
            with os.scandir(current) as listing:
                entries = list(listing)
        except OSError as err:
            if current == root:
                raise
            items.append(_entry_error(current, f"folder cannot be listed ({type(err).__name__}: {err.strerror})"))
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue
            named_like_input = looks_like_an_input(entry.name)
            if entry.is_dir(follow_symlinks=False):
                if os.path.realpath(entry.path) in excluded or os.path.isfile(os.path.join(entry.path, _RUN_RECORD)):
                    continue  # this run's output folder, or another inference run's (it holds a run.json)
                pending.append(entry.path)
                if named_like_input:
                    items.append(_entry_error(entry.path, "a folder, not an image file (its contents are searched)"))
                continue
            if not named_like_input:
                if at_output_root or not entry.is_file():
                    continue
                if file_format(entry.path) is None:  # a file whose first bytes are an image's is read (DICOM exports)
                    items.append(_skipped(entry.path))
                    continue
            problem = _classify(entry)
            items.append({"image": entry.path} if problem is None else _entry_error(entry.path, problem))
    return sorted(items, key=lambda item: item["image"])


def inference_items(
    input_dir: str | os.PathLike | None = None,
    datalist: str | os.PathLike | Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    split: str = "test",
    output_dir: str | os.PathLike | None = None,
) -> list[dict[str, Any]]:
    """The inputs to run on: every entry under ``input_dir`` that looks like an input (:func:`scan_input_folder`,
    the odd ones carrying their error; ``output_dir`` is not searched), or, when ``input_dir`` is empty, the items of
    ``datalist[split]``: a datalist file (its relative paths taken from its folder; ``""``: none) or its content
    with the paths already resolved.

    Raises ``ValueError`` naming the folder or the split when there is nothing to run on.
    """
    if isinstance(datalist, (str, os.PathLike)):
        given = str(datalist)
        datalist = resolve_paths(load_datalist(given), os.path.dirname(os.path.abspath(given))) if given else None
    if (input_dir is None or str(input_dir) == "") and datalist is not None:
        if split not in datalist:
            raise UsageError(f"datalist has no split {split!r} (splits: {sorted(datalist)})")
        items = [dict(item) for item in datalist[split]]
        if not items:
            raise UsageError(f"datalist split {split!r} is empty")
        return items
    if input_dir is None or str(input_dir) == "":
        raise UsageError("give input_dir (a folder of mammograms) or datalist")
    folder = Path(input_dir)
    if not folder.is_dir():
        raise UsageError(f"input_dir {str(folder)!r} is not a folder")
    items = scan_input_folder(folder, exclude=[output_dir] if output_dir else [])
    if all(NO_IMAGE_FILE in item.get(ERROR_KEY, "") for item in items):
        raise UsageError(f"input_dir {str(folder)!r} holds no file of a supported type {SUPPORTED_SUFFIXES}")
    return items


def inference_reader(
    apply_voi: bool = True,
    accept_non_mammography: bool = False,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    window: Sequence[int] | None = None,
    pixel_spacing: float | Sequence[float] | None = None,
) -> MammogramReader:
    """The reader of inference's images: :class:`~scripts.data.readers.MammogramReader` with ``apply_voi``. A file
    that is not a mammogram is skipped by the reader (an errors.csv row naming the reason: a DICOM of another
    modality, a binary image such as a lesion mask, an image too small for the model's ``window`` at its
    ``pixel_spacing``, :func:`~scripts.data.readers.pixel_kind_problem`) unless ``accept_non_mammography``; a file
    whose header states more than ``max_pixels`` pixels is refused before it is decoded (None: no cap)."""
    accept = as_flag(accept_non_mammography, "accept_non_mammography")
    return MammogramReader(
        apply_voi=bool(apply_voi),
        accept_non_mammography=accept,
        max_pixels=None if max_pixels is None else int(max_pixels),
        kind_checks=not accept,
        window=window,
        model_spacing=pixel_spacing,
    )


def root_cause(exc: BaseException) -> BaseException:
    """The first error in the chain that is not one of MONAI's "applying transform ..." wrappers (the reader's
    own message, e.g. a ``MammogramReadError`` naming the file and the problem)."""
    seen = set()
    while (
        isinstance(exc, RuntimeError)
        and "applying transform" in str(exc)
        and exc.__cause__ is not None
        and id(exc) not in seen
    ):
        seen.add(id(exc))
        exc = exc.__cause__
    return exc


class SafeDataset(Dataset):
    """A ``Dataset`` whose items never raise: an input that fails to load or preprocess, whose model window misses the
    breast (:func:`~.facts.breast_refusal`), or that arrives with an error (an odd folder entry), becomes ``{"image":
    path, "error": "<ExceptionType>: <message>"}``, so one bad file does not stop the run. Every item carries
    ``load_s``, the seconds it took."""

    def _transform(self, index: int) -> Any:
        start = time.perf_counter()
        item = self.data[index]
        if isinstance(item, Mapping) and item.get(ERROR_KEY):
            out: Any = {"image": str(item["image"]), ERROR_KEY: str(item[ERROR_KEY])}
        else:
            path = item.get("image") if isinstance(item, Mapping) else item
            try:
                out = super()._transform(index)
            except Exception as exc:  # noqa: BLE001 - every failure becomes an error record, by design
                out = error_record(path, root_cause(exc))
            refusal = breast_refusal(out) if isinstance(out, dict) and ERROR_KEY not in out else None
            if refusal:  # a window that misses the breast is no prediction
                out = error_record(path, refusal)
        if isinstance(out, dict):
            out[LOAD_SECONDS_KEY] = time.perf_counter() - start
        return out


def collate_inference(items: Sequence[Mapping[Hashable, Any]]) -> dict[str, Any]:
    """Batch of :class:`SafeDataset` items -> ``{"image": (B, 1, H, W) tensor or None, "items": [good items],
    "errors": [error records], "load_s": seconds}``. Good items keep their ``MetaTensor`` (with the applied
    operations to invert) and whatever the preprocessing added (the thumbnails)."""
    good = [d for d in items if ERROR_KEY not in d]
    errors = [{"image": d["image"], ERROR_KEY: d[ERROR_KEY]} for d in items if ERROR_KEY in d]
    image = torch.stack([torch.as_tensor(d["image"]) for d in good]) if good else None
    return {
        "image": image,
        "items": good,
        "errors": errors,
        LOAD_SECONDS_KEY: float(sum(d.get(LOAD_SECONDS_KEY, 0.0) for d in items)),
    }


def batch_size_for(batch_size: Any = "auto", device: torch.device | str = "cpu") -> int:
    """Images per batch: ``batch_size`` as a number; a training preset's per-stage dict (``{global: 8, ...}``): its
    ``joint`` value; ``"auto"``: 8 on a GPU, 2 on CPUs (``device``'s type)."""
    if isinstance(batch_size, Mapping):
        if Stage.JOINT not in batch_size:
            raise UsageError(
                f"batch_size: a per-stage dict needs a '{Stage.JOINT.value}' value for inference: {dict(batch_size)}"
            )
        batch_size = batch_size[Stage.JOINT]
    if str(batch_size).strip().lower() == "auto":
        return 8 if torch.device(device).type == "cuda" else 2
    return int(batch_size)


def cores_per_process(cpus: int | None = None) -> int:
    """The CPU cores of this process: the node's (``cpus``, default ``os.cpu_count()``) divided among the processes
    ``torchrun`` started on it (``LOCAL_WORLD_SIZE``; 1 without torchrun), at least 1."""
    processes = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    return max(1, (cpus or os.cpu_count() or 2) // processes)


def loader_workers(num_workers: Any = "auto", cpus: int | None = None) -> int:
    """Processes reading and preprocessing the inputs: ``num_workers`` as a number; ``"auto"``: half the CPU cores
    (``cpus``, default ``os.cpu_count()``; under torchrun this process's part of them, :func:`cores_per_process`),
    at most 8."""
    if str(num_workers).strip().lower() == "auto":
        return min(8, cores_per_process(cpus) // 2)
    return int(num_workers)


def inference_loader(
    dataset: Dataset, batch_size: Any = "auto", num_workers: Any = "auto", device: torch.device | str = "cpu"
) -> DataLoader:
    """MONAI's ``DataLoader`` over ``dataset`` in order, batched by :func:`collate_inference`, with
    :func:`batch_size_for` and :func:`loader_workers`."""
    return DataLoader(
        dataset,
        batch_size=batch_size_for(batch_size, device),
        shuffle=False,
        num_workers=loader_workers(num_workers),
        collate_fn=collate_inference,
    )
