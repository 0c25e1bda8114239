"""Readers on files shaped like real archives': CBIS-DDSM (no spacing, the view only in PatientOrientation and the
patient id), CR images that are and are not mammograms, MONOCHROME1 with a window, and decompression bombs."""

from __future__ import annotations

import gzip
import os
import struct
import time
import tracemalloc
import zlib
from pathlib import Path

import nibabel as nib
import numpy as np
import pydicom
import pytest
from _dicom_factory import (
    CR_IMAGE_STORAGE,
    DEFLATED,
    linear_window,
    make_dataset,
    make_dicom,
    save,
    save_deflated_bomb,
)
from monai.data import list_data_collate
from monai.transforms import LoadImaged
from PIL import Image

from scripts.data.dicom_files import read_dicom_header
from scripts.data.header_facts import mammography_problem, orientation_view_laterality, text_view_laterality
from scripts.data.readers import DEFAULT_MAX_PIXELS, MammogramReader, MammogramReadError, read_mammogram
from scripts.transforms.mammo.array import FlipToRight

NEW_KEYS = ("view_source", "laterality_source", "spacing_source", "modality", "body_part")


def breast(h: int = 40, w: int = 24, side: str = "left", base: int = 100) -> np.ndarray:
    """uint16 (H, W): a half-disc against the ``side`` edge, a distinct value per pixel, 0 elsewhere."""
    rows, cols = np.mgrid[:h, :w]
    dist = cols if side == "left" else (w - 1 - cols)
    inside = ((rows - h / 2) / (h / 2)) ** 2 + (dist / (0.8 * w)) ** 2 < 1
    return np.where(inside, base + rows * w + cols, 0).astype(np.uint16)


def cbis_like(path: Path, pixels: np.ndarray, **kwargs) -> Path:
    """A CBIS-DDSM full mammogram as the archive ships it: 16-bit MONOCHROME2, no PixelSpacing / ImagerPixelSpacing,
    no ViewPosition / ImageLaterality; PatientOrientation and the PatientID say which view."""
    options = dict(
        bits_stored=16,
        laterality=None,
        view_position=None,
        spacing=None,
        patient_id="Mass-Test_P_00173_LEFT_MLO",
        patient_orientation=("A", "FR"),
        series_description="full mammogram images",
    )
    options.update(kwargs)
    return make_dicom(path, pixels, **options)


def _refused(path: Path, phrase: str, **kwargs) -> str:
    with pytest.raises(MammogramReadError) as info:
        read_mammogram(path, **kwargs)
    message = str(info.value)
    assert str(path) in message and phrase in message, message
    assert "Modality/VOI LUT" not in message and "\n" not in message
    return message


def _loaded_meta(path: Path, **reader_args) -> dict:
    return dict(LoadImaged("image", reader=MammogramReader(**reader_args))({"image": str(path)})["image"].meta)


# ------------------------------------------------------------------------------------------ CBIS-DDSM-like


def test_cbis_ddsm_like_file_view_and_side_from_patient_orientation(tmp_path):
    a = breast(48, 32) * 13  # 16-bit values beyond 12 bits
    assert a.max() > 4095
    path = cbis_like(tmp_path / "1-1.dcm", a)
    arr, meta = read_mammogram(path)
    np.testing.assert_array_equal(arr, a.astype(np.float32))  # MONOCHROME2, no LUT: the stored values
    assert (meta["view"], meta["view_source"]) == ("MLO", "PatientOrientation")
    assert (meta["laterality"], meta["laterality_source"]) == ("L", "PatientOrientation")
    assert (meta["spacing"], meta["spacing_source"]) == (None, None)
    assert (meta["modality"], meta["body_part"]) == ("MG", None)
    assert meta["patient_id"] == "Mass-Test_P_00173_LEFT_MLO"
    header = read_dicom_header(path)
    assert {k: header[k] for k in NEW_KEYS} == {
        "view_source": "PatientOrientation",
        "laterality_source": "PatientOrientation",
        "spacing_source": None,
        "modality": "MG",
        "body_part": None,
    }
    assert (header["view"], header["laterality"], header["mammography_problem"]) == ("MLO", "L", None)
    loaded = _loaded_meta(path)
    assert {k: loaded[k] for k in ("view", "laterality", *NEW_KEYS)} == {
        "view": "MLO",
        "laterality": "L",
        "view_source": "PatientOrientation",
        "laterality_source": "PatientOrientation",
        "spacing_source": "",
        "modality": "MG",
        "body_part": "",
    }
    assert np.isnan(loaded["spacing"]).all()


def test_cbis_ddsm_sized_file_is_read_well_inside_the_size_cap(tmp_path):
    """The issue's real files are 4432 x 2864 16-bit; the default cap leaves a margin of 8x over a 4000 x 5000
    mammogram."""
    assert DEFAULT_MAX_PIXELS == 2 * Image.MAX_IMAGE_PIXELS == 178_956_970  # PIL's decompression-bomb limit
    assert DEFAULT_MAX_PIXELS >= 8 * 4000 * 5000
    a = np.zeros((4432, 2864), np.uint16)
    a[1000:3400, :1800] = np.arange(1800, dtype=np.uint16) * 30 + 7  # 16-bit values
    ds = make_dataset(
        a, bits_stored=16, laterality=None, view_position=None, spacing=None, patient_id="P_00005_RIGHT_CC",
        patient_orientation=("P", "L"),
    )  # fmt: skip
    try:  # RLE lossless as CBIS-DDSM ships it (pylibjpeg-rle encodes it in about a second); else uncompressed
        ds.compress(pydicom.uid.RLELossless, a, encoding_plugin="pylibjpeg")
    except Exception:  # noqa: BLE001 - no encoder in this environment: the size check is the same
        pass
    path = save(ds, tmp_path / "big.dcm")
    arr, meta = read_mammogram(path, infer_laterality=False)
    assert arr.shape == (4432, 2864)
    np.testing.assert_array_equal(arr, a)
    assert (meta["view"], meta["laterality"], meta["spacing"]) == ("CC", "R", None)
    assert meta["transfer_syntax"] == str(ds.file_meta.TransferSyntaxUID)  # RLE where pylibjpeg-rle encodes
    message = _refused(path, "exceeds the decoded-size cap of 12,000,000 pixels", max_pixels=12_000_000)
    assert message.endswith(
        "raise the cap: --max_image_pixels N on the inference command line (the reader's max_pixels in Python)"
    )


def test_view_and_side_only_in_the_patient_id(tmp_path):
    path = cbis_like(
        tmp_path / "000000.dcm",
        breast(side="right"),
        patient_id="Calc-Training_P_00005_RIGHT_CC_1",
        patient_orientation=None,
        series_description=None,
    )
    _, meta = read_mammogram(path)
    assert (meta["view"], meta["view_source"]) == ("CC", "PatientID")
    assert (meta["laterality"], meta["laterality_source"]) == ("R", "PatientID")
    header = read_dicom_header(path)
    assert (header["view"], header["view_source"], header["laterality_source"]) == ("CC", "PatientID", "PatientID")


@pytest.mark.parametrize(
    "kwargs, view, view_source, side, side_source",
    [
        # tags beat PatientOrientation, PatientOrientation beats text, text beats the pixels
        (dict(view_position="CC", laterality="R"), "CC", "ViewPosition", "R", "dicom"),
        (dict(view_code=("R-10242", "SRT", "cranio-caudal")), "CC", "ViewCodeSequence", "L", "PatientOrientation"),
        (dict(laterality="R", laterality_keyword="Laterality"), "MLO", "PatientOrientation", "R", "dicom"),
        (dict(patient_orientation=("P", "L")), "CC", "PatientOrientation", "R", "PatientOrientation"),
        # a mirrored CC: the view is clear, the side is not; the patient id tells it
        (dict(patient_orientation=("A", "L")), "CC", "PatientOrientation", "L", "PatientID"),
        (
            dict(patient_orientation=None, series_description="R MLO", patient_id="X"),
            "MLO",
            "SeriesDescription",
            "R",
            "SeriesDescription",
        ),
        (
            dict(patient_orientation=None, series_description="", protocol_name="L CC", patient_id="X"),
            "CC",
            "ProtocolName",
            "L",
            "ProtocolName",
        ),
        (dict(patient_orientation=None, series_description=None, patient_id="ANON"), None, None, "L", "image"),
    ],
)
def test_source_precedence(tmp_path, kwargs, view, view_source, side, side_source):
    path = cbis_like(tmp_path / "x.dcm", breast(), **kwargs)
    _, meta = read_mammogram(path)
    assert (meta["view"], meta["view_source"], meta["laterality"], meta["laterality_source"]) == (
        view,
        view_source,
        side,
        side_source,
    )


def test_file_name_states_view_and_side_for_any_format(tmp_path):
    dcm = cbis_like(
        tmp_path / "20586908_6c613a14b80a8591_MG_R_CC_ANON.dcm",
        breast(side="right"),
        patient_orientation=None,
        series_description=None,
        patient_id="20586908",
    )
    _, meta = read_mammogram(dcm)
    assert (meta["view"], meta["view_source"], meta["laterality"], meta["laterality_source"]) == (
        "CC",
        "filename",
        "R",
        "filename",
    )
    png = tmp_path / "Mass-Training_P_00001_LEFT_MLO.png"
    Image.fromarray(breast()).save(png)
    meta = _loaded_meta(png)
    assert (meta["view"], meta["view_source"], meta["laterality"], meta["laterality_source"]) == (
        "MLO",
        "filename",
        "L",
        "filename",
    )
    assert (meta["modality"], meta["body_part"], meta["spacing_source"]) == ("", "", "")


def test_side_from_a_file_name_does_not_decide_the_flip(tmp_path):
    """A right breast exported already facing right (the synthetic PNGs, preprocessed exports) keeps facing right:
    the file name says which breast, not how the picture is stored."""
    path = tmp_path / "SYN00003_R_CC.png"
    Image.fromarray(breast(side="left")).save(path)
    img = LoadImaged("image", reader=MammogramReader())({"image": str(path)})["image"]
    assert (img.meta["laterality"], img.meta["laterality_source"]) == ("R", "filename")
    assert not FlipToRight().should_flip(img)
    # the same side from a tag is the stored orientation's convention: mirrored
    tagged = make_dicom(tmp_path / "t.dcm", breast(side="left"), laterality="R")
    assert FlipToRight().should_flip(LoadImaged("image", reader=MammogramReader())({"image": str(tagged)})["image"])


@pytest.mark.parametrize(
    "orientation, expected",
    [
        (("A", "R"), ("CC", "L")),
        (("P", "L"), ("CC", "R")),
        (("A", "L"), ("CC", None)),  # mirrored R-CC or upside-down L-CC: no side
        (("P", "R"), ("CC", None)),
        (("A", "FR"), ("MLO", "L")),
        (("P", "FL"), ("MLO", "R")),
        (("P", "FR"), ("MLO", "L")),  # a mirrored L-MLO: the oblique's R component still says left
        (("A", "HL"), ("MLO", "L")),  # upside down
        (("A", "F"), ("ML", None)),
        ("A\\FR", ("MLO", "L")),  # one backslash-joined string
        (("R", "A"), ("CC", None)),  # rotated: the view only
        (("A",), (None, None)),
        (("A", "P"), (None, None)),
        (("X", "Y"), (None, None)),
        (None, (None, None)),
    ],
)
def test_patient_orientation_table(orientation, expected):
    assert orientation_view_laterality(orientation) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Mass-Test_P_00173_LEFT_MLO", ("MLO", "L")),
        ("Calc-Training_P_00005_RIGHT_CC_1", ("CC", "R")),
        ("L CC", ("CC", "L")),
        ("RMLO", ("MLO", "R")),
        ("lcc", ("CC", "L")),
        ("MLO-R", ("MLO", "R")),
        ("0_R-CC", ("CC", "R")),
        ("R XCCL", ("XCCL", "R")),
        ("LEFT_MLO", ("MLO", "L")),
        ("P_00173", (None, None)),
        ("LEFTOVER CCTV", (None, None)),  # whole tokens only
        ("L 123 R", (None, None)),  # a lone L / R must stand next to a view
        ("LEFT RIGHT CC", ("CC", None)),  # contradicting sides: none
        ("CC MLO LEFT", (None, "L")),
        ("full mammogram images", (None, None)),
        (None, (None, None)),
    ],
)
def test_text_patterns(text, expected):
    assert text_view_laterality(text) == expected


# ---------------------------------------------------------------------------------------------- spacing


def test_spacing_sources(tmp_path):
    a = breast()
    both = make_dicom(tmp_path / "both.dcm", a, spacing=(0.1, 0.1), pixel_spacing=(0.085, 0.085), magnification=1.18)
    imager = make_dicom(tmp_path / "imager.dcm", a, spacing=(0.07, 0.07), magnification=1.1)
    _, meta = read_mammogram(both)
    assert (meta["spacing"], meta["spacing_source"]) == ((0.085, 0.085), "PixelSpacing")
    _, meta = read_mammogram(imager)
    # ImagerPixelSpacing as it is: not divided by the magnification factor
    assert (meta["spacing"], meta["spacing_source"]) == ((0.07, 0.07), "ImagerPixelSpacing")
    assert read_dicom_header(both)["spacing_source"] == "PixelSpacing"
    nib.save(nib.Nifti1Image(a.T.astype(np.int16), np.diag([0.2, 0.3, 1, 1])), str(tmp_path / "x.nii.gz"))
    Image.fromarray(a).save(tmp_path / "x.png", dpi=(25.4 / 0.4, 25.4 / 0.4))
    import nrrd

    nrrd.write(str(tmp_path / "x.nrrd"), a, {"spacings": [0.3, 0.2]}, index_order="C")
    for name, source, spacing in [
        ("x.nii.gz", "affine", (0.3, 0.2)),
        ("x.png", "pHYs", (0.4, 0.4)),
        ("x.nrrd", "nrrd", (0.2, 0.3)),
    ]:
        _, meta = read_mammogram(tmp_path / name)
        assert meta["spacing"] == pytest.approx(spacing, rel=1e-3), name
        assert meta["spacing_source"] == source, name
        assert _loaded_meta(tmp_path / name)["spacing_source"] == source


# -------------------------------------------------------------------------------------------- modality


def test_cr_chest_radiograph_is_refused_unless_opted_in(tmp_path):
    chest = np.full((40, 32), 900, np.uint16)
    path = make_dicom(
        tmp_path / "chest.dcm",
        chest,
        modality="CR",
        body_part="CHEST",
        sop_class=CR_IMAGE_STORAGE,
        laterality=None,
        view_position="PA",
    )
    message = _refused(path, "not a mammogram")
    assert "Modality CR" in message and "BodyPartExamined CHEST" in message
    # the flag the user passes, not the reader's keyword alone
    assert message.endswith(
        "to read it anyway, pass --accept_non_mammography true to inference "
        "(MammogramReader(accept_non_mammography=True) in Python)"
    )
    with pytest.raises(MammogramReadError, match="not a mammogram"):
        LoadImaged("image", reader=MammogramReader())({"image": str(path)})
    arr, meta = read_mammogram(path, accept_non_mammography=True)
    np.testing.assert_array_equal(arr, chest)
    assert (meta["modality"], meta["body_part"]) == ("CR", "CHEST")
    assert _loaded_meta(path, accept_non_mammography=True)["modality"] == "CR"
    assert read_mammogram(path, mask=True)[0].shape == (40, 32)  # masks are never refused for their modality
    assert "not a mammogram" in read_dicom_header(path)["mammography_problem"]


def test_cr_mammogram_with_body_part_breast_is_read(tmp_path):
    a = breast()
    path = make_dicom(tmp_path / "crm.dcm", a, modality="CR", body_part="BREAST", sop_class=CR_IMAGE_STORAGE)
    arr, meta = read_mammogram(path)
    np.testing.assert_array_equal(arr, a)
    assert (meta["modality"], meta["body_part"]) == ("CR", "BREAST")
    assert read_dicom_header(path)["mammography_problem"] is None


@pytest.mark.parametrize(
    "modality, body_part, sop_class, accepted",
    [
        ("MG", None, None, True),
        ("MG", "CHEST", None, True),
        ("CR", "BREAST", None, True),
        ("DX", "Breast", None, True),
        ("CR", None, "1.2.840.10008.5.1.4.1.1.1.2.1", True),  # Digital Mammography For Processing
        (None, None, None, True),  # exports that drop both
        ("CR", "CHEST", None, False),
        ("CT", None, "1.2.840.10008.5.1.4.1.1.2", False),
        (None, "CHEST", None, False),
        ("OT", None, None, False),
    ],
)
def test_mammography_policy(modality, body_part, sop_class, accepted):
    assert (mammography_problem(modality, body_part, sop_class) is None) == accepted


# ------------------------------------------------------------------------------------------ MONOCHROME1


def test_monochrome1_with_window_has_a_zero_background(tmp_path):
    """A CR-style MONOCHROME1 mammogram: the unattenuated background is stored high and noisy (3900-4095), tissue
    lower where denser; its window ends below the background. After the reader the background is exactly 0 and
    denser tissue is brighter."""
    rng = np.random.default_rng(0)
    tissue = breast(side="right", base=0)
    inside = breast(side="right") > 0
    stored = np.where(inside, 3000 - tissue, rng.integers(3900, 4096, size=tissue.shape)).astype(np.uint16)
    path = make_dicom(
        tmp_path / "m1.dcm", stored, photometric="MONOCHROME1", window=(2500.0, 1600.0), modality="CR",
        body_part="BREAST", laterality=None, view_position=None, patient_orientation=("P", "L"),
    )  # fmt: skip
    arr, meta = read_mammogram(path)
    windowed = linear_window(stored, 2500.0, 1600.0, 12)
    np.testing.assert_allclose(arr, windowed.max() - windowed, rtol=1e-5, atol=1e-3)
    assert (arr[~inside] == 0).all()
    assert (arr[inside] > 0).all()
    denser, lighter = np.unravel_index(np.argmin(np.where(inside, stored, 65535)), stored.shape), (20, 23)
    assert arr[denser] > arr[lighter]
    assert (meta["laterality"], meta["view"]) == ("R", "CC")
    # the same through a VOI LUT Sequence (the LUT rises with the stored value; the background maps to its top)
    lut = list(np.linspace(0, 65535, 4096 - 1200).astype(int))
    arr_lut, _ = read_mammogram(
        make_dicom(tmp_path / "m1lut.dcm", stored, photometric="MONOCHROME1", voi_lut=(1200, lut), modality="MG")
    )
    mapped = np.asarray(lut, np.float64)[np.clip(stored.astype(int) - 1200, 0, len(lut) - 1)]
    np.testing.assert_array_equal(arr_lut, (mapped.max() - mapped).astype(np.float32))
    assert (arr_lut[stored >= 4095] == 0).all() and (arr_lut[inside] > 0).all()


def test_monochrome1_padding_stays_background(tmp_path):
    """A CR MONOCHROME1 image whose unexposed border is padded with 0 (PixelPaddingValue 0): inverted naively it
    would be the brightest frame around the breast; the reader makes it background (0), and the inversion's top is
    taken from the exposed pixels only."""
    tissue = breast(side="left", base=0)
    inside = breast(side="left") > 0
    stored = np.where(inside, 3000 - tissue, 4000).astype(np.uint16)
    stored[:, -4:] = 0  # padded border
    stored[:3, :] = 5  # padded too, via the range limit
    path = make_dicom(tmp_path / "pad.dcm", stored, photometric="MONOCHROME1", padding=(0, 5), body_part="BREAST")
    arr, _ = read_mammogram(path)
    padded = stored <= 5
    expected = 4000.0 - stored.astype(np.float64)
    expected[padded] = 0
    np.testing.assert_array_equal(arr, expected.astype(np.float32))
    assert (arr[padded] == 0).all() and (arr[inside & ~padded] > 0).all()
    # without the tag the same values are pixels: the 0 border inverts to the maximum
    plain, _ = read_mammogram(make_dicom(tmp_path / "nopad.dcm", stored, photometric="MONOCHROME1"))
    assert (plain[3:, -1] == 4000).all()


# ------------------------------------------------------------------------------------------ size caps


def test_pydicom_written_deflated_mammogram_reads_like_the_plain_one(tmp_path):
    a = breast()
    ds = make_dataset(a, patient_orientation=("A", "FR"), view_position=None)
    ds.file_meta.TransferSyntaxUID = DEFLATED
    path = save(ds, tmp_path / "deflated.dcm")
    assert pydicom.dcmread(path).file_meta.TransferSyntaxUID == DEFLATED
    arr, meta = read_mammogram(path)
    np.testing.assert_array_equal(arr, a)
    assert (meta["transfer_syntax"], meta["view"], meta["view_source"]) == (DEFLATED, "MLO", "PatientOrientation")
    assert read_dicom_header(path)["rows"] == 40


def _peak_bytes(fn) -> tuple[int, BaseException | None]:
    tracemalloc.start()
    error = None
    try:
        fn()
    except BaseException as err:  # noqa: BLE001 - handed back to the test
        error = err
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak, error


def test_deflated_dicom_bomb_is_refused_before_inflating(tmp_path):
    """4 MB on disk, a header claiming 60000 x 60000 and 4 GiB of zero pixel bytes once inflated (pydicom's dcmread
    would inflate all of it): refused with the size, the cap and the option, Python's peak allocation < 64 MB."""
    path = save_deflated_bomb(
        make_dataset(None, rows_cols=(60000, 60000)), tmp_path / "bomb.dcm", (1 << 32) - (1 << 20)
    )
    assert os.path.getsize(path) < 8 << 20
    start = time.perf_counter()
    peak, error = _peak_bytes(lambda: read_mammogram(path))
    assert isinstance(error, MammogramReadError), error
    message = str(error)
    for phrase in (str(path), "60000 x 60000", "3,600,000,000 pixels", "178,956,970", "max_pixels"):
        assert phrase in message, message
    assert "Modality/VOI LUT" not in message
    assert peak < 64 << 20, peak
    assert time.perf_counter() - start < 10
    with pytest.raises(MammogramReadError, match="decoded-size cap"):
        read_dicom_header(path)
    with pytest.raises(MammogramReadError, match="decoded-size cap"):
        LoadImaged("image", reader=MammogramReader())({"image": str(path)})


def test_deflated_dicom_with_more_data_than_its_header_states_is_refused(tmp_path):
    """A header claiming 64 x 64 pixels followed by 1 GiB of inflated zeros: inflation stops a little past what the
    header implies (64 x 64 x 2 bytes + 16 MiB)."""
    path = save_deflated_bomb(make_dataset(None, rows_cols=(64, 64)), tmp_path / "liar.dcm", 1 << 30)
    peak, error = _peak_bytes(lambda: read_mammogram(path))
    assert isinstance(error, MammogramReadError), error
    assert "inflates past" in str(error) and "64 x 64" in str(error) and str(path) in str(error)
    assert peak < 80 << 20, peak


def _gzip_of_zeros(header: bytes, zero_bytes: int) -> bytes:
    """A gzip member holding ``header`` then ``zero_bytes`` zeros, from repeated full-flush deflate segments."""
    mib = 1 << 20
    compressor = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    segments = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    segment = segments.compress(bytes(mib)) + segments.flush(zlib.Z_FULL_FLUSH)
    crc = zlib.crc32(header)
    zero_mib = bytes(mib)
    for _ in range(zero_bytes // mib):
        crc = zlib.crc32(zero_mib, crc)
    body = compressor.compress(header) + compressor.flush(zlib.Z_FULL_FLUSH)
    body += segment * (zero_bytes // mib) + compressor.flush()
    size = (len(header) + zero_bytes) & 0xFFFFFFFF
    return b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff" + body + struct.pack("<II", crc, size)


def test_nifti_bomb_is_refused_from_its_header(tmp_path):
    """A 1 MB .nii.gz whose header states 20000 x 20000 int16 and whose data inflates to 800 MB."""
    img = nib.Nifti1Image(np.zeros((2, 2), np.int16), np.eye(4))
    img.header.set_data_shape((20000, 20000))
    header = img.header.binaryblock + b"\x00" * 4  # 348-byte header + extension flag, data at offset 352
    path = tmp_path / "bomb.nii.gz"
    path.write_bytes(_gzip_of_zeros(header, 20000 * 20000 * 2))
    assert os.path.getsize(path) < 2 << 20
    with gzip.open(path) as f:  # a valid file: nibabel sees the claimed shape
        assert nib.Nifti1Header.from_fileobj(f).get_data_shape() == (20000, 20000)
    peak, error = _peak_bytes(lambda: read_mammogram(path))
    assert isinstance(error, MammogramReadError), error
    assert "20000 x 20000" in str(error) and "max_pixels" in str(error) and str(path) in str(error)
    assert peak < 32 << 20, peak


def test_metaimage_and_nrrd_headers_are_checked_before_reading(tmp_path):
    mha = tmp_path / "big.mha"
    mha.write_bytes(
        b"ObjectType = Image\nNDims = 2\nDimSize = 30000 30000\nElementType = MET_USHORT\nElementDataFile = LOCAL\n"
    )
    assert "30000 x 30000" in _refused(mha, "decoded-size cap")
    nrrd_path = tmp_path / "big.nrrd"
    nrrd_path.write_bytes(b"NRRD0004\ntype: uint16\ndimension: 2\nsizes: 30000 30000\nencoding: raw\n\n")
    _refused(nrrd_path, "decoded-size cap")
    png = tmp_path / "small.png"
    Image.fromarray(breast()).save(png)
    _refused(png, "exceeds the decoded-size cap of 500 pixels", max_pixels=500)
    assert read_mammogram(png, max_pixels=None)[0].shape == (40, 24)


def test_new_meta_collates(tmp_path):
    a = cbis_like(tmp_path / "a.dcm", breast())
    b = tmp_path / "b.png"
    Image.fromarray(breast()).save(b)
    loader = LoadImaged("image", reader=MammogramReader())
    batch = list_data_collate([loader({"image": str(a)}), loader({"image": str(b)})])
    assert list(batch["image"].meta["view_source"]) == ["PatientOrientation", ""]
    assert list(batch["image"].meta["modality"]) == ["MG", ""]
    assert list(batch["image"].meta["laterality_source"]) == ["PatientOrientation", "image"]
