"""DICOM outputs for PACS (bundle/scripts/inference/dicom.py) through the inference workflow on tiny synthetic
DICOM and PNG inputs: a Secondary Capture of the overlay panel and a FRACTIONAL Segmentation of S_c, both in the
source study and referencing the source image; a PNG input with dicom_outputs set gets none."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from test_inference_workflow import INFERENCE_CONFIG, TINY, TINY_INFERENCE, _nifti_maps, _read_csv, _run

pytest.importorskip("highdicom")
pydicom = pytest.importorskip("pydicom")

#: the Segmentation stores round(S_c x 255) in 8 bits: read back within half a step
SEG_TOLERANCE = 0.5 / 255 + 1e-6


@pytest.fixture(scope="module")
def run_both(tmp_path_factory) -> dict:
    from glam_benchmark.synthetic import make_synthetic_dataset
    from scripts.networks import GLAMSaliencyNet

    root = tmp_path_factory.mktemp("dicom_outputs")
    make_synthetic_dataset(root / "dcm", 2, size=(256, 160), seed=3, fmt="dcm", facing="native")
    make_synthetic_dataset(root / "png", 1, size=(256, 160), seed=4, fmt="png")
    folder = root / "in"
    folder.mkdir()
    for f in sorted((root / "dcm" / "images").iterdir())[:2]:
        shutil.copy(f, folder / f.name)
    png = sorted((root / "png" / "images").iterdir())[0]
    shutil.copy(png, folder / f"png_{png.name}")
    torch.manual_seed(0)
    ckpt = root / "model.pt"
    torch.save(GLAMSaliencyNet(stage="joint", **TINY).state_dict(), ckpt)
    out = root / "out"
    overrides = {"input_dir": str(folder), "output_dir": str(out), "ckpt_path": str(ckpt), "dicom_outputs": "both"}
    _run([INFERENCE_CONFIG, TINY_INFERENCE], overrides)
    return {"folder": folder, "out": out, "rows": _read_csv(out / "predictions.csv")}


def test_secondary_capture_is_the_panel_in_the_source_study(run_both):
    from PIL import Image

    out = run_both["out"]
    dicom_rows = [r for r in run_both["rows"] if r["image"].endswith(".dcm")]
    assert len(dicom_rows) == 2 and [e["error"] for e in _read_csv(out / "errors.csv") if e["error"]] == []
    series = set()
    for row in dicom_rows:
        source = pydicom.dcmread(row["image"])
        sc = pydicom.dcmread(out / "dicom" / f"{row['output_stem']}_sc.dcm")
        assert sc.SOPClassUID == "1.2.840.10008.5.1.4.1.1.7"  # Secondary Capture Image Storage
        assert sc.StudyInstanceUID == source.StudyInstanceUID
        assert sc.PatientID == source.PatientID and str(sc.PatientName) == str(source.PatientName)
        assert sc.SeriesInstanceUID != source.SeriesInstanceUID and sc.SOPInstanceUID != source.SOPInstanceUID
        ref = sc.SourceImageSequence[0]
        assert ref.ReferencedSOPInstanceUID == source.SOPInstanceUID
        assert ref.ReferencedSOPClassUID == source.SOPClassUID
        assert sc.PhotometricInterpretation == "RGB" and sc.SamplesPerPixel == 3
        assert list(sc.PatientOrientation) == list(source.PatientOrientation)  # e.g. "FR": the panel keeps it
        panel = np.asarray(Image.open(out / "panels" / f"{row['output_stem']}_panel.png"))
        np.testing.assert_array_equal(sc.pixel_array, panel)
        series.add(sc.SeriesInstanceUID)
    assert len(series) == 2  # a new series per derived object, not the source's


def test_segmentation_holds_s_c_on_the_source_grid(run_both):
    out = run_both["out"]
    for row in (r for r in run_both["rows"] if r["image"].endswith(".dcm")):
        source = pydicom.dcmread(row["image"])
        seg = pydicom.dcmread(out / "dicom" / f"{row['output_stem']}_map.dcm")
        assert seg.SOPClassUID == "1.2.840.10008.5.1.4.1.1.66.4"  # Segmentation Storage
        assert seg.SegmentationType == "FRACTIONAL" and int(seg.MaximumFractionalValue) == 255
        assert seg.StudyInstanceUID == source.StudyInstanceUID and seg.PatientID == source.PatientID
        assert (seg.Rows, seg.Columns) == (source.Rows, source.Columns)
        referenced = seg.ReferencedSeriesSequence[0].ReferencedInstanceSequence[0]
        assert referenced.ReferencedSOPInstanceUID == source.SOPInstanceUID
        assert [s.SegmentLabel for s in seg.SegmentSequence] == ["benign", "malignant"]
        # frame i -> its segment number (1 benign, 2 malignant) and the source image it was derived from
        frames = np.asarray(seg.pixel_array, dtype=np.float64).reshape(-1, seg.Rows, seg.Columns) / 255.0
        s_c = _nifti_maps(out / "maps" / f"{row['output_stem']}_S_c.nii.gz")
        assert frames.shape[0] == 2 and s_c.max() > 0  # a non-zero map: the comparison is not trivial
        for i, group in enumerate(seg.PerFrameFunctionalGroupsSequence):
            segment = int(group.SegmentIdentificationSequence[0].ReferencedSegmentNumber)
            derivation = group.DerivationImageSequence[0].SourceImageSequence[0]
            assert derivation.ReferencedSOPInstanceUID == source.SOPInstanceUID
            np.testing.assert_allclose(frames[i], s_c[segment - 1], atol=SEG_TOLERANCE, rtol=0)


def test_non_dicom_input_gets_no_dicom_outputs(run_both):
    out = run_both["out"]
    png_row = next(r for r in run_both["rows"] if r["image"].endswith(".png"))
    assert (out / "panels" / f"{png_row['output_stem']}_panel.png").exists()
    names = sorted(p.name for p in (out / "dicom").iterdir())
    stems = sorted(r["output_stem"] for r in run_both["rows"] if r["image"].endswith(".dcm"))
    assert names == sorted(f"{s}_{k}.dcm" for s in stems for k in ("map", "sc"))
    assert not list(out.rglob(".tmp*"))  # atomic writes leave no temporary files


def test_dicom_outputs_switch_and_bad_inputs(tmp_path):
    from scripts.inference.dicom import dicom_objects, saliency_segmentation

    bad = tmp_path / "no_uids.dcm"
    ds = pydicom.Dataset()
    ds.Rows, ds.Columns = 4, 4
    ds.file_meta = pydicom.dataset.FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = pydicom.uid.ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.7"
    ds.file_meta.MediaStorageSOPInstanceUID = "1.2.3.4"
    ds.is_little_endian, ds.is_implicit_VR = True, False  # pydicom 2.x writes from these flags
    if int(pydicom.__version__.split(".")[0]) >= 3:
        pydicom.dcmwrite(str(bad), ds, enforce_file_format=True)
    else:
        pydicom.dcmwrite(str(bad), ds, write_like_original=False)
    with pytest.raises(ValueError, match="no_uids.dcm.*lacks StudyInstanceUID"):
        dicom_objects(bad, ("map",), s_c=np.zeros((2, 4, 4)))
    with pytest.raises(ValueError, match=r"S_c must have shape \(2, 4, 4\)"):
        saliency_segmentation(ds, np.zeros((2, 3, 4)))


@pytest.fixture(scope="module")
def odd_headers(tmp_path_factory) -> dict:
    """Four DICOM inputs with DICOM outputs asked for: one plain, one whose SpecificCharacterSet is no character set
    ('ISO_IR 999', a name in Latin-1 bytes), one pydicom knows but highdicom does not write ('ISO_IR 6'), one whose
    ImageLaterality highdicom refuses ('X')."""
    from glam_benchmark.synthetic import make_synthetic_dataset
    from scripts.networks import GLAMSaliencyNet

    root = tmp_path_factory.mktemp("odd_headers")
    make_synthetic_dataset(root / "dcm", 4, size=(256, 160), seed=8, fmt="dcm", facing="native")
    sources = sorted((root / "dcm" / "images").iterdir())[:4]
    folder = root / "in"
    folder.mkdir()
    shutil.copy(sources[0], folder / "plain.dcm")
    edits = {
        "unknown_charset.dcm": {"SpecificCharacterSet": "ISO_IR 999", "PatientName": "Müller^Anna"},
        "ascii_charset.dcm": {"SpecificCharacterSet": "ISO_IR 6", "PatientName": "Smith^Jo"},
        "odd_laterality.dcm": {"ImageLaterality": "X"},
    }
    for source, (name, values) in zip(sources[1:], edits.items()):
        ds = pydicom.dcmread(source)
        for keyword, value in values.items():
            setattr(ds, keyword, value)
        ds.save_as(folder / name)
    torch.manual_seed(0)
    ckpt = root / "model.pt"
    torch.save(GLAMSaliencyNet(stage="joint", **TINY).state_dict(), ckpt)
    out = root / "out"
    overrides = {"input_dir": str(folder), "output_dir": str(out), "ckpt_path": str(ckpt), "dicom_outputs": "both"}
    _run([INFERENCE_CONFIG, TINY_INFERENCE], {**overrides, "num_workers": 1})
    notes = {Path(e["image"]).name: e for e in _read_csv(out / "errors.csv")}
    rows = {Path(r["image"]).name: r for r in _read_csv(out / "predictions.csv")}
    return {"folder": folder, "out": out, "notes": notes, "rows": rows}


def test_an_odd_character_set_falls_back_and_says_so_while_every_image_finishes(odd_headers):
    out, notes, rows = odd_headers["out"], odd_headers["notes"], odd_headers["rows"]
    assert set(rows) == {"plain.dcm", "unknown_charset.dcm", "ascii_charset.dcm", "odd_laterality.dcm"}
    assert not [e for e in notes.values() if e["error"]]  # no image failed
    assert "DICOM outputs" not in notes.get("plain.dcm", {}).get("note", "")
    assert (
        "DICOM outputs: SpecificCharacterSet 'ISO_IR 999' is not a DICOM character set; they state ISO_IR 100 "
        in (notes["unknown_charset.dcm"]["note"])
    )
    assert (
        "SpecificCharacterSet 'ISO_IR 6' is not one highdicom writes; they state ISO_IR 192"
        in (notes["ascii_charset.dcm"]["note"])
    )
    for name, charset in (("unknown_charset", "ISO_IR 100"), ("ascii_charset", "ISO_IR 192")):
        source = pydicom.dcmread(odd_headers["folder"] / f"{name}.dcm")
        for kind in ("sc", "map"):
            written = pydicom.dcmread(out / "dicom" / f"{name}_{kind}.dcm")
            assert written.SpecificCharacterSet == charset
            assert written.StudyInstanceUID == source.StudyInstanceUID
            # the name's bytes (Latin-1 under the unknown set) or its text (ASCII) are kept
            assert written["PatientName"].value == source["PatientName"].value
    assert str(pydicom.dcmread(out / "dicom" / "unknown_charset_sc.dcm").PatientName) == "Müller^Anna"


def test_a_header_highdicom_refuses_fails_the_dicom_outputs_only(odd_headers):
    out, notes, rows = odd_headers["out"], odd_headers["notes"], odd_headers["rows"]
    note = notes["odd_laterality.dcm"]["note"]
    assert "DICOM outputs not written: ValueError: " in note and "'X'" in note
    files = rows["odd_laterality.dcm"]["files"].split(";")
    assert files == ["maps/odd_laterality_S_c.nii.gz", "panels/odd_laterality_panel.png"]
    assert all((out / f).is_file() for f in files)
    assert not list((out / "dicom").glob("odd_laterality*"))
