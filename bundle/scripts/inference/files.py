"""What an inference run writes and where: the selection of outputs and their file names, one image's files staged
and put in place together with their manifest, and the names the inputs' stems start from."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..atomic import atomic_write, move_into_place, staged_path
from ..data.readers import SUPPORTED_SUFFIXES
from ..enums import CLASS_NAMES, MAP_NAMES, InferenceOutput, MapName
from ..errors import UsageError
from .dicom import DICOM_OUTPUT_MODES

# the folders of each kind of file under the output folder
MAPS_DIR, PANELS_DIR, DICOM_DIR = "maps", "panels", "dicom"
#: the folder of the per-image manifests (what :class:`StagedFiles` put in place)
MANIFESTS_DIR = "manifests"
#: the sub-folders a run writes into
OUTPUT_FOLDERS = (MAPS_DIR, PANELS_DIR, DICOM_DIR, MANIFESTS_DIR)
#: a manifest hashes this many bytes at the end of each file, so that a torn end is seen by reading one block
TAIL_BYTES = 4096
# a file name that says nothing of its image: digits only (TCIA's "1-1", an instance number, a DICOM UID)
_GENERIC_NAME = re.compile(r"^[0-9]+([-_.][0-9]+)*$")


@dataclass(frozen=True)
class OutputSelection:
    """What a run writes besides the tables: ``maps``, ``png``, ``panel`` and ``dicom`` (DICOM inputs)."""

    maps: tuple[str, ...] = (MapName.COMBINED.value,)
    png: bool = False
    panel: bool = True
    dicom: tuple[str, ...] = ()

    #: the names the ``outputs`` setting accepts
    NAMES = (*MAP_NAMES, *(o.value for o in InferenceOutput))

    @classmethod
    def parse(cls, outputs: str | Sequence[str] | None, dicom_outputs: str | None = "none") -> OutputSelection:
        """The selection from the ``outputs`` setting.

        Args:
            outputs: names from :attr:`NAMES`, a list or one comma-separated string.
            dicom_outputs: ``none | sc | map | both``: DICOM objects added.

        Raises:
            ValueError: naming an unknown name or value.
        """
        if outputs is None:
            names: list[str] = []
        elif isinstance(outputs, str):
            names = [n.strip() for n in outputs.split(",") if n.strip()]
        else:
            names = [str(n).strip() for n in outputs]
        unknown = sorted({n for n in names if n not in cls.NAMES})
        if unknown:
            raise UsageError(f"outputs: unknown {unknown}; choose from {list(cls.NAMES)}")
        key = "none" if dicom_outputs is None else str(dicom_outputs).strip().lower()
        if key not in DICOM_OUTPUT_MODES:
            raise UsageError(f"dicom_outputs must be one of {sorted(DICOM_OUTPUT_MODES)}, got {dicom_outputs!r}")
        dicom = set(DICOM_OUTPUT_MODES[key])
        dicom |= {"sc" for n in names if n == InferenceOutput.DICOM_SC} | {
            "map" for n in names if n == InferenceOutput.DICOM_MAP
        }
        maps = tuple(m for m in MAP_NAMES if m in names)
        if InferenceOutput.PNG in names and not maps:
            raise UsageError("outputs: 'png' writes the chosen maps as PNG too: name at least one map (e.g. S_c)")
        return cls(
            maps,
            InferenceOutput.PNG in names,
            InferenceOutput.PANEL in names,
            tuple(k for k in ("sc", "map") if k in dicom),
        )

    def names(self) -> list[str]:
        """The selection as the ``outputs`` setting writes it, for the run record."""
        out = [*self.maps]
        out += [InferenceOutput.PNG.value] if self.png else []
        out += [InferenceOutput.PANEL.value] if self.panel else []
        out += [{"sc": InferenceOutput.DICOM_SC, "map": InferenceOutput.DICOM_MAP}[k].value for k in self.dicom]
        return out

    def folders(self) -> list[str]:
        """The sub-folders this selection writes into (the manifests' whenever it writes a file)."""
        folders = [MAPS_DIR] * bool(self.maps) + [PANELS_DIR] * self.panel + [DICOM_DIR] * bool(self.dicom)
        return folders + [MANIFESTS_DIR] * bool(folders)

    def files(self, stem: str, dicom_input: bool) -> dict[str, str]:
        """``what -> relative path`` of one image's files: ``<map>``, ``<map>_<class>``, ``panel``, ``dicom_<kind>``."""
        files = {}
        for name in self.maps:
            files[name] = f"{MAPS_DIR}/{stem}_{name}.nii.gz"
            for cls in CLASS_NAMES if self.png else ():
                files[f"{name}_{cls}"] = f"{MAPS_DIR}/{stem}_{name}_{cls}.png"
        if self.panel:
            files[InferenceOutput.PANEL.value] = f"{PANELS_DIR}/{stem}_panel.png"
        for kind in self.dicom if dicom_input else ():
            files[f"dicom_{kind}"] = f"{DICOM_DIR}/{stem}_{kind}.dcm"
        return files

    def maps_needed(self) -> tuple[str, ...]:
        """The maps to bring back onto the file: those written, and S_c for a DICOM Segmentation."""
        needed = set(self.maps) | ({MapName.COMBINED.value} if "map" in self.dicom else set())
        return tuple(m for m in MAP_NAMES if m in needed)

    def needs_panel(self) -> bool:
        return self.panel or "sc" in self.dicom  # the Secondary Capture shows the panel

    def panel_maps(self) -> tuple[str, ...]:
        """The maps the panel shows: those written, S_c when none is."""
        return self.maps or (MapName.COMBINED.value,)

    def maps_on_file(self) -> tuple[str, ...]:
        """Every map to bring back onto the file: those needed and those the panel shows."""
        needed = set(self.maps_needed()) | (set(self.panel_maps()) if self.needs_panel() else set())
        return tuple(m for m in MAP_NAMES if m in needed)


def manifest_name(stem: str) -> str:
    """The manifest of the image with output stem ``stem``, relative to the output folder."""
    return f"{MANIFESTS_DIR}/{stem}.json"


def file_record(path: str | os.PathLike) -> dict[str, Any]:
    """What a manifest records of a file: its ``size`` and the SHA-256 of its last :data:`TAIL_BYTES`."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(max(0, size - TAIL_BYTES))
        tail = f.read()
    return {"size": size, "tail_sha256": hashlib.sha256(tail).hexdigest()}


def files_are_complete(root: str | os.PathLike, stem: str, files: Sequence[str]) -> bool:
    """Whether the image of ``stem`` has its ``files`` whole, as its manifest records them."""
    if not files:
        return True
    root = Path(root)
    try:
        recorded = json.loads((root / manifest_name(stem)).read_text(encoding="utf-8"))["files"]
        if not isinstance(recorded, dict) or set(recorded) != set(files):
            return False
        return all(file_record(root / name) == recorded[name] for name in files)
    except (OSError, ValueError, KeyError, TypeError):
        return False


class StagedFiles:
    """One image's files under ``root``, written to temporary names and put in place together by :meth:`commit`.

    Args:
        root: the output folder.
        manifest: the image's manifest (:func:`manifest_name`), written after the renames.
    """

    def __init__(self, root: str | os.PathLike, manifest: str | None = None) -> None:
        self.root = Path(root)
        self.manifest = manifest
        self._staged: list[tuple[Path, Path, str]] = []

    def path(self, relative: str) -> Path:
        """The temporary path to write ``relative``'s content to."""
        final = self.root / relative
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = staged_path(final)
        self._staged.append((tmp, final, relative))
        return tmp

    def commit(self) -> list[str]:
        """Rename every staged file into place, then write the manifest; returns their relative paths."""
        for tmp, final, _ in self._staged:
            move_into_place(tmp, final)
        done = [relative for _, _, relative in self._staged]
        self._staged = []
        if self.manifest is not None and done:
            record = {"files": {relative: file_record(self.root / relative) for relative in done}}
            with atomic_write(self.root / self.manifest, "w") as f:
                json.dump(record, f, indent=1, sort_keys=True)
        return done

    def discard(self) -> None:
        for tmp, _, _ in self._staged:
            tmp.unlink(missing_ok=True)
        self._staged = []


def bare_name(path: str) -> str:
    """A file's name without its supported suffix (``.nii.gz`` as one; another suffix is kept)."""
    name = os.path.basename(path)
    for suffix in sorted(SUPPORTED_SUFFIXES, key=len, reverse=True):  # ".nii.gz" before ".gz"
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def input_names(paths: Sequence[str]) -> dict[str, str]:
    """``path -> name`` an input's output stem starts from, led by the folders that tell same names apart."""
    bare = {path: bare_name(path) for path in paths}
    folders: dict[str, set[str]] = {}
    for path in paths:
        folders.setdefault(bare[path].casefold(), set()).add(os.path.dirname(path))
    names = {}
    for path in paths:
        shared = folders[bare[path].casefold()]
        base = None
        if len(shared) > 1:
            try:
                base = os.path.commonpath(sorted(shared))
            except ValueError:  # absolute and relative paths, or other drives: no common folder
                base = None
        elif _GENERIC_NAME.match(bare[path]):
            base = os.path.dirname(os.path.dirname(path))
        folder = os.path.dirname(path)
        relative = os.path.relpath(folder, base or os.curdir) if base is not None and folder else os.curdir
        lead = [] if relative == os.curdir else relative.split(os.sep)
        names[path] = "_".join([*lead, bare[path]])
    return names
