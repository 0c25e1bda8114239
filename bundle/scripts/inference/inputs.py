"""What an inference run reads: every input of a folder or a datalist split accounted for, a dataset that turns an
input it cannot read into an error record, and the loader."""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from monai.data import Dataset, MetaTensor

from ..data.datalist import load_datalist, resolve_paths
from ..data.readers import (
    SUPPORTED_SUFFIXES,
    MammogramReadError,
    file_format,
    not_a_mammogram,
)
from ..enums import Stage
from ..errors import UsageError
from ..handlers.throughput import LOAD_SECONDS_KEY
from ..transforms.mammo.coverage import breast_refusal
from .files import OUTPUT_FOLDERS
from .folder import RUN_RECORD
from .tables import ERROR_KEY, error_record

#: the reason of a file that is no image (errors.csv)
NO_IMAGE_FILE = "no image file (neither its suffix nor its first bytes are of a supported type)"


def item_path(item: Mapping[str, Any]) -> str:
    """The input file of an item, preprocessed (its ``MetaTensor``'s ``filename_or_obj``) or not."""
    image = item["image"]
    return str(image.meta.get("filename_or_obj", "")) if isinstance(image, MetaTensor) else str(image)


def _entry_error(path: str, problem: str) -> dict[str, str]:
    return error_record(path, MammogramReadError(f"{path}: {problem}", path=path, problem=problem))


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
    """Every entry under ``folder`` as an item, sorted by path, so that each one gets its row.

    Hidden entries, linked folders (a link could lead in a circle) and inference output folders are not searched.

    Args:
        folder: the input folder.
        exclude: the run's output folder, when it lies inside ``folder``.
    """
    excluded = {os.path.realpath(p) for p in exclude if str(p)}
    items: list[dict[str, str]] = []
    root = os.fspath(Path(folder))  # normalised as pathlib writes it: "x/a.png" for "./x/"
    if os.path.realpath(root) in excluded:  # the output folder is the input folder: its own sub-folders are not read
        excluded |= {os.path.realpath(os.path.join(root, name)) for name in OUTPUT_FOLDERS}
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
            named_like_input = entry.name.lower().endswith(tuple(SUPPORTED_SUFFIXES))
            if entry.is_dir(follow_symlinks=False):
                if os.path.realpath(entry.path) in excluded or os.path.isfile(os.path.join(entry.path, RUN_RECORD)):
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
    """The inputs to run on: the entries of ``input_dir``, or when it is empty the items of ``datalist[split]``.

    Raises:
        ValueError: naming the folder or the split when there is nothing to run on.
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


def root_cause(exc: BaseException) -> BaseException:
    """The first error in the chain that is not one of MONAI's "applying transform ..." wrappers."""
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
    """A ``Dataset`` whose items never raise: a bad input becomes ``{"image": path, "error": ...}``."""

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
    """Batch of :class:`SafeDataset` items -> ``{"image", "items", "errors", "load_s"}``."""
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
    """Images per batch: a number, a per-stage dict's ``joint`` value, or ``"auto"`` (8 on a GPU, 2 on CPUs)."""
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
    """This process's CPU cores: the node's divided among torchrun's processes on it, at least 1."""
    processes = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    return max(1, (cpus or os.cpu_count() or 2) // processes)


def loader_workers(num_workers: Any = "auto", cpus: int | None = None) -> int:
    """Loader processes: ``num_workers`` as a number; ``"auto"``: half of :func:`cores_per_process`, at most 8."""
    if str(num_workers).strip().lower() == "auto":
        return min(8, cores_per_process(cpus) // 2)
    return int(num_workers)
