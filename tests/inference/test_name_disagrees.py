"""A laterality or view that a DICOM tag states against what the file's name states is used as the tag says, with a
note naming both (a mislabelled film or a swapped file name shows instead of passing silently); a name that agrees,
or states nothing, gives no such note."""

from __future__ import annotations

import numpy as np
from _dicom_factory import make_dicom
from _film_factory import film
from config_chains import inference_chains

from scripts.inference.facts import image_facts, image_notes

WINDOW = (368, 240)


def _notes(tmp_path, name: str, laterality: str, view: str) -> tuple[dict, list[str]]:
    picture, _ = film(1200, 760, "CC", "R", seed=5)
    path = make_dicom(tmp_path / name, picture, spacing=(0.1, 0.1), view_position=view, laterality=laterality)
    _, loading = inference_chains(pixel_spacing=0.4, image_size=list(WINDOW), crop_iterations=25, crop_buffer=12)
    item = loading({"image": str(path)})
    return image_facts(item), [n for n in image_notes(item, WINDOW) if "file name states" in n]


def test_a_tag_against_the_file_name_is_used_and_noted(tmp_path):
    facts, notes = _notes(tmp_path, "P1_R_MLO.dcm", laterality="L", view="CC")
    assert (facts["laterality"], facts["laterality_source"]) == ("L", "dicom")
    assert (facts["view"], facts["view_source"]) == ("CC", "ViewPosition")
    assert notes == [
        "laterality L from dicom, while the file name states R: L was used",
        "view CC from ViewPosition, while the file name states MLO: CC was used",
    ]


def test_a_name_that_agrees_or_says_nothing_gives_no_note(tmp_path):
    assert _notes(tmp_path, "P1_R_CC.dcm", laterality="R", view="CC")[1] == []
    assert _notes(tmp_path, "1-1.dcm", laterality="R", view="CC")[1] == []
    assert np.isfinite(float(_notes(tmp_path, "P2_RCC.dcm", laterality="R", view="CC")[0]["breast_in_window"]))
