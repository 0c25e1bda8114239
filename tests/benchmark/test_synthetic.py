"""Synthetic mammogram generator: texture statistics, geometry, lesions and masks, determinism, file outputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage

from glam_benchmark.synthetic import (
    BENIGN_TYPES,
    MALIGNANT_TYPES,
    MAX_VALUE_12BIT,
    SyntheticConfig,
    SyntheticMammogramGenerator,
    ensure_synthetic_dataset,
    make_synthetic_dataset,
    power_law_field,
    synthetic_spacing_mm,
)
from scripts.data.datalist import SPLITS, check_patient_splits

SMALL = (368, 240)


def _gen(seed: int = 0, **kw) -> SyntheticMammogramGenerator:
    return SyntheticMammogramGenerator(SyntheticConfig(size=kw.pop("size", SMALL), **kw), seed)


def _radial_power_slope(field: np.ndarray) -> float:
    """Least-squares slope of log radial-average power vs log frequency over 1/64 .. 1/4 cycles per pixel."""
    h, w = field.shape
    power = np.abs(np.fft.fft2(field)) ** 2
    fy, fx = np.meshgrid(np.fft.fftfreq(h), np.fft.fftfreq(w), indexing="ij")
    f = np.hypot(fy, fx)
    edges = np.geomspace(1 / 64, 1 / 4, 13)
    centres, means = [], []
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = (f >= lo) & (f < hi)
        centres.append(np.sqrt(lo * hi))
        means.append(power[sel].mean())
    return float(np.polyfit(np.log(centres), np.log(means), 1)[0])


@pytest.mark.parametrize("beta", [2.0, 3.0])
def test_power_law_field_spectrum_and_normalisation(beta):
    rng = np.random.default_rng(5)
    field = power_law_field((256, 256), beta, rng)
    assert field.dtype == np.float32 and field.shape == (256, 256)
    assert abs(float(field.mean())) < 1e-4 and abs(float(field.std()) - 1) < 1e-4
    assert _radial_power_slope(field) == pytest.approx(-beta, abs=0.25)


def test_power_law_field_anisotropy_elongates_along_columns():
    field = power_law_field((256, 256), 3.0, np.random.default_rng(1), anisotropy=3.0)
    # structures stretched along x: neighbouring columns correlate more than neighbouring rows
    corr_x = np.corrcoef(field[:, :-4].ravel(), field[:, 4:].ravel())[0, 1]
    corr_y = np.corrcoef(field[:-4].ravel(), field[4:].ravel())[0, 1]
    assert corr_x > corr_y + 0.02


def test_same_seed_gives_byte_identical_arrays_and_other_seed_differs():
    a = _gen(11, lesion_prevalence=1.0).generate(3, "R", "MLO")
    b = _gen(11, lesion_prevalence=1.0).generate(3, "R", "MLO")
    c = _gen(12, lesion_prevalence=1.0).generate(3, "R", "MLO")
    for key in ("image", "mask_benign", "mask_malignant"):
        assert getattr(a, key).tobytes() == getattr(b, key).tobytes()
    assert a.image.tobytes() != c.image.tobytes()
    # a view does not depend on what was generated before it
    gen = _gen(11, lesion_prevalence=1.0)
    gen.generate(0, "L", "CC")
    assert gen.generate(3, "R", "MLO").image.tobytes() == a.image.tobytes()


@pytest.mark.parametrize("view", ["CC", "MLO"])
def test_image_range_background_and_chest_wall_on_the_left(view):
    case = _gen(2).generate(1, "L", view)
    img, breast = case.image, case.breast_mask
    h, w = SMALL
    assert img.shape == (h, w) and img.dtype == np.uint16
    assert int(img.max()) <= MAX_VALUE_12BIT
    assert not img[~breast].any(), "background must be exactly 0"
    assert int(img[breast].min()) >= 1, "breast pixels must be > 0 (the authors' crop uses pixels > 0)"
    assert breast[h // 2, 0], "the breast touches the chest wall at column 0"
    assert not breast[:, -1].any(), "the nipple side does not reach the right edge"
    cols = np.nonzero(breast)[1]
    assert cols.mean() < w / 2
    assert 0.2 < breast.mean() < 0.8


def test_pectoral_muscle_only_on_mlo():
    gen = _gen(4, lesion_prevalence=0.0)
    brighter = []
    for patient in range(4):
        mlo = gen.generate(patient, "L", "MLO").image.astype(float)
        cc = gen.generate(patient, "L", "CC")
        corner = mlo[:20, :10]
        breast_mean = mlo[mlo > 0].mean()
        brighter.append(corner.min() > 0 and corner.mean() > breast_mean)
        # on CC the top-left corner is outside the breast (background)
        assert not cc.breast_mask[0, 0] or cc.image[0, 0] > 0
    assert all(brighter)


def test_labels_are_derived_from_masks_and_lesions_stay_small_and_inside():
    gen = _gen(7, lesion_prevalence=1.0)
    h, w = SMALL
    kinds = set()
    for patient in range(12):
        for side in ("L", "R"):
            for view in ("CC", "MLO"):
                case = gen.generate(patient, side, view)
                assert case.label == [int(case.mask_benign.any()), int(case.mask_malignant.any())]
                assert case.label != [0, 0]
                for m in (case.mask_benign, case.mask_malignant):
                    assert m.dtype == np.uint8 and set(np.unique(m)) <= {0, 1}
                    assert not (m.astype(bool) & ~case.breast_mask).any()
                for les in case.lesions:
                    kinds.add(les["kind"])
                    assert les["area"] <= 0.01 * h * w
                    assert (les["kind"] in BENIGN_TYPES) == (les["class"] == "benign")
                    assert (les["kind"] in MALIGNANT_TYPES) == (les["class"] == "malignant")
                # both views of a breast carry the same breast-level label
                plan = gen.breast_plan(patient, side)
                if len(case.lesions) == len(plan.lesions):
                    assert case.label == plan.label
    assert kinds == set(BENIGN_TYPES + MALIGNANT_TYPES)


def test_masses_are_brighter_than_their_surroundings():
    gen = _gen(3, lesion_prevalence=1.0)
    diffs = []
    for patient in range(10):
        case = gen.generate(patient, "L", "CC")
        img = case.image.astype(float)
        for les in case.lesions:
            if les["kind"] not in ("circumscribed_mass", "spiculated_mass"):
                continue
            mask = (case.mask_benign if les["class"] == "benign" else case.mask_malignant).astype(bool)
            r0, c0, r1, c1 = les["bbox"]
            own = np.zeros_like(mask)
            own[r0:r1, c0:c1] = mask[r0:r1, c0:c1]
            ring = ndimage.binary_dilation(own, iterations=6) & ~ndimage.binary_dilation(own, iterations=2)
            ring &= case.breast_mask & ~case.mask_benign.astype(bool) & ~case.mask_malignant.astype(bool)
            diffs.append((img[own].mean() - img[ring].mean()) / case.sigma_tex)
    assert len(diffs) >= 4
    assert np.median(diffs) > 0.3


def test_calcifications_are_few_pixel_particles_in_a_small_cluster():
    cfg_kw = dict(lesion_prevalence=1.0, calc_mask="particles", size=(736, 480))
    gen = _gen(5, **cfg_kw)
    sizes, extents = [], []
    for patient in range(12):
        case = gen.generate(patient, "R", "CC")
        for les in case.lesions:
            if les["kind"] != "pleomorphic_calcifications":
                continue
            r0, c0, r1, c1 = les["bbox"]
            sub = case.mask_malignant[r0:r1, c0:c1].astype(bool)
            labels, n = ndimage.label(sub)
            sizes += list(np.bincount(labels.ravel())[1:])
            rows, cols = np.nonzero(sub)
            extents.append(max(np.ptp(rows), np.ptp(cols)) + 1)
    assert sizes and extents
    assert np.median(sizes) <= 6, "fine particles are 1-3 px across at 736x480"
    assert max(extents) <= 0.06 * 480, "a cluster spans a few percent of the width"


def test_prevalence_controls_the_fraction_of_positive_breasts():
    for prevalence, lo, hi in ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0), (0.4, 0.32, 0.48)):
        gen = _gen(9, lesion_prevalence=prevalence)
        positive = [bool(gen.breast_plan(p, s).lesions) for p in range(150) for s in ("L", "R")]
        assert lo <= np.mean(positive) <= hi


def test_config_validation_names_the_parameter():
    with pytest.raises(ValueError, match="size"):
        SyntheticConfig(size=(10, 10))
    with pytest.raises(ValueError, match="lesion_prevalence"):
        SyntheticConfig(lesion_prevalence=1.5)
    with pytest.raises(ValueError, match="calc_mask"):
        SyntheticConfig(calc_mask="outline")
    with pytest.raises(ValueError, match="view"):
        _gen().generate(0, "L", "ML")
    with pytest.raises(ValueError, match="fmt"):
        make_synthetic_dataset("/nonexistent/never", 4, fmt="jpg")


def _load(root: Path) -> dict:
    return json.loads((root / "datalist.json").read_text())


def test_png_dataset_files_match_the_generator_and_split_by_patient(tmp_path):
    size = (256, 160)
    path = make_synthetic_dataset(tmp_path, 12, size=size, seed=4, fmt="png", lesion_prevalence=0.6)
    assert path == tmp_path / "datalist.json"
    datalist = _load(tmp_path)
    assert set(datalist) == set(SPLITS)
    items = [it for s in SPLITS for it in datalist[s]]
    assert len(items) == 12 and check_patient_splits(datalist) == []
    gen = SyntheticMammogramGenerator(SyntheticConfig(size=size, lesion_prevalence=0.6), 4)
    views_per_patient: dict[str, set] = {}
    for it in items:
        for key in ("image", "mask_benign", "mask_malignant"):
            assert not Path(it[key]).is_absolute() and (tmp_path / it[key]).is_file()
        patient = int(it["patient_id"][3:])
        case = gen.generate(patient, it["laterality"], it["view"])
        stored = np.array(Image.open(tmp_path / it["image"]))
        assert stored.dtype == np.uint16 and np.array_equal(stored, case.image)
        mb = np.array(Image.open(tmp_path / it["mask_benign"]))
        assert set(np.unique(mb)) <= {0, 255} and np.array_equal(mb > 0, case.mask_benign > 0)
        assert it["label"] == case.label and it["facing"] == "right"
        views_per_patient.setdefault(it["patient_id"], set()).add((it["laterality"], it["view"]))
    assert all(len(v) == 4 for v in views_per_patient.values())
    assert json.loads((tmp_path / "generator.json").read_text())["seed"] == 4


def test_png_files_state_the_spacing_the_size_stands_for(tmp_path):
    """The PNG images and masks carry the generator's spacing in their pHYs chunk (0.1 mm at 1920 px wide), which the
    reader returns; the folder of ensure_synthetic_dataset is still named by the settings alone."""
    from scripts.data.readers import read_mammogram

    assert synthetic_spacing_mm((736, 480)) == pytest.approx(0.4) and synthetic_spacing_mm((368, 240)) == 0.8
    assert synthetic_spacing_mm((2944, 1920)) == pytest.approx(0.1)
    assert SyntheticConfig(size=(256, 160)).spacing_mm == synthetic_spacing_mm((256, 160)) == pytest.approx(1.2)
    with pytest.raises(ValueError, match="size"):
        synthetic_spacing_mm((736,))
    datalist = ensure_synthetic_dataset(tmp_path, 4, size=SMALL, seed=1)
    assert Path(datalist).parent.name == "synthetic_n4_368x240_seed1_png_default"
    item = _load(Path(datalist).parent)["training"][0]
    for key in ("image", "mask_benign"):
        path = Path(datalist).parent / item[key]
        assert Image.open(path).info["dpi"] == pytest.approx((25.4 / 0.8, 25.4 / 0.8), rel=1e-3)
        assert read_mammogram(path, mask=key != "image")[1]["spacing"] == pytest.approx((0.8, 0.8))


def test_dataset_is_reproducible_file_for_file(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    make_synthetic_dataset(a, 4, size=(256, 160), seed=1)
    make_synthetic_dataset(b, 4, size=(256, 160), seed=1)
    assert _load(a) == _load(b)
    for f in sorted((a / "images").iterdir()):
        assert f.read_bytes() == (b / "images" / f.name).read_bytes()


def test_workers_make_the_same_files_in_the_same_folder(tmp_path):
    """Two worker processes write the files one process writes, byte for byte, into the folder named by the same
    settings: the quick start generates its data with two."""
    config = SyntheticConfig(lesion_prevalence=0.6)
    serial = Path(ensure_synthetic_dataset(tmp_path / "a", 8, size=(256, 160), seed=3, config=config)).parent
    parallel = Path(ensure_synthetic_dataset(tmp_path / "b", 8, size=(256, 160), seed=3, config=config, workers=2))
    assert parallel.parent.name == serial.name and serial.name.startswith("synthetic_n8_256x160_seed3_png_")
    assert _load(parallel.parent) == _load(serial)
    files = sorted(p.relative_to(serial) for p in serial.rglob("*.png"))
    assert len(files) == 8 * 3
    for f in files:
        assert (parallel.parent / f).read_bytes() == (serial / f).read_bytes(), f


def test_dicom_dataset_tags_orientation_and_photometric_mix(tmp_path):
    pydicom = pytest.importorskip("pydicom")
    size = (256, 160)
    make_synthetic_dataset(tmp_path, 6, size=size, seed=2, fmt="dcm", photometric="mix")
    items = [it for s in SPLITS for it in _load(tmp_path)[s]]
    gen = SyntheticMammogramGenerator(SyntheticConfig(size=size), 2)
    uids, photometrics = set(), set()
    for it in items:
        ds = pydicom.dcmread(tmp_path / it["image"])
        assert ds.Modality == "MG"
        assert ds.SOPClassUID == "1.2.840.10008.5.1.4.1.1.1.2"  # Digital Mammography - For Presentation
        assert ds.ImageLaterality == it["laterality"] and ds.ViewPosition == it["view"]
        assert ds.ViewCodeSequence[0].CodeValue in ("399162004", "399368009")
        assert (ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation) == (16, 12, 11, 0)
        assert float(ds.PixelSpacing[0]) == pytest.approx(0.1 * 1920 / size[1])
        assert ds.PatientID == it["patient_id"]
        case = gen.generate(int(it["patient_id"][3:]), it["laterality"], it["view"])
        expected = case.image[:, ::-1] if it["laterality"] == "R" else case.image
        assert it["facing"] == ("left" if it["laterality"] == "R" else "right")
        pixels = ds.pixel_array.astype(np.int32)
        if ds.PhotometricInterpretation == "MONOCHROME1":
            pixels = MAX_VALUE_12BIT - pixels
        assert np.array_equal(pixels, expected)
        mask = np.array(Image.open(tmp_path / it["mask_malignant"])) > 0
        assert np.array_equal(
            mask, (case.mask_malignant[:, ::-1] if it["laterality"] == "R" else case.mask_malignant) > 0
        )
        photometrics.add(ds.PhotometricInterpretation)
        uids.add(ds.SOPInstanceUID)
    assert photometrics == {"MONOCHROME1", "MONOCHROME2"}
    assert len(uids) == 6
    # UIDs are derived from the seed: a second run writes the same ones
    make_synthetic_dataset(tmp_path / "again", 6, size=size, seed=2, fmt="dcm", photometric="mix")
    first = pydicom.dcmread(tmp_path / items[0]["image"])
    again = pydicom.dcmread(tmp_path / "again" / items[0]["image"])
    assert (first.SOPInstanceUID, first.StudyInstanceUID) == (again.SOPInstanceUID, again.StudyInstanceUID)


def test_nifti_dataset_stores_x_first(tmp_path):
    nib = pytest.importorskip("nibabel")
    size = (256, 160)
    make_synthetic_dataset(tmp_path, 2, size=size, seed=6, fmt="nii")
    it = _load(tmp_path)["training"][0] if _load(tmp_path)["training"] else _load(tmp_path)["test"][0]
    img = nib.load(str(tmp_path / it["image"]))
    case = SyntheticMammogramGenerator(SyntheticConfig(size=size), 6).generate(0, it["laterality"], it["view"])
    assert img.shape == (size[1], size[0])
    assert np.array_equal(np.asarray(img.dataobj).T, case.image)
    assert np.allclose(np.diag(img.affine)[:2], 0.1 * 1920 / size[1])
    mask = np.asarray(nib.load(str(tmp_path / it["mask_benign"])).dataobj).T
    assert set(np.unique(mask)) <= {0, 1} and np.array_equal(mask, case.mask_benign)


@pytest.mark.slow
def test_full_size_image():
    case = SyntheticMammogramGenerator(SyntheticConfig(size=(2944, 1920), lesion_prevalence=1.0), 0).generate(
        0, "L", "MLO"
    )
    assert case.image.shape == (2944, 1920) and case.image.dtype == np.uint16
    assert case.lesions and all(les["area"] <= 0.01 * 2944 * 1920 for les in case.lesions)
    assert case.label == [int(case.mask_benign.any()), int(case.mask_malignant.any())]


@pytest.mark.parametrize("fmt", ["png", "nii", "dcm"])
def test_read_mammogram_returns_the_generated_pixels(tmp_path, fmt):
    """The agreed array convention across formats: read_mammogram gives back the stored (H, W) picture, with
    MONOCHROME1 inverted to dense-bright, and right breasts mirrored only where ``facing`` says so."""
    readers = pytest.importorskip("scripts.data.readers")
    size = (256, 160)
    make_synthetic_dataset(tmp_path, 4, size=size, seed=3, fmt=fmt, photometric="MONOCHROME1")
    gen = SyntheticMammogramGenerator(SyntheticConfig(size=size), 3)
    for it in [it for s in SPLITS for it in _load(tmp_path)[s]]:
        case = gen.generate(0, it["laterality"], it["view"])
        expected = case.image[:, ::-1] if it["facing"] == "left" else case.image
        arr, meta = readers.read_mammogram(tmp_path / it["image"])
        assert arr.shape == size and np.array_equal(arr, expected.astype(np.float32)), it["image"]
        mask, _ = readers.read_mammogram(tmp_path / it["mask_benign"], mask=True)
        flipped = case.mask_benign[:, ::-1] if it["facing"] == "left" else case.mask_benign
        assert np.array_equal(mask > 0, flipped > 0)
        if fmt == "dcm":
            assert (meta["laterality"], meta["view"], meta["patient_id"]) == (it["laterality"], it["view"], "SYN00000")


def test_make_synthetic_cli(tmp_path, capsys):
    from glam_benchmark.synthetic import __main__ as cli

    assert cli.main(["--out", str(tmp_path / "d"), "--n", "4", "--size", "256", "160", "--format", "nii"]) == 0
    assert len([it for s in SPLITS for it in _load(tmp_path / "d")[s]]) == 4
    assert cli.main(["--preview", str(tmp_path / "p.png"), "--size", "256", "160"]) == 0
    grid = np.array(Image.open(tmp_path / "p.png").convert("RGB"))
    # outlines of both classes are drawn
    assert (grid == (60, 220, 60)).all(axis=-1).any() and (grid == (255, 50, 50)).all(axis=-1).any()
    assert cli.main(["--out", str(tmp_path / "e"), "--n", "0", "--size", "256", "160"]) == 2
    assert "n must be a positive integer" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["png", "dcm"])
def test_items_list_their_lesions_boxes_in_the_files_pixels(tmp_path, fmt):
    """Each item's boxes are in the written file's pixels (DICOM right breasts stored mirrored): every lesion pixel
    of a class lies in a box of that class, every box is tight (its edges touch the mask), and a class whose mask
    is one connected lesion has exactly that lesion's bounding box; the label names the classes with boxes."""
    from scipy import ndimage

    from scripts.data.readers import read_mammogram

    make_synthetic_dataset(tmp_path, 12, size=(256, 160), seed=5, fmt=fmt, lesion_prevalence=1.0)
    items = [it for s in SPLITS for it in _load(tmp_path)[s]]
    assert sum(len(it["boxes"]) for it in items) >= 6
    assert fmt == "png" or any(it["facing"] == "left" and it["boxes"] for it in items)
    for it in items:
        assert it["label"] == [int(any(b["label"] == c for b in it["boxes"])) for c in ("benign", "malignant")]
        for cls in ("benign", "malignant"):
            mask = np.asarray(read_mammogram(tmp_path / it[f"mask_{cls}"], mask=True)[0]) > 0
            boxes = [b["box"] for b in it["boxes"] if b["label"] == cls]
            covered = np.zeros_like(mask)
            for y0, x0, y1, x1 in boxes:
                assert 0 <= y0 < y1 <= mask.shape[0] and 0 <= x0 < x1 <= mask.shape[1]
                inside = mask[y0:y1, x0:x1]
                assert inside[0].any() and inside[-1].any() and inside[:, 0].any() and inside[:, -1].any()
                covered[y0:y1, x0:x1] = True
            assert not (mask & ~covered).any()
            labels, n = ndimage.label(mask, structure=np.ones((3, 3)))
            if n == 1 and len(boxes) == 1:
                s = ndimage.find_objects(labels)[0]
                assert boxes[0] == [s[0].start, s[1].start, s[0].stop, s[1].stop]
