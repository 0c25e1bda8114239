"""The label server's safe defaults (issue 29), against real servers started with scripts/start_label_server.sh on
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
    from scripts.data.synthetic import SyntheticConfig, make_synthetic_dataset

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
    logs = tmp_path_factory.mktemp("security_logs")
    return {"root": root, "studies": studies, "outside": root / "outer" / "outside.png", "logs": logs}


@pytest.fixture(scope="module")
def server(site):
    with running_server(site["studies"], site["logs"] / "server.log", "--cors-origin", ALLOWED_ORIGIN) as srv:
        yield srv


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
    assert set(server.get("/datastore/?output=all")["objects"]) == {p.stem for p in site["studies"].glob("*.png")}


def test_encoded_names_stay_names_inside_the_studies_folder(server, site):
    """A twice-encoded ``..%2f`` is decoded once, as every query value: a plain (odd) name, stored inside."""
    before = _tree(site["root"], site["studies"])
    png = ("scan.png", site["outside"].read_bytes())
    status, _, body = server.form("PUT", "/datastore/image?image=%252e%252e%252foutside_marker", {}, {"file": png})
    assert status == 200 and json.loads(body) == {"image": "%2e%2e%2foutside_marker"}
    assert (site["studies"] / "%2e%2e%2foutside_marker.png").read_bytes() == png[1]
    # an upload named by its file name: MONAI Label keeps the base name only
    status, _, body = server.form("PUT", "/datastore/image", {}, {"file": ("../../up_marker.png", png[1])})
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
    for p in site["studies"].glob("*.png"):
        shutil.copy(p, studies / p.name)
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
