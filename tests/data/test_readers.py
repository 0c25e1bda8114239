"""Readers: every format lands in (H, W), DICOM intensity handling, tags, compressed syntaxes, bad input."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import nibabel as nib
import nrrd
import numpy as np
import pydicom
import pytest
from _dicom_factory import linear_window, make_dataset, make_dicom, save
from monai.data import list_data_collate
from monai.transforms import LoadImaged
from PIL import Image

from scripts.data.dicom_files import read_dicom_header
from scripts.data.readers import MammogramReader, MammogramReadError, read_mammogram

PYDICOM_TEST_FILES = Path(pydicom.__file__).parent / "data" / "test_files"


def breast_like(h: int = 40, w: int = 24, side: str = "left") -> np.ndarray:
    """uint16 (H, W): a half-disc against the ``side`` edge with a unique value per pixel (no symmetry)."""
    rows, cols = np.mgrid[:h, :w]
    dist = cols if side == "left" else (w - 1 - cols)
    inside = ((rows - h / 2) / (h / 2)) ** 2 + (dist / (0.8 * w)) ** 2 < 1
    values = 100 + rows * w + cols
    return np.where(inside, values, 0).astype(np.uint16)


def write_png(path: Path, arr: np.ndarray) -> Path:
    Image.fromarray(arr).save(path)
    return path


# ------------------------------------------------------------------------------------------- conventions


def test_all_formats_load_identically_as_rows_by_columns(tmp_path):
    """The same displayed picture written by each format's own tool loads as the same (H, W) array."""
    import itk

    a = breast_like(40, 24)
    files = {
        "png": write_png(tmp_path / "x.png", a),
        "dcm": make_dicom(tmp_path / "x.dcm", a),
    }
    # ITK's writers are the reference for the x-first index convention of MHA and NIfTI
    img = itk.image_from_array(a)  # numpy (rows, cols) -> ITK size [cols, rows]
    img.SetSpacing([0.5, 0.25])  # (x = column, y = row) spacing
    itk.imwrite(img, str(tmp_path / "x.mha"))
    itk.imwrite(img, str(tmp_path / "x.nii.gz"))
    files["mha"] = tmp_path / "x.mha"
    files["nii.gz"] = tmp_path / "x.nii.gz"
    nrrd.write(str(tmp_path / "x.nrrd"), a, index_order="C")  # C order: sizes written as [cols, rows]
    files["nrrd"] = tmp_path / "x.nrrd"
    # nibabel with the data stored x-first, as ITK stores it
    nib.save(nib.Nifti1Image(a.T.astype(np.int16), np.eye(4)), str(tmp_path / "y.nii"))
    files["nii"] = tmp_path / "y.nii"

    loader = LoadImaged("image", reader=MammogramReader())
    for fmt, path in files.items():
        arr, meta = read_mammogram(path)
        assert arr.shape == (40, 24), fmt
        assert arr.dtype == np.float32
        np.testing.assert_array_equal(arr, a.astype(np.float32), err_msg=fmt)
        loaded = loader({"image": str(path)})["image"]
        assert tuple(loaded.shape) == (1, 40, 24), fmt
        np.testing.assert_array_equal(loaded[0].numpy(), a.astype(np.float32), err_msg=fmt)
        assert loaded.meta["filename_or_obj"] == str(path)
        assert list(loaded.meta["spatial_shape"]) == [40, 24]
    assert read_mammogram(files["mha"])[1]["spacing"] == pytest.approx((0.25, 0.5))
    assert read_mammogram(files["dcm"])[1]["spacing"] == pytest.approx((0.07, 0.08))
    assert read_mammogram(files["png"])[1]["spacing"] is None


def test_png_phys_chunk_is_the_spacing(tmp_path):
    """A PNG's pHYs chunk (pixels per metre, x = columns first) is the (row, col) spacing; absent, in unknown units
    (aspect ratio only) or at an image editor's default 72 / 96 dpi it says nothing: None (NaN in MONAI's meta)."""
    a = breast_like(40, 24)
    Image.fromarray(a).save(tmp_path / "aniso.png", dpi=(25.4 / 0.4, 25.4 / 0.5))  # col 0.4 mm, row 0.5 mm
    assert read_mammogram(tmp_path / "aniso.png")[1]["spacing"] == pytest.approx((0.5, 0.4))
    loaded = LoadImaged("image", reader=MammogramReader())({"image": str(tmp_path / "aniso.png")})["image"]
    np.testing.assert_allclose(loaded.meta["spacing"], (0.5, 0.4))
    np.testing.assert_allclose(np.diag(np.asarray(loaded.affine))[:2], (0.5, 0.4))  # affine axis 0 = rows
    mask = np.where(a > 0, 255, 0).astype(np.uint8)
    Image.fromarray(mask).save(tmp_path / "mask.png", dpi=(25.4 / 0.1, 25.4 / 0.1))
    assert read_mammogram(tmp_path / "mask.png", mask=True)[1]["spacing"] == pytest.approx((0.1, 0.1))
    for dpi in (72, 96):
        Image.fromarray(a).save(tmp_path / f"editor{dpi}.png", dpi=(dpi, dpi))
        assert read_mammogram(tmp_path / f"editor{dpi}.png")[1]["spacing"] is None
    # unit 0 (unknown): only an aspect ratio; PIL writes no such chunk, so splice one in before IDAT
    raw = write_png(tmp_path / "plain.png", a).read_bytes()
    body = struct.pack(">IIB", 2500, 2500, 0)
    chunk = struct.pack(">I", len(body)) + b"pHYs" + body + struct.pack(">I", zlib.crc32(b"pHYs" + body))
    idat = raw.index(b"IDAT") - 4
    (tmp_path / "aspect.png").write_bytes(raw[:idat] + chunk + raw[idat:])
    assert Image.open(tmp_path / "aspect.png").info.get("aspect") == (2500, 2500)
    assert read_mammogram(tmp_path / "aspect.png")[1]["spacing"] is None
    # TIFF resolution tags are not read as spacing (scanners and editors fill them with screen values)
    Image.fromarray(a).save(tmp_path / "x.tif", dpi=(254, 254))
    assert read_mammogram(tmp_path / "x.tif")[1]["spacing"] is None


def test_suffixless_dicom_is_sniffed(tmp_path):
    a = breast_like()
    path = make_dicom(tmp_path / "IMG0001", a)
    arr, meta = read_mammogram(path)
    assert meta["format"] == "dicom"
    np.testing.assert_array_equal(arr, a)


# ---------------------------------------------------------------------------------------- DICOM intensity


def test_monochrome1_is_inverted_so_tissue_is_bright(tmp_path):
    tissue = breast_like()
    stored = np.where(tissue > 0, 4095 - tissue, 4095).astype(np.uint16)  # MONOCHROME1: background saturated
    arr, meta = read_mammogram(make_dicom(tmp_path / "m1.dcm", stored, photometric="MONOCHROME1"))
    assert meta["photometric"] == "MONOCHROME1"
    np.testing.assert_array_equal(arr, (4095 - stored.astype(np.float64)).astype(np.float32))
    assert arr[0, -1] == 0  # background corner
    assert arr[20, 0] > 0  # chest wall tissue


def test_rescale_slope_intercept_applied(tmp_path):
    a = breast_like()
    arr, _ = read_mammogram(make_dicom(tmp_path / "r.dcm", a, rescale=(2.0, 100.0)))
    np.testing.assert_allclose(arr, a * 2.0 + 100.0)


def test_window_applied_unless_disabled(tmp_path):
    a = breast_like()
    path = make_dicom(tmp_path / "w.dcm", a, window=(600.0, 800.0))
    arr, _ = read_mammogram(path)
    np.testing.assert_allclose(arr, linear_window(a, 600.0, 800.0, 12), rtol=1e-5, atol=1e-3)
    raw, _ = read_mammogram(path, apply_voi=False)
    np.testing.assert_array_equal(raw, a)


def test_voi_lut_sequence_applied(tmp_path):
    a = (np.arange(40 * 24).reshape(40, 24) % 50 + 1).astype(np.uint16)
    lut = [(7 * i) % 1000 + 1 for i in range(40)]  # maps stored values 10..49; below/above clamp to ends
    arr, _ = read_mammogram(make_dicom(tmp_path / "lut.dcm", a, voi_lut=(10, lut)))
    expected = np.asarray(lut, dtype=np.float64)[np.clip(a.astype(int) - 10, 0, len(lut) - 1)]
    np.testing.assert_array_equal(arr, expected)


def test_monochrome1_with_window_inverts_after_windowing(tmp_path):
    stored = np.where(breast_like() > 0, 1000, 4000).astype(np.uint16)
    arr, _ = read_mammogram(
        make_dicom(tmp_path / "m1w.dcm", stored, photometric="MONOCHROME1", window=(2000.0, 3000.0))
    )
    windowed = linear_window(stored, 2000.0, 3000.0, 12)
    np.testing.assert_allclose(arr, windowed.max() - windowed, rtol=1e-5, atol=1e-3)


# ------------------------------------------------------------------------------------------ compression


def _compress(ds, syntax, arr):
    if not hasattr(ds, "compress"):
        pytest.skip(f"pydicom {pydicom.__version__} has no Dataset.compress")
    try:
        ds.compress(syntax, arr)
    except (RuntimeError, NotImplementedError, ValueError) as err:
        pytest.skip(f"no encoder for {syntax.name} in this environment: {err}")


@pytest.mark.parametrize("syntax_name", ["RLELossless", "JPEG2000Lossless"])
def test_compressed_dicom_decodes_to_the_original_pixels(tmp_path, syntax_name):
    """RLE (pydicom's own encoder) and JPEG 2000 (pylibjpeg-openjpeg's encoder; pydicom >= 3) round trips."""
    syntax = getattr(pydicom.uid, syntax_name)
    a = breast_like(64, 48)  # OpenJPEG needs >= 32 px per side for its default 6 resolutions
    ds = make_dataset(a)
    _compress(ds, syntax, a)
    path = save(ds, tmp_path / f"{syntax_name}.dcm")
    assert pydicom.dcmread(path).file_meta.TransferSyntaxUID == syntax
    arr, meta = read_mammogram(path)
    assert meta["transfer_syntax"] == str(syntax)
    np.testing.assert_array_equal(arr, a)


@pytest.mark.parametrize("name", ["MR_small_jpeg_ls_lossless.dcm", "MR_small_jp2klossless.dcm", "MR_small_RLE.dcm"])
def test_pydicom_reference_files_decode_like_the_uncompressed_one(name):
    """JPEG-LS has no encoder here (pyjpegls is not a dependency): pydicom's own lossless sample files of
    the same image stand in, compared with the uncompressed MR_small.dcm (an MR image: read with the opt-in for
    non-mammograms)."""
    if not (PYDICOM_TEST_FILES / name).is_file():
        pytest.skip(f"{name} not shipped with pydicom {pydicom.__version__}")
    reference, _ = read_mammogram(PYDICOM_TEST_FILES / "MR_small.dcm", accept_non_mammography=True)
    arr, meta = read_mammogram(PYDICOM_TEST_FILES / name, accept_non_mammography=True)
    np.testing.assert_array_equal(arr, reference)
    assert meta["transfer_syntax"] != pydicom.uid.ExplicitVRLittleEndian


# ------------------------------------------------------------------------------------ laterality and view


@pytest.mark.parametrize(
    "kwargs, laterality, view",
    [
        (dict(laterality="R", view_position="MLO"), "R", "MLO"),
        (dict(laterality="L", laterality_keyword="Laterality", view_position=None), "L", None),
        (
            dict(view_position=None, view_code=("R-10226", "SRT", "medio-lateral oblique")),
            "L",
            "MLO",
        ),
        (dict(view_position=None, view_code=("XX-1", "99LOCAL", "Cranio-Caudal")), "L", "CC"),
        (dict(view_position=None, view_code=("399162004", "SCT", "whatever")), "L", "CC"),
    ],
)
def test_laterality_and_view_from_tags(tmp_path, kwargs, laterality, view):
    path = make_dicom(tmp_path / "t.dcm", breast_like(), **kwargs)
    _, meta = read_mammogram(path)
    assert (meta["laterality"], meta["view"]) == (laterality, view)
    assert meta["laterality_source"] == "dicom"
    header = read_dicom_header(path)
    assert (header["laterality"], header["view"]) == (laterality, view)


@pytest.mark.parametrize("side, expected", [("left", "L"), ("right", "R")])
def test_laterality_inferred_from_chest_wall_side_without_tags(tmp_path, side, expected):
    path = make_dicom(tmp_path / "n.dcm", breast_like(side=side), laterality=None)
    _, meta = read_mammogram(path)
    assert (meta["laterality"], meta["laterality_source"]) == (expected, "image")
    _, meta = read_mammogram(write_png(tmp_path / "n.png", breast_like(side=side)))
    assert (meta["laterality"], meta["laterality_source"]) == (expected, "image")
    assert read_mammogram(path, infer_laterality=False)[1]["laterality"] is None


def test_read_dicom_header_does_not_need_pixels(tmp_path):
    ds = make_dataset(None, patient_id="P-42", laterality="R", view_position="CC")
    path = save(ds, tmp_path / "h.dcm")
    header = read_dicom_header(path)
    assert header["patient_id"] == "P-42"
    assert (header["study_uid"], header["series_uid"], header["sop_uid"]) == (
        ds.StudyInstanceUID,
        ds.SeriesInstanceUID,
        ds.SOPInstanceUID,
    )
    assert (header["rows"], header["cols"], header["frames"], header["modality"]) == (4, 4, 1, "MG")
    assert header["spacing"] == pytest.approx((0.07, 0.08))


def test_monai_meta_is_collatable(tmp_path):
    with_tags = make_dicom(tmp_path / "a.dcm", breast_like(), laterality="R", view_position="MLO")
    without = make_dicom(tmp_path / "b.dcm", breast_like(), laterality=None, view_position=None, patient_id=None)
    loader = LoadImaged("image", reader=MammogramReader())
    items = [loader({"image": str(with_tags)}), loader({"image": str(without)})]
    assert items[0]["image"].meta["laterality"] == "R"
    assert items[1]["image"].meta["view"] == ""
    batch = list_data_collate(items)
    assert tuple(batch["image"].shape) == (2, 1, 40, 24)
    assert list(batch["image"].meta["laterality"]) == ["R", "L"]
    assert list(batch["image"].meta["view"]) == ["MLO", ""]


# ----------------------------------------------------------------------------------------------- bad input


def _raises(path: Path, phrase: str, **kwargs) -> MammogramReadError:
    with pytest.raises(MammogramReadError) as info:
        read_mammogram(path, **kwargs)
    message = str(info.value)
    assert str(path) in message and phrase in message, message
    assert isinstance(info.value, ValueError)
    return info.value


def test_truncated_png(tmp_path):
    full = write_png(tmp_path / "full.png", breast_like(200, 120)).read_bytes()
    path = tmp_path / "truncated.png"
    path.write_bytes(full[: len(full) // 2])
    _raises(path, "truncated")


def test_dicom_without_pixel_data(tmp_path):
    _raises(save(make_dataset(None), tmp_path / "nopix.dcm"), "no pixel data")


def test_text_file_named_dcm(tmp_path):
    path = tmp_path / "notes.dcm"
    path.write_text("patient list\nnot an image\n")
    _raises(path, "not a DICOM file")


def test_rgb_png(tmp_path):
    path = tmp_path / "rgb.png"
    Image.fromarray(np.zeros((20, 10, 3), np.uint8) + 5).save(path)
    _raises(path, "single-channel grayscale")


def test_all_zero_image_rejected_but_allowed_as_mask(tmp_path):
    path = write_png(tmp_path / "zero.png", np.zeros((20, 10), np.uint16))
    _raises(path, "all pixels are zero")
    arr, _ = read_mammogram(path, mask=True)
    assert arr.shape == (20, 10) and not arr.any()


def test_multi_frame_dicom(tmp_path):
    frames = np.stack([breast_like(), breast_like()])
    _raises(make_dicom(tmp_path / "mf.dcm", frames), "tomosynthesis / multi-frame inputs are out of scope")


def test_3d_nifti(tmp_path):
    path = tmp_path / "vol.nii.gz"
    nib.save(nib.Nifti1Image(np.ones((8, 6, 3), np.int16), np.eye(4)), str(path))
    _raises(path, "tomosynthesis / multi-frame inputs are out of scope")


def test_missing_and_unsupported_files(tmp_path):
    _raises(tmp_path / "absent.png", "file not found")
    _raises(tmp_path / "absent.dcm", "file not found")
    odd = tmp_path / "table.csv"
    odd.write_text("a,b\n")
    _raises(odd, "unsupported file type")


def test_corrupt_png_data(tmp_path):
    """A PNG whose compressed pixel stream is garbage is reported, not decoded into noise."""

    def chunk(tag: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))

    data = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", 16, 16, 8, 0, 0, 0, 0))
        + chunk(b"IDAT", b"this is not a deflate stream" * 4)
        + chunk(b"IEND", b"")
    )
    path = tmp_path / "garbage.png"
    path.write_bytes(data)
    _raises(path, "corrupt")


def test_errors_surface_through_loadimaged(tmp_path):
    """MONAI's LoadImage retries other readers when ``read`` fails; ours fails in ``get_data`` so the clear
    error reaches the caller instead of "cannot find a suitable reader"."""
    path = tmp_path / "rgb.png"
    Image.fromarray(np.zeros((20, 10, 3), np.uint8) + 5).save(path)
    with pytest.raises(MammogramReadError, match="single-channel grayscale"):
        LoadImaged("image", reader=MammogramReader())({"image": str(path)})


def test_dicom_with_truncated_pixel_data(tmp_path):
    ds = make_dataset(breast_like())
    ds.PixelData = ds.PixelData[: len(ds.PixelData) // 3]
    _raises(save(ds, tmp_path / "short.dcm"), "cannot decode pixel data")


# ------------------------------------------------------------------------------------------- odd header values
ODD_VALUES = [  # (tag, bytes as a scanner wrote them, the one line expected after "<file>: ")
    (0x00280030, b"0.07", "PixelSpacing (0028,0030) must be two numbers (row\\column spacing in mm), got '0.07'"),
    (0x00181164, b"0.1", "ImagerPixelSpacing (0018,1164) must be two numbers (row\\column spacing in mm), got '0.1'"),
    (
        0x00280030,
        b"abc\\def",
        "PixelSpacing (0028,0030) must be two numbers (row\\column spacing in mm), got 'abc\\def'",
    ),
    (
        0x00280030,
        b"0.1\\0.1\\0.1",
        "PixelSpacing (0028,0030) must be two numbers (row\\column spacing in mm), got '0.1\\0.1\\0.1'",
    ),  # fmt: skip
    (0x00280008, b"x", "NumberOfFrames (0028,0008) must be one whole number, got 'x'"),
    (0x00280008, b"1\\2", "NumberOfFrames (0028,0008) must be one whole number, got '1\\2'"),
    (0x00200062, b"L\\R", "ImageLaterality (0020,0062) must be one value, got 'L\\R'"),
    (0x00185101, b"CC\\MLO", "ViewPosition (0018,5101) must be one value, got 'CC\\MLO'"),
    (0x00080060, b"MG\\CR", "Modality (0008,0060) must be one value, got 'MG\\CR'"),
    (0x00281053, b"abc", "RescaleSlope (0028,1053) must be one number, got 'abc'"),
    (0x00281050, b"high", "WindowCenter (0028,1050) must be numbers, got 'high'"),
]


@pytest.mark.parametrize("tag, raw, line", ODD_VALUES, ids=[f"{t:08X}-{r.decode()}" for t, r, _ in ODD_VALUES])
def test_an_odd_header_value_is_one_line_naming_the_tag_and_the_file(tmp_path, tag, raw, line):
    """A value of another multiplicity than the standard's (one PixelSpacing value, two lateralities) or text where
    a number belongs is refused by both readers with one line naming the file and the tag; before, one spacing value
    was ``TypeError: 'DSfloat' object is not iterable``, text spacing fell through silently to the next tag, and a
    two-valued ViewPosition became the view "['CC', 'MLO']". Written as the bytes a scanner writes (pydicom refuses
    to write most of them)."""
    from _dicom_factory import set_raw_value

    path = make_dicom(
        tmp_path / "odd.dcm", breast_like(), pixel_spacing=(0.05, 0.05), rescale=(1, 0), window=(900, 800)
    )
    if tag == 0x00280008:  # NumberOfFrames is written only for multi-frame data: add it, then spoil it
        ds = pydicom.dcmread(path)
        ds.NumberOfFrames = 1
        save(ds, path)
    set_raw_value(path, tag, raw)
    for read in (read_mammogram, read_dicom_header):
        with pytest.raises(MammogramReadError) as err:
            read(path)
        assert str(err.value) == f"{path}: {line}"


def test_one_spacing_value_as_pydicom_writes_it_and_empty_tags(tmp_path):
    """pydicom writes ``ds.PixelSpacing = "0.07"`` as one value (DSfloat when read, pydicom 2.4 and 3): refused with
    the tag named; an empty PixelSpacing states nothing, so ImagerPixelSpacing is read; an empty ViewPosition
    likewise."""
    ds = make_dataset(breast_like(), spacing=(0.07, 0.08))
    ds.PixelSpacing = "0.07"
    path = save(ds, tmp_path / "one.dcm")
    with pytest.raises(MammogramReadError, match=r"one\.dcm: PixelSpacing \(0028,0030\) must be two numbers"):
        read_mammogram(path)
    ds.PixelSpacing = None
    ds.ViewPosition = ""
    path = save(ds, tmp_path / "empty.dcm")
    meta = read_mammogram(path)[1]
    assert meta["spacing"] == (0.07, 0.08) and meta["spacing_source"] == "ImagerPixelSpacing"
    assert read_dicom_header(path)["spacing"] == (0.07, 0.08)


def test_a_dicom_folder_lists_the_odd_file_in_one_line_and_keeps_the_others(tmp_path):
    from _dicom_factory import set_raw_value
    from datalists.builders import items_from_dicom_dir

    make_dicom(tmp_path / "good.dcm", breast_like())
    odd = set_raw_value(make_dicom(tmp_path / "odd.dcm", breast_like(), pixel_spacing=(0.05, 0.05)), 0x00280030, b"1")
    items, skipped = items_from_dicom_dir(tmp_path, relative_to=tmp_path)
    assert [it["image"] for it in items] == ["good.dcm"]
    assert skipped == [f"{odd}: PixelSpacing (0028,0030) must be two numbers (row\\column spacing in mm), got '1'"]
