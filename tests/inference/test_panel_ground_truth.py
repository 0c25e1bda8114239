"""The panel draws the ground truth a datalist gives (scripts.inference.panel, scripts.visualize.reading_panel): a
benign mask file and a malignant box, each outlined in its class colour on the image tile, in the file's geometry;
and inputs whose file name is shared across folders or says nothing (TCIA's ``1-1.dcm``) get stems and panel titles
that carry their folders (scripts.inference.files.input_names, scripts.inference.panel.shown_name)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from test_inference_workflow import INFERENCE_CONFIG, TINY, TINY_INFERENCE, _run

ROWS, COLS = 256, 160
#: the malignant box (y0, x0, y1, x1) in the file's pixels and the benign disc (centre row, col; radius)
BOX = (40, 30, 71, 91)
DISC = (170, 60, 18)
GREEN, RED = (0, 200, 0), (230, 0, 0)


def _image() -> np.ndarray:
    rng = np.random.default_rng(3)
    yy, xx = np.mgrid[0:ROWS, 0:COLS]
    inside = ((yy - ROWS / 2) / (ROWS * 0.47)) ** 2 + (xx / (COLS * 0.95)) ** 2 < 1
    return np.where(inside, rng.integers(1200, 3800, (ROWS, COLS)), 0).astype(np.uint16)


def _disc() -> np.ndarray:
    yy, xx = np.mgrid[0:ROWS, 0:COLS]
    return (yy - DISC[0]) ** 2 + (xx - DISC[1]) ** 2 <= DISC[2] ** 2


def _expected_outline(mask: np.ndarray, width: int) -> np.ndarray:
    """The mask pixels within ``width`` steps (4-neighbour moves) of a pixel outside it, by a loop over the offsets."""
    near_outside = np.zeros_like(mask)
    for dy in range(-width, width + 1):
        for dx in range(-width, width + 1):
            if abs(dy) + abs(dx) > width:
                continue
            shifted = np.ones_like(mask)  # beyond the image counts as inside: the border is no edge
            ys, xs = slice(max(dy, 0), ROWS + min(dy, 0)), slice(max(dx, 0), COLS + min(dx, 0))
            yd, xd = slice(max(-dy, 0), ROWS + min(-dy, 0)), slice(max(-dx, 0), COLS + min(-dx, 0))
            shifted[yd, xd] = mask[ys, xs]
            near_outside |= ~shifted
    return mask & near_outside


@pytest.fixture(scope="module")
def panel(tmp_path_factory):
    from scripts.networks import GLAMSaliencyNet

    root = tmp_path_factory.mktemp("truth")
    Image.fromarray(_image()).save(root / "case_L_CC.png")
    Image.fromarray((_disc() * 255).astype(np.uint8)).save(root / "case_L_CC_benign.png")
    y0, x0, y1, x1 = BOX
    item = {
        "image": "case_L_CC.png",
        "mask_benign": "case_L_CC_benign.png",
        "boxes": [{"label": "malignant", "box": [y0, x0, y1, x1]}],
        "label": [1, 1],
    }
    (root / "datalist.json").write_text(json.dumps({"test": [item]}))
    torch.manual_seed(0)
    ckpt = root / "model.pt"
    torch.save(GLAMSaliencyNet(stage="joint", **TINY).state_dict(), ckpt)
    out = root / "out"
    overrides = {
        "input_dir": "",
        "datalist": str(root / "datalist.json"),
        "output_dir": str(out),
        "ckpt_path": str(ckpt),
        "num_workers": 0,
    }
    _run([INFERENCE_CONFIG, TINY_INFERENCE], overrides)  # panel_height null: the thumbnail is the file
    return np.asarray(Image.open(out / "panels" / "case_L_CC_panel.png").convert("RGB"))


def test_the_mask_and_the_box_are_outlined_in_their_class_colours(panel):
    width = max(2, COLS // 160)  # the panel's line width on a 160-column thumbnail
    disc = _expected_outline(_disc(), width)
    y0, x0, y1, x1 = BOX
    box = np.zeros((ROWS, COLS), bool)  # the box's border, ``width`` px inside it, by hand
    box[y0 : y0 + width, x0:x1] = box[y1 - width : y1, x0:x1] = True
    box[y0:y1, x0 : x0 + width] = box[y0:y1, x1 - width : x1] = True
    # the title strip's height depends on the font: the image tile starts where the outlines match
    offsets = [
        top
        for top in range(panel.shape[0] - ROWS)
        if (panel[top : top + ROWS, :COLS][box] == RED).all() and (panel[top : top + ROWS, :COLS][disc] == GREEN).all()
    ]
    assert len(offsets) == 1
    tile = panel[offsets[0] : offsets[0] + ROWS, :COLS]
    coloured = lambda colour: (tile == colour).all(axis=-1)  # noqa: E731
    # exactly these pixels carry the class colours: the inside of the lesions shows the image
    assert (coloured(GREEN) == disc).all()
    assert (coloured(RED) == box).all()


def test_tcia_names_get_their_folders_in_the_stem_and_the_title():
    from scripts.inference.folder import assign_stems
    from scripts.inference.panel import shown_name

    tcia = "/d/CBIS-DDSM/{}/08-07-2016-DDSM-{}/1.000000-full mammogram images-{}/1-1.dcm"
    cc = tcia.format("Mass-Training_P_00001_LEFT_CC", 74994, 24515)
    mlo = tcia.format("Mass-Training_P_00001_LEFT_MLO", 90988, 4591)
    single = "/e/2.000000-ROI mask images-3/1-2.dcm"  # a generic name, unique: its own folder leads it
    paths = [cc, mlo, "/in/a.png", "/in/sub/a.png", "/in/pat.dcm", "/in/pat.DCM", "/in/SYN0001_L_CC.png", single]
    stems = assign_stems(paths, {}, limit=200)
    assert stems == {
        cc: "Mass-Training_P_00001_LEFT_CC_08-07-2016-DDSM-74994_1.000000-full mammogram images-24515_1-1",
        mlo: "Mass-Training_P_00001_LEFT_MLO_08-07-2016-DDSM-90988_1.000000-full mammogram images-4591_1-1",
        "/in/a.png": "a",  # the shared folder's own file keeps its name
        "/in/sub/a.png": "sub_a",
        "/in/pat.dcm": "pat",  # one folder: kept apart by the number, as before
        "/in/pat.DCM": "pat_2",
        "/in/SYN0001_L_CC.png": "SYN0001_L_CC",  # a unique name is unchanged
        single: "2.000000-ROI mask images-3_1-2",
    }
    assert shown_name(cc, stems[cc]) == (
        "Mass-Training_P_00001_LEFT_CC/08-07-2016-DDSM-74994/1.000000-full mammogram images-24515/1-1.dcm"
    )
    assert shown_name("/in/sub/a.png", "sub_a") == "sub/a.png"
    assert shown_name("/in/pat.DCM", "pat_2") == "pat.DCM"
    assert shown_name("/in/a.png", "a") == "a.png"
    # a stem the folder already has is kept
    assert assign_stems([cc], {cc: "1-1"}, limit=200) == {cc: "1-1"}


def test_one_class_of_ground_truth_is_drawn_too():
    """A datalist with the benign mask alone (as the authors' sample exam) gets it outlined; the panel's other class
    has nothing to draw."""
    from scripts.inference.panel import item_panel

    image = torch.as_tensor(_image()[None].astype(np.float32))
    item = {
        "image_thumbnail": image,
        "mask_benign_thumbnail": torch.as_tensor(_disc()[None].astype(np.float32)),
        "thumbnail_step": 1,
        "output_stem": "case",
    }
    maps = {"S_c": np.zeros((2, ROWS, COLS), np.float32)}
    drawn = item_panel("/in/case.png", item, maps, [], None, [0.1, 0.2], ["", ""], {})
    top = _title_rows(drawn)
    tile = drawn[top : top + ROWS, :COLS]
    assert ((tile == GREEN).all(axis=-1) == _expected_outline(_disc(), 2)).all()
    assert not (tile == RED).all(axis=-1).any()


def _title_rows(panel: np.ndarray) -> int:
    """The rows of the (white) title strip: the image tile starts black at its left edge (outside the breast)."""
    return int(np.argmax((panel[:, 0] == 0).all(axis=-1)))
