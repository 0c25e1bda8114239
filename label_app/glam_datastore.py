"""MONAI Label's local datastore, confined to the studies folder.

``LocalDatastore`` builds every path from a request's image id, label id and label tag with ``os.path.join``: an id
``../x`` or a tag ``/abs`` leaves the studies folder (an upload ``PUT /datastore/image?image=../x`` wrote there and
``GET`` then served the file). :class:`GLAMDatastore` checks every id and tag a route hands it
(:func:`glam_safety.check_name`) and every path it builds (:func:`glam_safety.check_inside`) before the stock
methods run, keeps uploads and labels to the file types it lists, and drops records of an older datastore file that
point outside the folder. A refusal is a :class:`glam_safety.RequestRefused` (400 over HTTP, ``glam_server``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from glam_safety import RequestRefused, check_inside, check_name, is_inside
from monailabel.datastore.local import LocalDatastore

logger = logging.getLogger(__name__)


class GLAMDatastore(LocalDatastore):
    """A ``LocalDatastore`` whose ids, tags and paths stay in ``datastore_path`` (arguments as ``LocalDatastore``)."""

    def __init__(self, datastore_path: str, extensions: Sequence[str] = ("*.nii.gz", "*.nii"), **kwargs: Any) -> None:
        self.root = os.path.abspath(datastore_path)
        self.file_types = tuple(e.replace("*", "") for e in extensions)
        super().__init__(datastore_path, extensions=list(extensions), **kwargs)
        self._drop_records_outside()

    # -- checks ------------------------------------------------------------------------------------------------------
    def _file_type(self, filename: str, what: str) -> str:
        _, ext = self._to_id(os.path.basename(filename))
        if ext not in self.file_types:
            kind = repr(ext) if ext else "without extension"
            raise RequestRefused(f"{what} of type {kind}: the datastore keeps {list(self.file_types)}")
        return ext

    def _record_is_inside(self, folder: str, name: str, ext: str) -> bool:
        try:
            check_name(name, "name")
        except RequestRefused:
            return False
        return "/" not in ext and "\\" not in ext and is_inside(self.root, os.path.join(folder, name + ext))

    def _drop_records_outside(self) -> None:
        """Forget records (a datastore file written before these checks) whose id, tag or extension leads out."""
        objects = self._datastore.objects
        dropped = [i for i, obj in objects.items() if not self._record_is_inside(self._image_dir(), i, obj.image.ext)]
        for image_id in dropped:
            del objects[image_id]
        for image_id, obj in objects.items():
            for tag in [t for t, lab in obj.labels.items() if not self._label_record_is_inside(image_id, t, lab.ext)]:
                del obj.labels[tag]
                dropped.append(f"{image_id} (label {tag!r})")
        if dropped:
            logger.warning("datastore: dropped records that lead outside %s: %s", self.root, dropped)
            self._update_datastore_file()

    def _label_record_is_inside(self, image_id: str, tag: str, ext: str) -> bool:
        try:
            check_name(tag, "tag")
        except RequestRefused:
            return False
        return self._record_is_inside(self._datastore.label_path(tag), image_id, ext)

    def _image_dir(self) -> str:
        return self._datastore.image_path()

    # -- images ------------------------------------------------------------------------------------------------------
    def get_image_uri(self, image_id: str) -> str:
        obj = self._datastore.objects.get(check_name(image_id, "image id"))
        if obj is not None:  # the path before links are resolved: a link the owner put in the folder still works
            check_inside(self.root, os.path.join(self._image_dir(), image_id + obj.image.ext), f"image {image_id!r}")
        return super().get_image_uri(image_id)

    def get_image_info(self, image_id: str) -> dict[str, Any]:
        self.get_image_uri(image_id)
        return super().get_image_info(image_id)

    def add_image(self, image_id: str, image_filename: str, image_info: dict[str, Any]) -> str:
        if not isinstance(image_info, dict):
            raise RequestRefused(f"image info must be a JSON object, got {type(image_info).__name__}")
        ext = self._file_type(image_filename, "an image")
        check_name(image_id, "image id", new=True)
        check_inside(self.root, os.path.join(self._image_dir(), image_id + ext), f"image {image_id!r}")
        return super().add_image(image_id, image_filename, image_info)

    def remove_image(self, image_id: str) -> None:
        self.get_image_uri(image_id)
        super().remove_image(image_id)

    def update_image_info(self, image_id: str, info: dict[str, Any]) -> None:
        if not isinstance(info, dict):
            raise RequestRefused(f"image info must be a JSON object, got {type(info).__name__}")
        self.get_image_uri(image_id)
        super().update_image_info(image_id, info)

    def get_dataset_archive(self, limit_cases: int | None) -> str:
        if not self.datalist():
            raise RequestRefused("no image has a final label: there is no dataset to archive", 404)
        return super().get_dataset_archive(limit_cases)

    # -- labels ------------------------------------------------------------------------------------------------------
    def get_label_uri(self, label_id: str, label_tag: str) -> str:
        label = self._datastore.label(check_name(label_id, "label id"), check_name(label_tag, "label tag"))
        if label is not None:
            path = os.path.join(self._datastore.label_path(label_tag), label_id + label.ext)
            check_inside(self.root, path, f"label {label_id!r}")
        return super().get_label_uri(label_id, label_tag)

    def get_label_info(self, label_id: str, label_tag: str) -> dict[str, Any]:
        self.get_label_uri(label_id, label_tag)
        return super().get_label_info(label_id, label_tag)

    def save_label(self, image_id: str, label_filename: str, label_tag: str, label_info: dict[str, Any]) -> str:
        if not isinstance(label_info, dict):
            raise RequestRefused(f"label info must be a JSON object, got {type(label_info).__name__}")
        check_name(image_id, "image id")
        check_name(label_tag, "label tag")
        ext = self._file_type(label_filename, "a label")
        check_inside(self.root, os.path.join(self._datastore.label_path(label_tag), image_id + ext), "label")
        return super().save_label(image_id, label_filename, label_tag, label_info)

    def remove_label(self, label_id: str, label_tag: str) -> None:
        self.get_label_uri(label_id, label_tag)
        super().remove_label(label_id, label_tag)

    def update_label_info(self, label_id: str, label_tag: str, info: dict[str, Any]) -> None:
        if not isinstance(info, dict):
            raise RequestRefused(f"label info must be a JSON object, got {type(info).__name__}")
        self.get_label_uri(label_id, label_tag)
        super().update_label_info(label_id, label_tag, info)
