"""label_app's MONAI Label pieces without a server: the confined datastore, the float32 outputs and the message of
an unreadable image. They import MONAI Label, so they run in the label environment
(test_label_server_security.py runs this file there); in the project's environment they are skipped."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO_ROOT

pytest.importorskip("monailabel")
sys.path.insert(0, str(REPO_ROOT / "label_app"))

import torch  # noqa: E402
from glam_datastore import GLAMDatastore  # noqa: E402
from glam_infer import outputs_as_float32, unreadable_image_message  # noqa: E402
from glam_safety import RequestRefused  # noqa: E402
from monailabel.interfaces.exception import ImageNotFoundException, LabelNotFoundException  # noqa: E402
from PIL import Image  # noqa: E402

from scripts.data.readers import MammogramReadError, read_mammogram  # noqa: E402
from scripts.enums import OutputKey  # noqa: E402

BAD_IDS = ["../outside_marker", "../../pwned", "/abs/path", "..\\x", ".", ".."]


def _png(path: Path, value: int = 100) -> Path:
    Image.fromarray(np.full((8, 6), value, np.uint8)).save(path)
    return path


def _tree(root: Path, skip: Path) -> dict[str, str]:
    """Every file under ``root`` except under ``skip``: relative path -> sha256."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and skip not in p.parents
    }


@pytest.fixture
def layout(tmp_path):
    """``tmp/outer/inner/studies`` with one image, a secret beside it and an upload waiting in a temp folder."""
    studies = tmp_path / "outer" / "inner" / "studies"
    studies.mkdir(parents=True)
    _png(studies / "SYN00000_L_CC.png")
    _png(tmp_path / "outer" / "secret.png", 7)
    (tmp_path / "upload").mkdir()
    return tmp_path, studies, _png(tmp_path / "upload" / "tmpabc12345.png", 50)


def _store(studies: Path) -> GLAMDatastore:
    return GLAMDatastore(str(studies), extensions=["*.png", "*.nrrd"], auto_reload=False)


def test_every_route_method_refuses_paths_and_writes_nothing_outside(layout):
    root, studies, upload = layout
    store = _store(studies)
    before = _tree(root, studies)
    calls = []
    for bad in BAD_IDS:
        calls += [
            ("get_image_uri", lambda b=bad: store.get_image_uri(b)),
            ("get_image_info", lambda b=bad: store.get_image_info(b)),
            ("add_image", lambda b=bad: store.add_image(b, str(upload), {})),
            ("remove_image", lambda b=bad: store.remove_image(b)),
            ("update_image_info", lambda b=bad: store.update_image_info(b, {"a": 1})),
            ("save_label (image)", lambda b=bad: store.save_label(b, str(upload), "final", {})),
            ("save_label (tag)", lambda b=bad: store.save_label("SYN00000_L_CC", str(upload), b, {})),
            ("get_label_uri (tag)", lambda b=bad: store.get_label_uri("SYN00000_L_CC", b)),
            ("get_label_uri (id)", lambda b=bad: store.get_label_uri(b, "final")),
            ("get_label_info", lambda b=bad: store.get_label_info("SYN00000_L_CC", b)),
            ("remove_label", lambda b=bad: store.remove_label("SYN00000_L_CC", b)),
            ("update_label_info", lambda b=bad: store.update_label_info("SYN00000_L_CC", b, {})),
        ]
    for name, call in calls:
        with pytest.raises(RequestRefused) as err:
            call()
        assert err.value.status_code == 400, name
    assert _tree(root, studies) == before
    assert sorted(store.list_images()) == ["SYN00000_L_CC"]


def test_uploads_and_labels_land_in_the_studies_folder(layout):
    _, studies, upload = layout
    store = _store(studies)
    assert store.add_image("new image", str(upload), {"by": "test"}) == "new image"
    assert (studies / "new image.png").read_bytes() == upload.read_bytes()
    assert store.save_label("new image", str(upload), "glam_label", {}) == "new image"
    assert (studies / "labels" / "glam_label" / "new image.png").is_file()
    assert store.get_label_uri("new image", "glam_label") == str(studies / "labels" / "glam_label" / "new image.png")
    with pytest.raises(RequestRefused, match="starts with '.'"):
        store.add_image(".hidden", str(upload), {})
    with pytest.raises(RequestRefused, match="must be a JSON object"):
        store.add_image("x", str(upload), ["not", "a", "dict"])  # type: ignore[arg-type]


def test_file_types_the_datastore_does_not_list_are_refused(layout):
    root, studies, _ = layout
    exe = root / "upload" / "tmpzzz.exe"
    exe.write_bytes(b"MZ")
    store = _store(studies)
    with pytest.raises(RequestRefused, match=r"of type '\.exe'"):
        store.add_image("tool", str(exe), {})
    with pytest.raises(RequestRefused, match="without extension"):
        store.save_label("SYN00000_L_CC", str(exe.with_suffix("")), "final", {})
    assert not list(studies.glob("tool*"))


def test_records_of_an_older_datastore_file_that_lead_outside_are_dropped(layout):
    root, studies, _ = layout
    # what the PUT left behind: the file outside and its record in datastore_v2.json
    _png(root / "outer" / "inner" / "curl_marker.png")
    (studies / "labels" / "x").mkdir(parents=True)
    record = {"ext": ".png", "info": {}}
    (studies / "datastore_v2.json").write_text(
        json.dumps(
            {
                "name": "n",
                "description": "d",
                "images_dir": ".",
                "labels_dir": "labels",
                "objects": {
                    "../curl_marker": {"image": record, "labels": {}},
                    "SYN00000_L_CC": {"image": record, "labels": {"../../pwned": record}},
                },
            }
        )
    )
    store = _store(studies)
    assert store.list_images() == ["SYN00000_L_CC"]
    assert store.get_labels_by_image_id("SYN00000_L_CC") == {}
    kept = json.loads((studies / "datastore_v2.json").read_text())["objects"]
    assert set(kept) == {"SYN00000_L_CC"} and kept["SYN00000_L_CC"]["labels"] == {}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_link_the_owner_put_in_the_folder_is_read_under_its_name_inside(layout):
    root, studies, _ = layout
    target = root / "outer" / "secret.png"
    os.symlink(target, studies / "linked.png")
    store = _store(studies)
    uri = store.get_image_uri("linked")
    assert uri == str(studies / "linked.png")  # the name inside the folder, never where the link leads
    assert Path(uri).read_bytes() == target.read_bytes()
    info = store.get_image_info("linked")
    assert info["path"] == str(studies / "linked.png") and "secret" not in json.dumps(info)


def test_writes_and_deletes_never_go_through_a_link(layout):
    """``studies/link.png -> ../victim.png`` (as the issue's probe), a link to a folder outside, a labels folder
    that is a link: every write and delete is refused (403) and the outside files keep their bytes."""
    root, studies, upload = layout
    victim = studies.parent / "victim.png"
    _png(victim, 9)
    os.symlink("../victim.png", studies / "link.png")
    outside_dir = root / "outer" / "victim_dir"
    outside_dir.mkdir()
    _png(outside_dir / "keep.png", 3)
    os.symlink(outside_dir, studies / "dirlink.png")  # listed as an image: MONAI Label's delete removed its tree
    (studies / "labels").mkdir()
    os.symlink(outside_dir, studies / "labels" / "linked_tag")
    store = _store(studies)
    assert {"link", "dirlink"} <= set(store.list_images())
    before = _tree(root, studies)
    calls = {
        "add_image through the link": lambda: store.add_image("link", str(upload), {}),
        "remove_image of the link": lambda: store.remove_image("link"),
        "remove_image of the folder link": lambda: store.remove_image("dirlink"),
        "save_label into a linked tag": lambda: store.save_label("SYN00000_L_CC", str(upload), "linked_tag", {}),
    }
    for name, call in calls.items():
        with pytest.raises(RequestRefused) as err:
            call()
        assert err.value.status_code == 403, name
        assert str(root) not in str(err.value), name  # the answer names no path
    assert _tree(root, studies) == before
    assert _sha(victim) == _sha(studies / "link.png") and (outside_dir / "keep.png").is_file()
    assert "link" in store.list_images()


def test_a_link_of_another_user_that_leads_outside_is_not_followed(layout, monkeypatch):
    root, studies, _ = layout
    os.symlink(root / "outer" / "secret.png", studies / "planted.png")
    os.symlink("SYN00000_L_CC.png", studies / "alias.png")  # inside the folder: read whoever made it
    store = _store(studies)
    assert store.get_image_uri("planted") == str(studies / "planted.png")  # the server user's own link
    # the server runs as another user than the links' owner (as when someone else planted them)
    monkeypatch.setattr(os, "geteuid", lambda: os.lstat(studies / "planted.png").st_uid + 1)
    with pytest.raises(RequestRefused, match="symbolic link of another user") as err:
        store.get_image_uri("planted")
    assert err.value.status_code == 403 and "secret" not in str(err.value)
    assert store.get_image_uri("alias") == str(studies / "alias.png")


def test_the_datastore_file_may_not_be_a_link(layout):
    root, studies, _ = layout
    secret = root / "outer" / "secret.png"
    digest = _sha(secret)
    os.symlink(secret, studies / "datastore_v2.json")
    with pytest.raises(RequestRefused, match="datastore_v2.json is a symbolic link"):
        _store(studies)
    assert _sha(secret) == digest


def test_a_labels_folder_that_leads_outside_stops_the_datastore(layout):
    """LocalDatastore creates labels/final and labels/original at start: never outside the folder."""
    root, studies, _ = layout
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, studies / "labels")
    with pytest.raises(ValueError, match="labels is a symbolic link that leads outside it"):
        _store(studies)
    assert list(elsewhere.iterdir()) == []


def test_names_that_are_not_utf8_are_left_out_of_listings_and_logged(layout, caplog):
    _, studies, _ = layout
    raw = os.path.join(os.fsencode(studies), b"caf\xe9.png")
    _png(Path(os.fsdecode(raw)))
    (studies / "labels" / "final").mkdir(parents=True)
    _png(Path(os.fsdecode(os.path.join(os.fsencode(studies / "labels" / "final"), b"SYN00000_L_CC\xff.png"))))
    with caplog.at_level("WARNING"):
        store = _store(studies)
    assert store.list_images() == ["SYN00000_L_CC"]
    json.dumps(store.json(), ensure_ascii=False).encode("utf-8")  # every listing can be answered
    json.dumps(store.status()).encode("utf-8")
    assert "'caf\\xe9.png'" in caplog.text and "not valid UTF-8" in caplog.text, caplog.text
    with pytest.raises(RequestRefused, match="not valid UTF-8"):
        store.get_image_uri(os.fsdecode(b"caf\xe9"))


def test_an_upload_is_removed_whether_it_is_stored_or_refused(layout):
    root, studies, _ = layout
    uploads = root / "upload"
    store = GLAMDatastore(str(studies), extensions=["*.png"], auto_reload=False, uploads_dir=uploads)
    kept = _png(uploads / "tmpkeep.png", 1)  # another request's upload: untouched
    for image_id, name in [("../x", "tmp1.png"), ("ok", "tmp2.png"), ("bad", "tmp3.exe"), (".hidden", "tmp4.png")]:
        path = _png(uploads / name, 5) if name.endswith(".png") else uploads / name
        path.write_bytes(path.read_bytes() if path.exists() else b"MZ")
        try:
            store.add_image(image_id, str(path), {})
        except RequestRefused:
            pass
        assert not path.exists(), image_id
    label = _png(uploads / "tmp5.png", 2)
    with pytest.raises(ImageNotFoundException, match="image id 'unknown' is not in the datastore"):
        store.save_label("unknown", str(label), "final", {})
    assert not label.exists()
    assert sorted(p.name for p in uploads.iterdir()) == ["tmpabc12345.png", "tmpkeep.png"] and kept.is_file()
    assert (studies / "ok.png").is_file()


def test_an_archive_of_no_labelled_image_is_not_found(layout):
    with pytest.raises(RequestRefused, match="no image has a final label") as err:
        _store(layout[1]).get_dataset_archive(None)
    assert err.value.status_code == 404


def test_bfloat16_outputs_reach_numpy_as_float32():
    """A network under bf16 autocast on CUDA (or the bf16 CPU copy) returns bfloat16, which numpy cannot hold: the
    app's conversion casts to float32, keeps integer outputs and drops what is not a tensor."""
    saliency = torch.rand(1, 2, 5, 3).to(torch.bfloat16)
    boxes = torch.tensor([[[1, 2, 3, 4]]])
    with pytest.raises(TypeError):
        saliency[0].numpy()  # the failure the conversion prevents
    out = outputs_as_float32({OutputKey.SALIENCY_GLOBAL: saliency, OutputKey.PATCH_BOXES: boxes, "note": "text"})
    assert set(out) == {OutputKey.SALIENCY_GLOBAL, OutputKey.PATCH_BOXES}
    maps = out[OutputKey.SALIENCY_GLOBAL].numpy()
    assert maps.dtype == np.float32 and maps.shape == (2, 5, 3)
    np.testing.assert_array_equal(maps, saliency[0].float().numpy())
    assert out[OutputKey.PATCH_BOXES].dtype == torch.int64 and out[OutputKey.PATCH_BOXES].tolist() == [[1, 2, 3, 4]]


def test_an_unreadable_image_is_reported_by_its_root_cause_without_the_servers_path(tmp_path):
    upload = tmp_path / "glam_label_x" / "tmpq1w2e3r4.png"
    upload.parent.mkdir()
    upload.write_bytes(b"not an image at all")
    try:
        try:
            read_mammogram(upload)
        except MammogramReadError as e:  # as MONAI's Compose wraps it
            raise RuntimeError("applying transform <monai.transforms.compose.Compose object at 0x7f>") from e
    except RuntimeError as wrapped:
        message = unreadable_image_message(wrapped, str(upload), "the uploaded file")
    assert "applying transform" not in message and "0x7f" not in message
    assert str(tmp_path) not in message and upload.name not in message
    assert message and not message.startswith(str(upload))
    # any other error: the type and the message, the path replaced by the client's name
    other = ValueError(f"{upload} has shape (3, 4, 5, 6)")
    assert unreadable_image_message(other, str(upload), "SYN1") == "ValueError: SYN1 has shape (3, 4, 5, 6)"


# -- issue 45: one file, one id; DICOMs copied for the viewers without an invented spacing --------------------------
def _mammo_dicom(path: Path, value: int, spacing=None) -> None:
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from _dicom_factory import make_dataset

    pixels = np.zeros((64, 48), np.uint16)
    pixels[8:56, :30] = value  # a breast against the left edge
    make_dataset(pixels, spacing=spacing, bits_stored=16, patient_id=f"P{value}").save_as(
        str(path), write_like_original=False
    )


def test_dicoms_sharing_a_stem_each_become_an_image_and_nothing_invents_a_spacing(tmp_path, caplog):
    import nrrd
    from ingest import MANIFEST, ingest_dicoms, ingested_source

    studies = tmp_path / "studies"
    studies.mkdir()
    _mammo_dicom(studies / "pat.dcm", 1000)
    _mammo_dicom(studies / "pat.dicom", 2000)
    _mammo_dicom(studies / "pat.DCM", 3000, spacing=(0.1, 0.12))
    _png(studies / "scan.png")
    _mammo_dicom(studies / "scan.dcm", 4000)
    _mammo_dicom(studies / ("a" * 246 + ".dcm"), 5000)
    (studies / "pat.nrrd").write_bytes(b"NRRD0004\n")  # what an earlier ingest wrote for pat.dcm
    report = ingest_dicoms(studies)
    assert sorted(p.name for p in report.converted) == [
        "pat.DCM.nrrd",
        "pat.dcm.nrrd",
        "pat.dicom.nrrd",
        "scan.dcm.nrrd",
    ]
    [(failed, reason)] = report.failed
    assert failed.name.startswith("aaaa") and "rename the file" in reason and "\n" not in reason
    assert any("pat.nrrd beside pat.dcm" in n for n in report.notes)
    for name, value in [("pat.dcm", 1000), ("pat.dicom", 2000), ("pat.DCM", 3000), ("scan.dcm", 4000)]:
        array, header = nrrd.read(str(studies / f"{name}.nrrd"), index_order="C")
        assert array.max() == value and header["glam_source"] == name
        assert ingested_source(studies, studies / f"{name}.nrrd") == studies / name
        assert ("space directions" in header) == (name == "pat.DCM")  # only the DICOM that states one
    np.testing.assert_allclose(
        np.linalg.norm(nrrd.read_header(str(studies / "pat.DCM.nrrd"))["space directions"], axis=1), [0.12, 0.1]
    )
    # a second run keeps the copies; a copy replaced since (an upload) is read as itself, never as the DICOM
    again = ingest_dicoms(studies)
    assert len(again.up_to_date) == 4 and not again.converted
    os.replace(studies / "pat.dicom.nrrd", studies / "moved.tmp")
    (studies / "pat.dicom.nrrd").write_bytes((studies / "moved.tmp").read_bytes())
    assert ingested_source(studies, studies / "pat.dicom.nrrd") is None
    third = ingest_dicoms(studies)  # the replaced copy is left as it is, and said so
    assert [(p.name, "is not ingest's current copy" in r) for p, r in third.failed][-1] == ("pat.dicom", True)
    assert (studies / "pat.dicom.nrrd").read_bytes() == (studies / "moved.tmp").read_bytes()
    assert json.loads((studies / MANIFEST).read_text())["version"] == 1

    (studies / "moved.tmp").unlink()
    store = _store(studies)
    assert sorted(store.list_images()) == ["pat", "pat.DCM", "pat.dcm", "pat.dicom", "scan", "scan.dcm"]
    assert store.get_image_uri("pat.dicom") == str(studies / "pat.dicom.nrrd")


def test_pictures_sharing_a_stem_are_served_under_their_whole_names(layout, caplog):
    import nrrd

    root, studies, upload = layout
    _png(studies / "dup.png", 10)
    nrrd.write(str(studies / "dup.nrrd"), np.full((8, 6), 20, np.uint16), index_order="C")
    _png(studies / "evil\u202egnp.png")
    store = _store(studies)
    assert sorted(store.list_images()) == ["SYN00000_L_CC", "dup.nrrd", "dup.png"]
    assert store.get_image_uri("dup.png") == str(studies / "dup.png")
    assert read_mammogram(store.get_image_uri("dup.nrrd"))[0].max() == 20
    with pytest.raises(ImageNotFoundException, match=r"'dup' is shared by 2 files; each is served under its own id"):
        store.get_image_uri("dup")
    assert "'dup.nrrd' and 'dup.png' share the id 'dup'" in caplog.text and "U+202E" in caplog.text
    # an upload may not take an id that names another file; replacing a file under its own name is allowed
    nrrd.write(str(root / "upload" / "tmpx.nrrd"), np.ones((8, 6), np.uint16), index_order="C")
    with pytest.raises(RequestRefused, match="already names SYN00000_L_CC.png") as err:
        store.add_image("SYN00000_L_CC", str(root / "upload" / "tmpx.nrrd"), {})
    assert err.value.status_code == 409 and not (studies / "SYN00000_L_CC.nrrd").exists()
    with pytest.raises(RequestRefused, match="already names dup.nrrd, dup.png"):
        store.add_image("dup", str(upload), {})
    again = _png(root / "upload" / "tmpagain.png", 60)
    assert store.add_image("SYN00000_L_CC", str(again), {}) == "SYN00000_L_CC"  # the same file, replaced
    assert read_mammogram(studies / "SYN00000_L_CC.png")[0].max() == 60


def test_an_image_the_datastore_has_not_is_one_404_wording_on_every_route(layout):
    """An unknown id, an id two files share and a listed image whose file was removed are each answered by every
    datastore method with one exception type (404 over HTTP) and one message; before, MONAI Label's methods said
    "Image x not found" or "Label: x Tag: t not found", and the info getters returned an empty record (200)."""
    root, studies, _ = layout
    _png(studies / "dup.png")
    _png(studies / "dup.nrrd.png")  # not a stem clash; a second file to remove below
    _png(studies / "gone.png")
    label = _png(root / "upload" / "tmplabel.png", 1)
    store = _store(studies)
    store.save_label("SYN00000_L_CC", str(_png(root / "upload" / "tmpl2.png", 1)), "final", {})
    (studies / "gone.png").unlink()  # listed, then removed behind the server's back
    for image_id, message in [
        ("unknown", "image id 'unknown' is not in the datastore"),
        ("gone", "image id 'gone' is not in the datastore"),
    ]:
        image_calls = {
            "get_image_uri": lambda i=image_id: store.get_image_uri(i),
            "get_image_info": lambda i=image_id: store.get_image_info(i),
            "update_image_info": lambda i=image_id: store.update_image_info(i, {}),
            "save_label": lambda i=image_id: store.save_label(i, str(_png(label, 1)), "final", {}),
        }
        if image_id == "unknown":  # a record whose file is gone is removed like any other
            image_calls["remove_image"] = lambda i=image_id: store.remove_image(i)
        for what, call in image_calls.items():
            with pytest.raises(ImageNotFoundException) as err:
                call()
            assert err.value.msg == message, what
        for what, call in {
            "get_label_uri": lambda i=image_id: store.get_label_uri(i, "final"),
            "get_label_info": lambda i=image_id: store.get_label_info(i, "final"),
            "update_label_info": lambda i=image_id: store.update_label_info(i, "final", {}),
            "remove_label": lambda i=image_id: store.remove_label(i, "final"),
        }.items():
            with pytest.raises(LabelNotFoundException) as err:
                call()
            assert err.value.msg == message, what
    # a known image without a label of that tag: one wording too, naming the image and the tag
    for call in (
        lambda: store.get_label_uri("SYN00000_L_CC", "glam_label"),
        lambda: store.get_label_info("SYN00000_L_CC", "glam_label"),
        lambda: store.update_label_info("SYN00000_L_CC", "glam_label", {}),
        lambda: store.remove_label("SYN00000_L_CC", "glam_label"),
    ):
        with pytest.raises(LabelNotFoundException) as err:
            call()
        assert err.value.msg == "image id 'SYN00000_L_CC' has no label tagged 'glam_label'"
    # a folder listed under an image's name is no image: one 400 wording wherever its file is asked for
    (studies / "folder.png").mkdir()
    store.refresh()
    for call in (lambda: store.get_image_uri("folder"), lambda: store.get_image_info("folder")):
        with pytest.raises(RequestRefused, match="^image id 'folder' names a folder, not an image file$") as err:
            call()
        assert err.value.status_code == 400
    assert store.get_label_uri("SYN00000_L_CC", "final").endswith("SYN00000_L_CC.png")
    assert store.get_image_info("SYN00000_L_CC")["path"] == str(studies / "SYN00000_L_CC.png")
