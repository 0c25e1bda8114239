"""The label server's safe defaults (issue 29), against real servers started with tools/start_label_server.sh on
127.0.0.1 and stopped by the tests: nothing a request names is read or written outside the studies folder, no
foreign web origin is granted access, malformed requests answer 4xx naming the problem, the server keeps answering
(also a short concurrent load), and MONAI Label's authentication works when turned on.

The studies folder lies two levels down (``root/outer/inner/studies``), so ``../x``, ``../../x`` and absolute paths
all point at files of the test's own folder, whose every file is compared before and after."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import pytest
from conftest import BUNDLE_ROOT, REPO_ROOT
from label_client import free_port, label_python, running_server

pytestmark = pytest.mark.slow

ALLOWED_ORIGIN = "http://viewer.example:3000"
SECRET = f"glam-secret-{uuid.uuid4().hex}"
ID = "SYN00000_L_CC"  # a datastore image (the first synthetic image's stem)
UPLOAD_LIMIT_MB = 4  # the security server's --max-upload-mb (the default, 256, is tested in test_glam_safety.py)


def _tree(root: Path, skip: Path) -> dict[str, str]:
    """Every file and folder under ``root`` except under ``skip``: relative path -> sha256 (folders: "dir")."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p == skip or skip in p.parents:
            continue
        out[str(p.relative_to(root))] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """Two synthetic mammograms in ``root/outer/inner/studies``; beside the folders, a mammogram and a secret the
    server must never read (``outer/outside.png``, ``outer/inner/secret.txt``)."""
    from glam_benchmark.synthetic import SyntheticConfig, make_synthetic_dataset

    root = tmp_path_factory.mktemp("security")
    make_synthetic_dataset(root / "png", 2, size=(736, 480), seed=21, fmt="png", config=SyntheticConfig())
    studies = root / "outer" / "inner" / "studies"
    studies.mkdir(parents=True)
    images = sorted((root / "png" / "images").glob("*.png"))
    for p in images:
        shutil.copy(p, studies / p.name)
    assert ID in {p.stem for p in images}
    shutil.copy(images[0], root / "outer" / "outside.png")
    (root / "outer" / "inner" / "secret.txt").write_text(SECRET)
    # issue 38: a link to a mammogram beside the folder, a link to a folder outside (listed as an image), a label tag
    # that is a link to that folder, a file name that is not UTF-8 and an image that cannot be decoded
    shutil.copy(images[1], studies.parent / "victim.png")
    os.symlink("../victim.png", studies / "link.png")
    victim_dir = root / "outer" / "victim_dir"
    victim_dir.mkdir()
    shutil.copy(images[0], victim_dir / "keep.png")
    os.symlink(victim_dir, studies / "dirlink.png")
    (studies / "labels").mkdir()
    os.symlink(victim_dir, studies / "labels" / "linked_tag")
    (studies / os.fsdecode(b"caf\xe9.png")).write_bytes(images[0].read_bytes())
    (studies / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))  # a PNG signature, then nothing
    logs = tmp_path_factory.mktemp("security_logs")
    return {
        "root": root,
        "studies": studies,
        "outside": root / "outer" / "outside.png",
        "logs": logs,
        "synthetic": [p.name for p in images],
        "victim": studies.parent / "victim.png",
        "victim_dir": victim_dir,
    }


@pytest.fixture(scope="module")
def server(site):
    args = ("--cors-origin", ALLOWED_ORIGIN, "--max-upload-mb", str(UPLOAD_LIMIT_MB))
    with running_server(site["studies"], site["logs"] / "server.log", *args) as srv:
        yield srv


def _served_ids(site) -> set[str]:
    """The datastore ids the studies folder should list: every image name that is UTF-8 (and its links)."""
    return {p.stem for p in site["studies"].glob("*.png") if _is_utf8(p.name)}


def _is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json(content: bytes) -> dict:
    return json.loads(content) if content.startswith(b"{") else {}


# the traversal payloads, as a client sends them in a query (the server decodes once) and, decoded, in JSON
def _payloads(site) -> list[str]:
    return [
        "../outside_marker",
        "../../outside_marker",
        "../../../outer/inner/secret",
        str(site["root"] / "outer" / "outside"),  # absolute, no extension (an id)
        str(site["outside"]),  # absolute, the file itself
        "..\\outside_marker",
        "..",
        ".",
        "x\x00y",
    ]


def _attacks(server, site) -> list[tuple[str, int, bytes]]:
    """(what, status, body) of every route given each payload, query-encoded once, twice-decoded never."""
    png = ("scan.png", site["outside"].read_bytes())
    answers = []

    def record(what, answer):
        answers.append((what, answer[0], answer[2]))

    for raw in _payloads(site):
        q = quote(raw, safe="")
        record(f"PUT image {raw!r}", server.form("PUT", f"/datastore/image?image={q}", {}, {"file": png}))
        record(f"GET image {raw!r}", server.request("GET", f"/datastore/image?image={q}"))
        record(f"HEAD image {raw!r}", server.request("HEAD", f"/datastore/image?image={q}"))
        record(f"GET image info {raw!r}", server.request("GET", f"/datastore/image/info?image={q}"))
        record(f"PUT image info {raw!r}", server.form("PUT", f"/datastore/image/info?image={q}", {"info": "{}"}))
        record(f"DELETE image {raw!r}", server.request("DELETE", f"/datastore/image?id={q}"))
        record(f"PUT label tag {raw!r}", server.form("PUT", f"/datastore/label?image={ID}&tag={q}", {}, {"label": png}))
        record(f"PUT label of {raw!r}", server.form("PUT", f"/datastore/label?image={q}&tag=final", {}, {"label": png}))
        record(f"GET label tag {raw!r}", server.request("GET", f"/datastore/label?label={ID}&tag={q}"))
        record(f"GET label {raw!r}", server.request("GET", f"/datastore/label?label={q}&tag=final"))
        record(f"DELETE label tag {raw!r}", server.request("DELETE", f"/datastore/label?id={ID}&tag={q}"))
        record(
            f"PUT label info {raw!r}", server.form("PUT", f"/datastore/label/info?label={ID}&tag={q}", {"info": "{}"})
        )
        record(f"infer image {raw!r}", server.form("POST", f"/infer/glam?image={q}&output=json", {"params": "{}"}))
        params = json.dumps({"image": raw})
        record(
            f"infer params image {raw!r}",
            server.form("POST", f"/infer/glam?image={ID}&output=json", {"params": params}),
        )
        params = json.dumps({"save_label": True, "label_tag": raw})
        record(
            f"infer label_tag {raw!r}", server.form("POST", f"/infer/glam?image={ID}&output=json", {"params": params})
        )
        record(
            f"infer session {raw!r}", server.form("POST", f"/infer/glam?session_id={q}&output=json", {"params": "{}"})
        )
        batch = json.dumps({"save_label": True, "label_tag": raw, "device": "cpu", "multi_gpu": False}).encode()
        record(
            f"batch label_tag {raw!r}",
            server.request("POST", "/batch/infer/glam?run_sync=true", batch, {"Content-Type": "application/json"}),
        )
    return answers


def test_traversal_ids_tags_and_absolute_paths_leave_everything_outside_untouched(server, site):
    before = _tree(site["root"], site["studies"])
    answers = _attacks(server, site)
    assert len(answers) == 17 * len(_payloads(site))
    for what, status, body in answers:
        assert 400 <= status < 500, f"{what}: {status} {body[:300]!r}"
        assert SECRET.encode() not in body and b"prob_" not in body, what  # nothing read, nothing inferred
        for server_path in (str(site["studies"]), "glam_label_"):  # paths the client never sent
            assert server_path.encode() not in body, f"{what}: {body[:300]!r}"
    assert _tree(site["root"], site["studies"]) == before
    assert set(server.get("/datastore/?output=all")["objects"]) == _served_ids(site)


def test_encoded_names_stay_names_inside_the_studies_folder(server, site):
    """A twice-encoded ``..%2f`` is decoded once, as every query value: a plain (odd) name, stored inside."""
    before = _tree(site["root"], site["studies"])
    png = ("scan.png", site["outside"].read_bytes())
    status, _, body = server.form("PUT", "/datastore/image?image=%252e%252e%252foutside_marker", {}, {"file": png})
    assert status == 200 and json.loads(body) == {"image": "%2e%2e%2foutside_marker"}
    assert (site["studies"] / "%2e%2e%2foutside_marker.png").read_bytes() == png[1]
    # an upload named by its file name: a name, not a path (MONAI Label kept the base name of a path)
    status, _, body = server.form("PUT", "/datastore/image", {}, {"file": ("up_marker.png", png[1])})
    assert status == 200 and json.loads(body) == {"image": "up_marker"}
    assert (site["studies"] / "up_marker.png").is_file()
    assert _tree(site["root"], site["studies"]) == before
    for image in ("%2e%2e%2foutside_marker", "up_marker"):
        assert server.request("DELETE", f"/datastore/image?id={quote(image, safe='')}")[0] == 200


def test_a_refusal_does_not_reveal_whether_a_file_exists(server, site):
    existing, missing = site["outside"], site["outside"].with_name("nope.png")
    for route in ("query", "params"):
        answers = []
        for path in (existing, missing):
            if route == "query":
                status, _, body = server.form("POST", f"/infer/glam?image={quote(str(path))}", {"params": "{}"})
            else:
                params = json.dumps({"image": str(path)})
                status, _, body = server.form("POST", f"/infer/glam?image={ID}", {"params": params})
            # the answer echoes the client's own value (shortened when long), then says what is wrong with it
            detail = _json(body)["detail"]
            assert detail.startswith("image id '") and str(path)[:40] in detail, detail
            answers.append((status, detail.rsplit(" is a path", 1)[1]))
        assert answers[0] == answers[1] and answers[0][0] == 400, answers


def test_a_foreign_origin_gets_no_cors_grant(server):
    evil = {"Origin": "http://evil.example"}
    for method, path, extra in [
        ("GET", "/info/", {}),
        ("OPTIONS", "/datastore/image", {"Access-Control-Request-Method": "PUT"}),
        ("OPTIONS", "/infer/glam", {"Access-Control-Request-Method": "POST"}),
    ]:
        status, headers, _ = server.request(method, path, headers={**evil, **extra})
        assert status in (400, 403), (method, path, status)
        assert "access-control-allow-origin" not in headers and "access-control-allow-credentials" not in headers
    status, headers, body = server.request("GET", "/info/", headers={"Origin": "null"})
    assert status == 403 and "access-control-allow-origin" not in headers


def test_a_page_of_a_foreign_origin_cannot_drive_the_server_with_a_simple_post(server, site):
    """A form POST needs no preflight: the browser sends it and only hides the answer. It must do nothing."""
    params = json.dumps({"save_label": True, "label_tag": "csrf_tag"})
    status, headers, _ = server.form(
        "POST", f"/infer/glam?image={ID}&output=json", {"params": params}, headers={"Origin": "http://evil.example"}
    )
    assert status == 403 and "access-control-allow-origin" not in headers
    assert not (site["studies"] / "labels" / "csrf_tag").exists()


def test_the_listed_origin_and_the_servers_own_are_granted(server):
    status, headers, _ = server.request("GET", "/info/", headers={"Origin": ALLOWED_ORIGIN})
    assert status == 200 and headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    preflight = {"Origin": ALLOWED_ORIGIN, "Access-Control-Request-Method": "PUT"}
    status, headers, _ = server.request("OPTIONS", "/datastore/image", headers=preflight)
    assert status == 200 and headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    assert "PUT" in headers["access-control-allow-methods"]
    status, headers, _ = server.request("GET", "/info/", headers={"Origin": server.base})  # its own page (/docs)
    assert status == 200 and "access-control-allow-origin" not in headers


def test_a_foreign_host_name_is_refused(server):
    port = server.base.rsplit(":", 1)[1]
    status, _, body = server.request("GET", "/info/", headers={"Host": f"evil.example:{port}"})
    assert status == 400 and b"not a name this server answers for" in body
    assert server.request("GET", "/info/", headers={"Host": f"localhost:{port}"})[0] == 200


def test_malformed_requests_answer_4xx_naming_the_problem_and_the_server_stays_up(server, site):
    tracebacks = server.log.read_text().count("Traceback")
    cases = [
        (("POST", f"/infer/glam?image={ID}", {"params": "{not json"}), 400, "form field 'params' is not valid JSON"),
        (("POST", f"/infer/glam?image={ID}", {"params": '"text"'}), 400, "got str"),
        (("POST", f"/infer/glam?image={ID}", {"params": "[1,2,3]"}), 400, "'params' must be a JSON object"),
        (("POST", f"/infer/glam?image={ID}", {"params": "null"}), 400, "got null"),
        (("POST", f"/infer/nope?image={ID}", {"params": "{}"}), 404, "model 'nope' is not served here"),
        (("POST", "/infer/glam?image=unknown_id", {"params": "{}"}), 404, "'unknown_id' is not in the datastore"),
        (("POST", f"/infer/glam?image={ID}", {"params": '{"save_label": "maybe"}'}), 400, "save_label must be"),
        (("PUT", f"/datastore/image/info?image={ID}", {"info": "[1]"}), 400, "form field 'info' must be"),
        (("POST", "/activelearning/nope", None), 404, "strategy 'nope' is not offered"),
        (("POST", "/infer/glam?image=&output=json", {"params": "{}"}), 400, "no input: name a datastore image"),
        (("POST", f"/infer/glam?image={ID}&output=dicom_seg", {"params": "{}"}), 400, "output=dicom_seg needs"),
    ]
    for (method, path, fields), status, message in cases:
        got, _, body = server.form(method, path, fields) if fields is not None else server.request(method, path)
        assert got == status and message in _json(body).get("detail", ""), (path, fields, got, body[:300])
    # an upload that is no image: the root cause, not MONAI's wrapper or the server's temporary path
    got, _, body = server.form("POST", "/infer/glam?image=", {"params": "{}"}, {"file": ("scan.png", b"not a png")})
    detail = _json(body).get("detail", "")
    assert got == 400 and detail.startswith("the uploaded file cannot be read: not a readable image"), body[:300]
    for leak in ("applying transform", "object at 0x", "/tmp", "glam_label_", "tmp"):
        assert leak not in detail, detail
    got, _, body = server.form("PUT", "/datastore/image?image=tool", {}, {"file": ("tool.exe", b"MZ")})
    assert got == 400 and "of type '.exe'" in _json(body)["detail"]
    broken = {"Content-Type": "multipart/form-data; boundary=xyz"}
    got, _, body = server.request("POST", f"/infer/glam?image={ID}", b"--xyz\r\nno headers, no end", broken)
    assert got == 400 and _json(body)["detail"].startswith("malformed form data"), body[:300]
    assert server.get("/info/")["models"]["glam"]["type"] == "segmentation"  # still up
    assert server.log.read_text().count("Traceback") == tracebacks


def test_the_checkpoint_and_the_log_are_not_offered(server):
    model = BUNDLE_ROOT / "models" / "model.pt"
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    for method, path in [
        ("GET", "/model/glam"),
        ("GET", "/model/info/glam"),
        ("DELETE", "/model/glam"),
        ("GET", "/logs/"),
    ]:
        assert server.request(method, path)[0] == 404, path
    status, _, body = server.form("PUT", "/model/glam", {}, {"file": ("model.pt", b"replaced")})
    assert status == 404 and b"not offered" in body
    assert hashlib.sha256(model.read_bytes()).hexdigest() == digest


def test_a_short_concurrent_load_is_all_answered(server, site):
    """16 inferences at once (datastore images and uploads): every one answered with scores, within the bound."""
    png = site["outside"]

    def one(i: int) -> tuple[int, float, dict]:
        begin = time.monotonic()
        if i % 2:
            status, body = server.infer("image=&output=json", {"overlay": "heatmap"}, upload=png)
        else:
            status, body = server.infer(f"image={ID}&output=json", {"threshold": 0.3})
        return status, time.monotonic() - begin, _json(body)

    begin = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(16)))
    wall = time.monotonic() - begin
    assert [r[0] for r in results] == [200] * 16
    assert all(0.0 <= r[2]["prob_malignant"] <= 1.0 for r in results)
    assert wall < 300, wall
    latencies = sorted(r[1] for r in results)
    median = statistics.median(latencies)
    print(f"16 concurrent /infer: wall {wall:.1f} s, median {median:.1f} s, max {latencies[-1]:.1f} s")
    assert server.get("/info/")["name"] == "GLAM mammography saliency"


def test_the_app_refuses_monailabels_default_server(tmp_path):
    """Started the plain MONAI Label way, in its own FastAPI app (every web origin let in, no checks), the app
    stops before the server listens, naming the option to use."""
    cmd = [label_python(), "-m", "monailabel.main", "start_server", "--app", str(REPO_ROOT / "label_app")]
    cmd += ["--studies", str(tmp_path), "--host", "127.0.0.1", "--port", str(free_port())]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode != 0
    assert "pass --uvicorn_app glam_server:app" in res.stdout + res.stderr, (res.stdout + res.stderr)[-3000:]
    assert "Application startup failed" in res.stdout + res.stderr


def test_label_app_units_pass_in_the_label_environment():
    res = subprocess.run(
        [label_python(), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/label_app/test_label_app_units.py"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    summary = res.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary, summary


# -- issue 38: links, malformed requests, bounded uploads, batch inference, settings records --------------------------
def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_links_are_read_under_their_own_name_and_never_written_or_deleted_through(server, site):
    """``studies/link.png -> ../victim.png``: served under its name (the answers never show where it leads); PUT and
    DELETE through it, a DELETE of a link to a folder outside and a label saved into a tag folder that is a link
    outside are refused (403): the victim keeps its bytes and everything outside is as it was."""
    victim, victim_dir = site["victim"], site["victim_dir"]
    digest, before = _sha(victim), _tree(site["root"], site["studies"])
    status, headers, body = server.request("GET", "/datastore/image?image=link")
    assert status == 200 and body == victim.read_bytes()
    assert "link.png" in headers["content-disposition"] and "victim" not in headers["content-disposition"]
    answers = [
        server.request("GET", path)[2] for path in ("/datastore/image/info?image=link", "/datastore/?output=all")
    ]
    answers += [server.request("GET", "/datastore/?output=train")[2], server.request("GET", "/datastore/")[2]]
    for body in answers:
        assert b"victim" not in body, body[:300]
    png = ("scan.png", site["outside"].read_bytes())
    refusals = [
        ("PUT through the link", server.form("PUT", "/datastore/image?image=link", {}, {"file": png})),
        ("DELETE the link", server.request("DELETE", "/datastore/image?id=link")),
        ("DELETE a link to a folder", server.request("DELETE", "/datastore/image?id=dirlink")),
        (
            "PUT a label into a linked tag",
            server.form("PUT", f"/datastore/label?image={ID}&tag=linked_tag", {}, {"label": png}),
        ),
    ]
    for what, (status, _, body) in refusals:
        assert status == 403 and b"symbolic link" in body, (what, status, body[:300])
        assert str(site["root"]).encode() not in body, what
    assert _sha(victim) == digest and (victim_dir / "keep.png").is_file()
    assert _tree(site["root"], site["studies"]) == before
    assert {"link", "dirlink"} <= set(server.get("/datastore/?output=all")["objects"])


def test_malformed_requests_of_issue_38_answer_4xx_and_listings_skip_undecodable_names(server, site):
    tracebacks = server.log.read_text().count("Traceback")
    deep = "[" * 5000 + "]" * 5000
    png = site["outside"].read_bytes()
    cases = [
        ("params 5,000 deep", server.form("POST", f"/infer/glam?image={ID}", {"params": '{"a": ' + deep + "}"})),
        (
            "params 33 deep",
            server.form("POST", f"/infer/glam?image={ID}", {"params": '{"a": ' + "[" * 32 + "]" * 32 + "}"}),
        ),
        (
            "a JSON body 5,000 deep",
            server.request(
                "POST", "/batch/infer/glam?run_sync=true", deep.encode(), {"Content-Type": "application/json"}
            ),
        ),
        ("a NUL in an upload's name", server.form("PUT", "/datastore/image", {}, {"file": ("scan.png\x00.exe", png)})),
        (
            "a NUL in an inferred upload",
            server.form("POST", "/infer/glam?image=", {"params": "{}"}, {"file": ("a\x00.png", png)}),
        ),
        (
            "a path as an upload's name",
            server.form("PUT", "/datastore/image", {}, {"file": ("../../up_marker.png", png)}),
        ),
        ("a backslash in an upload's name", server.form("PUT", "/datastore/image", {}, {"file": ("..\\x.png", png)})),
        (
            "a label with an inference",
            server.form("POST", f"/infer/glam?image={ID}", {"params": "{}"}, {"label": ("l.png", png)}),
        ),
    ]
    messages = {
        "params 5,000 deep": "deeper than 32 levels",
        "params 33 deep": "deeper than 32 levels",
        "a JSON body 5,000 deep": "the JSON body nests lists or objects deeper than 32 levels",
        "a NUL in an upload's name": "holds control characters (such as NUL)",
        "a NUL in an inferred upload": "holds control characters (such as NUL)",
        "a path as an upload's name": "is a path; send the file's name only",
        "a backslash in an upload's name": "is a path; send the file's name only",
        "a label with an inference": "GLAM takes no label",
    }
    for what, (status, _, body) in cases:
        assert status == 400 and messages[what] in _json(body).get("detail", ""), (what, status, body[:300])
    assert not (site["studies"] / "up_marker.png").exists()
    # the file name that is not UTF-8: every listing answers, without it, and the log names it once
    for path in ("/datastore/", "/datastore/?output=all", "/datastore/?output=train", "/info/"):
        assert server.request("GET", path)[0] == 200, path
    assert set(server.get("/datastore/?output=all")["objects"]) == _served_ids(site)
    log = server.log.read_text()
    assert "skipped 'caf\\xe9.png' in the studies folder: the file name is not valid UTF-8" in log
    assert log.count("Traceback") == tracebacks


def _raw_request(server, head: bytes, body_chunks=()) -> tuple[int, bytes]:
    """Send ``head`` and then the chunks on one socket; (status, what the server sent before it closed)."""
    import socket

    port = int(server.base.rsplit(":", 1)[1])
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)
        try:
            for chunk in body_chunks:
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed: what was sent past the limit was never read
        try:
            while data := sock.recv(65536):
                answer += data
        except (ConnectionResetError, TimeoutError):
            pass
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer.split(b" ", 2)[1]), answer


def test_uploads_are_bounded_and_leave_nothing_in_the_temporary_folder(server, site):
    """A body over --max-upload-mb is answered 413 before it is read (by its Content-Length, or by counting a chunked
    one), and no refused request leaves a file in the server's temporary folder (MONAI Label left each one there)."""
    scratch = server.scratch()
    before, rss_before = sorted(os.listdir(scratch)), server.rss_mb()
    png = ("scan.png", site["outside"].read_bytes())
    limit = UPLOAD_LIMIT_MB * 2**20
    refused = [
        ("a path as id", server.form("PUT", "/datastore/image?image=../x", {}, {"file": png})),
        ("a file type", server.form("PUT", "/datastore/image?image=tool", {}, {"file": ("tool.exe", b"MZ" * 1000)})),
        ("a hidden id", server.form("PUT", "/datastore/image?image=.hidden", {}, {"file": png})),
        ("a label of no image", server.form("PUT", "/datastore/label?image=nothing&tag=final", {}, {"label": png})),
        ("through a link", server.form("PUT", "/datastore/image?image=link", {}, {"file": png})),
        (
            "an unreadable upload",
            server.form("POST", "/infer/glam?image=", {"params": "{}"}, {"file": ("x.png", b"no")}),
        ),
        ("a bad parameter", server.form("POST", "/infer/glam?image=", {"params": '{"threshold": 7}'}, {"file": png})),
        (
            "a bad label tag",
            server.form("POST", f"/infer/glam?image={ID}", {"params": '{"save_label": true, "label_tag": "original"}'}),
        ),
        ("a NUL in a name", server.form("PUT", "/datastore/image", {}, {"file": ("a\x00.png", png[1])})),
    ]
    for what, (status, _, body) in refused:
        assert 400 <= status < 500, (what, status, body[:300])
    assert b"'original' is kept for the readers' annotations" in refused[-2][1][2]
    # 400 MB announced: refused on the header, the body never sent
    head = (
        f"PUT /datastore/image?image=huge HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {400 * 2**20}\r\n"
        "Content-Type: multipart/form-data; boundary=xyz\r\n\r\n"
    ).encode()
    status, answer = _raw_request(server, head)
    assert status == 413 and b"exceeds the server's limit of 4 MiB (start_label_server.sh --max-upload-mb" in answer
    # the limit plus 10 bytes announced
    status, _ = _raw_request(server, head.replace(str(400 * 2**20).encode(), str(limit + 10).encode()))
    assert status == 413
    # no length announced, chunks past the limit: refused once the count passes it
    head = head.replace(f"Content-Length: {400 * 2**20}".encode(), b"Transfer-Encoding: chunked")
    chunk = b"%x\r\n%s\r\n" % (2**20, bytes(2**20))
    status, answer = _raw_request(server, head, [chunk] * (UPLOAD_LIMIT_MB + 1))
    assert status == 413 and b"more than 4194304 bytes" in answer
    time.sleep(1)  # any background task of MONAI Label's has run
    assert sorted(os.listdir(scratch)) == before
    rss_after = server.rss_mb()
    print(f"server memory around the refused uploads: {rss_before:.0f} -> {rss_after:.0f} MiB")
    assert rss_after - rss_before < 100
    assert not (site["studies"] / "big.png").exists() and not (site["studies"] / "huge.png").exists()
    assert server.get("/info/")["name"] == "GLAM mammography saliency"


def test_batch_inference_reports_each_failure_and_never_saves_under_original(server, site):
    labels = site["studies"] / "labels"
    batch = {"device": "cpu", "multi_gpu": False, "max_workers": 1}
    json_type = {"Content-Type": "application/json"}
    status, _, body = server.request(
        "POST", "/batch/infer/glam?run_sync=true", json.dumps({**batch, "label_tag": "original"}).encode(), json_type
    )
    assert status == 400 and b"'original' is kept" in body
    status, _, body = server.request("POST", "/batch/infer/glam?run_sync=true", json.dumps(batch).encode(), json_type)
    assert status == 200, body[:500]
    result = json.loads(body)
    assert set(result) == _served_ids(site)
    assert result["broken"]["status"] == 400 and "cannot be read" in result["broken"]["error"]
    assert "dirlink" in result and result["dirlink"]["status"] == 400  # a folder is no image: an error, not a stop
    done = [i for i, r in result.items() if "error" not in r]
    assert set(done) >= {*(Path(n).stem for n in site["synthetic"]), "link"}
    for image_id in done:
        assert 0.0 <= result[image_id]["params"]["prob_malignant"] <= 1.0
        assert (labels / "glam_label" / f"{image_id}.nrrd").is_file()
    objects = server.get("/datastore/?output=all")["objects"]
    assert all("original" not in o["labels"] for o in objects.values())
    assert not any((labels / "original").iterdir()) if (labels / "original").exists() else True
    for error in (r["error"] for r in result.values() if "error" in r):
        assert str(site["root"]) not in error and "glam_label_" not in error, error


def test_a_checkpoint_asking_for_huge_images_is_refused_before_anything_is_built(site, tmp_path):
    """A settings record of image_size [6000, 6000] under a server limit of 4096 pixels per side stops the server at
    once, naming the setting, the limit and the variable that raises it. (A record past the bundle's own bound of
    8192, such as [40000, 40000], is refused by the bundle's record check first: test_model_settings.py.)"""
    import torch

    state = torch.load(BUNDLE_ROOT / "models" / "model.pt", weights_only=True)
    from scripts.networks.settings import decode_settings, encode_settings

    record = decode_settings(state["model_settings"])
    state["model_settings"] = encode_settings({**record, "image_size": [6000, 6000]})
    huge = tmp_path / "huge.pt"
    torch.save(state, huge)
    studies = tmp_path / "studies"
    studies.mkdir()
    shutil.copy(site["studies"] / site["synthetic"][0], studies / site["synthetic"][0])
    log = tmp_path / "huge.log"
    cmd = ["bash", str(REPO_ROOT / "tools" / "start_label_server.sh"), "--studies", str(studies)]
    cmd += ["--port", str(free_port()), "--device", "cpu", "--model", str(huge)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLAM_LABEL_MAX_IMAGE_SIDE": "4096"}
    begin = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while proc.poll() is None and "Application startup failed" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    text = log.read_text(errors="replace")
    assert (
        "image_size [6000, 6000] exceeds the limit of 4096 pixels per side (GLAM_LABEL_MAX_IMAGE_SIDE raises it)"
        in text
    ), text[-3000:]
    assert "its settings record gives image_size" in text and "the label server refuses the model" in text
    assert "loaded strictly" not in text  # refused before the network was built
    print(f"refused in {time.monotonic() - begin:.1f} s")


# -- authentication: MONAI Label's token check, turned on by --auth-realm, against a stand-in realm ------------------
@pytest.fixture(scope="module")
def realm():
    """tests/label_app/keycloak_standin.py on a free 127.0.0.1 port: its URI and its tokens (docstring there)."""
    proc = subprocess.Popen(
        [label_python(), str(Path(__file__).with_name("keycloak_standin.py"))],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        line = proc.stdout.readline()
        assert line, f"the stand-in realm did not start (exit {proc.poll()})"
        yield json.loads(line)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def auth_server(site, realm, tmp_path_factory):
    studies = tmp_path_factory.mktemp("auth_studies")
    for name in site["synthetic"]:
        shutil.copy(site["studies"] / name, studies / name)
    with running_server(studies, site["logs"] / "auth.log", "--auth-realm", realm["realm"]) as srv:
        srv.studies = studies
        yield srv


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_without_a_valid_token_nothing_is_served(auth_server, realm):
    status, _, body = auth_server.request("GET", "/auth/")
    assert status == 200 and json.loads(body) == {
        "enabled": True,
        "client_id": "monailabel-app",
        "realm": realm["realm"],
    }
    tokens = realm["tokens"]
    for headers in ({}, _bearer("not.a.token"), *(_bearer(tokens[k]) for k in ("expired", "foreign_key", "hs256"))):
        for method, path in [("GET", "/info/"), ("GET", f"/datastore/image?image={ID}"), ("GET", "/datastore/")]:
            status, _, _ = auth_server.request(method, path, headers=headers)
            assert status == 401, (method, path, headers)
        status, _, body = auth_server.form(
            "POST", f"/infer/glam?image={ID}&output=json", {"params": "{}"}, None, headers
        )
        assert status == 401 and b"prob_" not in body


def test_a_valid_token_is_served_by_its_roles(auth_server, realm):
    user, annotator = _bearer(realm["tokens"]["user"]), _bearer(realm["tokens"]["annotator"])
    assert auth_server.request("GET", "/info/", headers=user)[0] == 200
    status, _, body = auth_server.form("POST", f"/infer/glam?image={ID}&output=json", {"params": "{}"}, None, user)
    assert status == 200 and 0.0 <= json.loads(body)["prob_benign"] <= 1.0
    png = ("scan.png", (auth_server.studies / f"{ID}.png").read_bytes())
    status, _, body = auth_server.form("PUT", "/datastore/image?image=uploaded", {}, {"file": png}, user)
    assert status == 403 and b"monailabel-annotator" in body  # an upload needs the annotator role
    status, _, body = auth_server.form("PUT", "/datastore/image?image=uploaded", {}, {"file": png}, annotator)
    assert status == 200 and (auth_server.studies / "uploaded.png").is_file()
