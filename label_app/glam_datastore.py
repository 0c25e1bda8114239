"""MONAI Label's local datastore, confined to the studies folder.

``LocalDatastore`` joins request ids and tags into paths and follows any link; :class:`GLAMDatastore` checks every
id and tag (:func:`glam_safety.check_name`) and decides reads, writes and deletes on the resolved path: writes are
renamed into place, never through a link; deletes unlink regular files only; reads follow only the server user's
own links and hand out paths inside the folder; names no JSON answer can hold are left out of the listings.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from filelock import FileLock
from glam_safety import (
    MAX_NAME_LENGTH,
    RequestRefused,
    check_name,
    deletable_path,
    invisible_characters,
    is_inside,
    is_utf8,
    readable_path,
    shown_name,
    writable_path,
)
from monailabel.datastore.local import DataModel, ImageLabelModel, LocalDatastore
from monailabel.interfaces.datastore import DefaultLabelTag
from monailabel.interfaces.exception import ImageNotFoundException, LabelNotFoundException

from scripts.atomic import atomic_write

logger = logging.getLogger(__name__)


class GLAMDatastore(LocalDatastore):
    """A ``LocalDatastore`` whose ids, tags and paths stay in ``datastore_path`` (module docstring).

    Args:
        datastore_path, extensions, kwargs: as ``LocalDatastore``.
        uploads_dir: the app's upload folder: its files handed to :meth:`add_image` or :meth:`save_label` are
            removed afterwards, whatever the outcome.
    """

    def __init__(
        self,
        datastore_path: str,
        extensions: Sequence[str] = ("*.nii.gz", "*.nii"),
        uploads_dir: str | os.PathLike | None = None,
        **kwargs: Any,
    ) -> None:
        self.root = os.path.realpath(datastore_path)
        self.file_types = tuple(e.replace("*", "") for e in extensions)
        self.uploads_dir = os.path.realpath(uploads_dir) if uploads_dir else None
        self._reported: set[tuple[str, str]] = set()
        self._ambiguous: dict[str, list[str]] = {}
        self._archive: str | None = None
        for name in ("datastore_v2.json", ".lock"):  # written on every change: never through a link
            writable_path(self.root, name, f"the datastore's {name}")
        for name in ("labels", "labels/final", "labels/original"):  # LocalDatastore creates them at start
            if not is_inside(self.root, os.path.realpath(os.path.join(self.root, name))):
                raise ValueError(
                    f"studies folder {self.root}: {name} is a symbolic link that leads outside it; the server writes "
                    "only inside the studies folder (make it a folder)"
                )
        super().__init__(self.root, extensions=list(extensions), **kwargs)
        self._drop_records_outside()

    def _file_type(self, filename: str, what: str) -> str:
        _, ext = self._to_id(os.path.basename(filename))
        if ext not in self.file_types:
            kind = repr(ext) if ext else "without extension"
            raise RequestRefused(f"{what} of type {kind}: the datastore keeps {list(self.file_types)}")
        return ext

    def _image_file(self, image_id: str, ext: str) -> str:
        return os.path.join(self._datastore.image_path(), image_id + ext)

    def _label_file(self, image_id: str, tag: str, ext: str) -> str:
        return os.path.join(self._datastore.label_path(tag), image_id + ext)

    def _record_is_inside(self, folder: str, name: str, ext: str) -> bool:
        try:
            check_name(name, "name")
        except RequestRefused:
            return False
        return (
            "/" not in ext
            and "\\" not in ext
            and is_utf8(ext)
            and is_inside(self.root, os.path.join(folder, name + ext))
        )

    def _drop_records_outside(self) -> None:
        """Forget records of an older datastore file whose id, tag or extension leads out of the folder."""
        objects = self._datastore.objects
        dropped = [
            i
            for i, obj in objects.items()
            if not self._record_is_inside(self._datastore.image_path(), i, obj.image.ext)
        ]
        for image_id in dropped:
            del objects[image_id]
        for image_id, obj in objects.items():
            for tag in [t for t, lab in obj.labels.items() if not self._label_record_is_inside(image_id, t, lab.ext)]:
                del obj.labels[tag]
                dropped.append(f"{image_id} (label {tag!r})")
        if dropped:
            logger.warning(
                "datastore: dropped records that lead outside %s: %s", self.root, [shown_name(d) for d in dropped]
            )
            self._update_datastore_file()

    def _label_record_is_inside(self, image_id: str, tag: str, ext: str) -> bool:
        try:
            check_name(tag, "tag")
        except RequestRefused:
            return False
        return self._record_is_inside(self._datastore.label_path(tag), image_id, ext)

    def _discard_upload(self, filename: str) -> None:
        """Remove ``filename`` if it is an upload MONAI Label wrote to the app's temporary folder."""
        if not self.uploads_dir or not isinstance(filename, str):
            return
        path = Path(filename)
        if str(path.parent) == self.uploads_dir and path.name.startswith(tempfile.template) and not path.is_symlink():
            path.unlink(missing_ok=True)

    def _skip_undecodable(self, names: list[str], where: str) -> list[str]:
        """``names`` without those no request could name (not UTF-8, invisible characters, too long), logged."""
        kept = []
        for name in names:
            if not is_utf8(name):
                problem = "the file name is not valid UTF-8"
            elif invisible_characters(name):
                problem = f"the file name holds control or invisible format characters ({invisible_characters(name)})"
            elif len(self._to_id(name)[0]) > MAX_NAME_LENGTH:
                problem = f"its id would be longer than {MAX_NAME_LENGTH} characters"
            else:
                kept.append(name)
                continue
            self._report_once(
                (where, name),
                "datastore: skipped %s in %s: %s (rename it to serve it)",
                shown_name(name),
                where,
                problem,
            )
        return kept

    def _to_id(self, file: str) -> tuple[str, str]:
        """``(id, extension)`` of a file name, the longest datastore extension removed once (MONAI Label removed every
        occurrence: ``x.nrrd.nrrd`` was ``x``)."""
        matches = [e for e in self.file_types if file.endswith(e) and len(file) > len(e)]
        if matches:
            ext = max(matches, key=len)
            return file[: -len(ext)], ext
        return LocalDatastore._to_id(self, file)

    def _assign_ids(self) -> dict[str, tuple[str, str]]:
        """``id -> (file name, extension)`` of every image: its name without extension, or its whole name (extension
        ``""``) when files share the stem; a file whose id is still taken is left out. Each case is logged once."""
        files = self._list_files(self._datastore.image_path(), self._extensions)
        stems: dict[str, list[tuple[str, str]]] = {}
        for name in sorted(files):
            stem, ext = self._to_id(name)
            stems.setdefault(stem, []).append((name, ext))
        ids: dict[str, tuple[str, str]] = {}
        self._ambiguous = {}
        for stem, members in stems.items():
            if len(members) == 1:
                ids.setdefault(stem, members[0])
                continue
            self._ambiguous[stem] = [name for name, _ in members]
            self._report_once(
                ("shared stem", stem),
                "datastore: %s share the id %r: each is served under its whole file name as id (%s)",
                " and ".join(shown_name(n) for n, _ in members),
                stem,
                ", ".join(repr(n) for n, _ in members),
            )
        for names in self._ambiguous.values():
            for name in names:
                if name in ids:  # a whole name that is another file's stem (x.png beside x.png.nrrd)
                    self._report_once(
                        ("taken", name), "datastore: skipped %s: its id is taken by another file", shown_name(name)
                    )
                    continue
                ids[name] = (name, "")
        return ids

    def _report_once(self, key: tuple[str, str], message: str, *args: Any) -> None:
        if key not in self._reported:
            self._reported.add(key)
            logger.warning(message, *args)

    def _add_non_existing_images(self) -> int:
        """LocalDatastore's with the ids of :meth:`_assign_ids`; a record whose id names another file is dropped."""
        self._init_from_datastore_file()
        assigned = self._assign_ids()
        objects = self._datastore.objects
        changed = 0
        for image_id in list(objects):
            current = assigned.get(image_id)
            if current is None or image_id + objects[image_id].image.ext != current[0]:
                if image_id in self._ambiguous or current is not None:
                    del objects[image_id]  # the id now names another file, or none of the files sharing it
                    changed += 1
        for image_id, (name, ext) in assigned.items():
            if image_id not in objects:
                info = {"ts": int(time.time()), "name": name}
                objects[image_id] = ImageLabelModel(image=DataModel(info=info, ext=ext))
                changed += 1
        return changed

    def unknown_id_message(self, image_id: str) -> str:
        """Why ``image_id`` names no image: unknown, or the stem several files share (their ids named)."""
        shared = getattr(self, "_ambiguous", {}).get(image_id)
        if shared:
            return f"image id {image_id!r} is shared by {len(shared)} files; each is served under its own id: {shared}"
        return f"image id {image_id!r} is not in the datastore"

    def _image_record(self, image_id: str) -> ImageLabelModel:
        """The record of ``image_id`` (checked as a name: 400); ``ImageNotFoundException`` (one 404 on every route)
        when the datastore has none."""
        obj = self._datastore.objects.get(check_name(image_id, "image id"))
        if obj is None:
            raise ImageNotFoundException(self.unknown_id_message(image_id))
        return obj

    def _list_files(self, path: str, patterns: Sequence[str]) -> dict[str, str]:
        files = super()._list_files(path, patterns)
        where = os.path.relpath(path, self.root)
        return {
            k: files[k] for k in self._skip_undecodable(list(files), "the studies folder" if where == "." else where)
        }

    def _add_non_existing_labels(self, tag: str) -> int:
        if not self._skip_undecodable([tag], "labels"):
            return 0
        return super()._add_non_existing_labels(tag)

    def _update_datastore_file(self, lock: bool = True) -> None:
        """LocalDatastore's, written atomically (a link is replaced, not followed)."""

        def write() -> None:
            text = json.dumps(self._datastore.model_dump(exclude={"base_path"}), indent=2, default=str)
            target = writable_path(self.root, self._datastore_config_path, "the datastore's datastore_v2.json")
            with atomic_write(target, "w", encoding="utf-8") as f:
                f.write(text)
            self._config_ts = os.stat(target).st_mtime

        if lock:
            with FileLock(self._lock_file):
                write()
        else:
            write()

    def datalist(self, full_path: bool = True) -> list[dict[str, Any]]:
        """Images with a ``final`` label, by their paths inside the studies folder; unreadable entries left out."""
        tag, out = DefaultLabelTag.FINAL, []
        for image_id in self._datastore.filter_by_tag(tag):
            try:
                image = self.get_image_uri(image_id)
                label = self.get_label_uri(image_id, tag)
            except (RequestRefused, ImageNotFoundException, LabelNotFoundException) as e:
                logger.warning("datastore: %s left out of the data list: %s", shown_name(image_id), e)
                continue
            if full_path:
                out.append({"image": image, "label": label})
            else:
                out.append({"image": os.path.relpath(image, self.root), "label": os.path.relpath(label, self.root)})
        return out

    def get_image_uri(self, image_id: str) -> str:
        """The image file of ``image_id`` (404 when gone since the listing, 400 for a folder)."""
        obj = self._image_record(image_id)
        path = readable_path(self.root, self._image_file(image_id, obj.image.ext), f"image {image_id!r}")
        if os.path.isdir(path):
            raise RequestRefused(f"image id {image_id!r} names a folder, not an image file")
        if not os.path.isfile(path):
            raise ImageNotFoundException(self.unknown_id_message(image_id))
        return path

    def get_image_info(self, image_id: str) -> dict[str, Any]:
        path = self.get_image_uri(image_id)
        return {**super().get_image_info(image_id), "path": path}  # MONAI Label's shows a link's target

    def add_image(self, image_id: str, image_filename: str, image_info: dict[str, Any]) -> str:
        try:
            if not isinstance(image_info, dict):
                raise RequestRefused(f"image info must be a JSON object, got {type(image_info).__name__}")
            ext = self._file_type(image_filename, "an image")
            image_id = image_id or self._to_id(os.path.basename(image_filename))[0]
            check_name(image_id, "image id", new=True)
            name = image_id + ext
            self._check_free(image_id, name)
            logger.info("Adding Image: %s => %s", image_id, image_filename)
            with FileLock(self._lock_file):
                target = writable_path(self.root, self._image_file(image_id, ext), f"image {image_id!r}")
                with atomic_write(target) as f, open(image_filename, "rb") as src:
                    shutil.copyfileobj(src, f)
                info = {**image_info, "ts": int(time.time()), "name": name}
                self._datastore.objects[image_id] = ImageLabelModel(image=DataModel(info=info, ext=ext))
                self._update_datastore_file(lock=False)
            return image_id
        finally:
            self._discard_upload(image_filename)

    def _check_free(self, image_id: str, name: str) -> None:
        """Refuse (409) an upload whose id already names another file (replacing the same name is allowed)."""
        taken = [f for f in self._ambiguous.get(image_id, [])]
        taken += [
            f
            for f in self._list_files(self._datastore.image_path(), self._extensions)
            if f != name and f not in taken and self._to_id(f)[0] == image_id
        ]
        obj = self._datastore.objects.get(image_id)
        if obj is not None and image_id + obj.image.ext not in (name, *taken):
            taken.append(image_id + obj.image.ext)
        if taken:
            raise RequestRefused(
                f"image id {image_id!r} already names {', '.join(taken)}: upload {name} under another id (no two "
                "files share one)",
                409,
            )

    def remove_image(self, image_id: str) -> None:
        obj = self._image_record(image_id)
        what = f"image {image_id!r}"
        # every file decided first, so a refusal deletes nothing
        files = [deletable_path(self.root, self._image_file(image_id, obj.image.ext), what)]
        for tag, label in obj.labels.items():
            files.append(deletable_path(self.root, self._label_file(image_id, tag, label.ext), f"{what}'s {tag} label"))
        logger.info("Removing Image: %s", image_id)
        for path in files:
            if path:
                Path(path).unlink(missing_ok=True)
        if not self._auto_reload:
            self.refresh()

    def update_image_info(self, image_id: str, info: dict[str, Any]) -> None:
        if not isinstance(info, dict):
            raise RequestRefused(f"image info must be a JSON object, got {type(info).__name__}")
        self.get_image_uri(image_id)
        super().update_image_info(image_id, info)

    def get_dataset_archive(self, limit_cases: int | None) -> str:
        if not self.datalist():
            raise RequestRefused("no image has a final label: there is no dataset to archive", 404)
        # MONAI Label never removes the archives it sends: keep the latest only
        previous, self._archive = self._archive, super().get_dataset_archive(limit_cases)
        if previous and previous != self._archive:
            Path(previous).unlink(missing_ok=True)
        return self._archive

    def _no_label(self, label_id: str, label_tag: str) -> LabelNotFoundException:
        """The 404 for a missing label: the image's own message when the image is unknown."""
        obj = self._datastore.objects.get(label_id)
        if obj is None or not os.path.isfile(self._image_file(label_id, obj.image.ext)):
            return LabelNotFoundException(self.unknown_id_message(label_id))
        return LabelNotFoundException(f"image id {label_id!r} has no label tagged {label_tag!r}")

    def _label_record(self, label_id: str, label_tag: str) -> DataModel:
        """The record of ``label_id``'s label ``label_tag`` (both checked as names: 400), else :meth:`_no_label`."""
        label = self._datastore.label(check_name(label_id, "label id"), check_name(label_tag, "label tag"))
        if label is None:
            raise self._no_label(label_id, label_tag)
        return label

    def get_label_uri(self, label_id: str, label_tag: str) -> str:
        label = self._label_record(label_id, label_tag)
        path = readable_path(self.root, self._label_file(label_id, label_tag, label.ext), f"label {label_id!r}")
        if not os.path.isfile(path):
            raise self._no_label(label_id, label_tag)
        return path

    def get_label_info(self, label_id: str, label_tag: str) -> dict[str, Any]:
        self.get_label_uri(label_id, label_tag)
        return super().get_label_info(label_id, label_tag)

    def save_label(self, image_id: str, label_filename: str, label_tag: str, label_info: dict[str, Any]) -> str:
        try:
            if not isinstance(label_info, dict):
                raise RequestRefused(f"label info must be a JSON object, got {type(label_info).__name__}")
            check_name(image_id, "image id")
            check_name(label_tag, "label tag")
            ext = self._file_type(label_filename, "a label")
            self.get_image_uri(image_id)  # else 404
            obj = self._datastore.objects[image_id]
            name = image_id + ext
            logger.info("Adding Label: %s => %s => %s", image_id, label_tag, label_filename)
            with FileLock(self._lock_file):
                target = writable_path(self.root, self._label_file(image_id, label_tag, ext), f"label of {image_id!r}")
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with atomic_write(target) as f, open(label_filename, "rb") as src:
                    shutil.copyfileobj(src, f)
                info = {**label_info, "ts": int(time.time()), "name": name}
                obj.labels[label_tag] = DataModel(info=info, ext=ext)
                self._update_datastore_file(lock=False)
            return image_id
        finally:
            self._discard_upload(label_filename)

    def remove_label(self, label_id: str, label_tag: str) -> None:
        label = self._label_record(label_id, label_tag)
        path = deletable_path(self.root, self._label_file(label_id, label_tag, label.ext), f"label {label_id!r}")
        logger.info("Removing label: %s => %s", label_id, label_tag)
        if path:
            Path(path).unlink()
        if not self._auto_reload:
            self.refresh()

    def update_label_info(self, label_id: str, label_tag: str, info: dict[str, Any]) -> None:
        if not isinstance(info, dict):
            raise RequestRefused(f"label info must be a JSON object, got {type(info).__name__}")
        self.get_label_uri(label_id, label_tag)
        super().update_label_info(label_id, label_tag, info)
