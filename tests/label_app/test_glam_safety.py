"""The label server's request rules (label_app/glam_safety.py: plain Python, tested here in the project's
environment): which ids and tags name a file of the studies folder, the JSON form fields, origins and hosts."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess

import pytest
from conftest import REPO_ROOT

# loaded from its file: label_app/ is not put on the test session's path (its main.py needs MONAI Label)
_spec = importlib.util.spec_from_file_location("glam_safety", REPO_ROOT / "label_app" / "glam_safety.py")
safety = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(safety)
MAX_NAME_LENGTH, RequestRefused = safety.MAX_NAME_LENGTH, safety.RequestRefused
allowed_hosts, as_bool, check_inside, check_name = (
    safety.allowed_hosts,
    safety.as_bool,
    safety.check_inside,
    safety.check_name,
)
is_inside, is_loopback, json_object = safety.is_inside, safety.is_loopback, safety.json_object
normalize_origin, parse_origins = safety.normalize_origin, safety.parse_origins
Limits, check_model_settings, check_upload_name = safety.Limits, safety.check_model_settings, safety.check_upload_name
json_value, json_depth, MAX_JSON_DEPTH = safety.json_value, safety.json_depth, safety.MAX_JSON_DEPTH
readable_path, writable_path, deletable_path = safety.readable_path, safety.writable_path, safety.deletable_path
MAX_JSON_INT_DIGITS, check_image_shape = safety.MAX_JSON_INT_DIGITS, safety.check_image_shape

# what a client may call an image: the file names a studies folder holds (Slicer names uploads after its volume)
GOOD_NAMES = ["SYN00000_L_CC", "dcm_1.2.840.113619.2", "MR head (1)", "Mammo-ä", "%2e%2e%2fx", "a..b", "..x"]
# what leads out of the folder, as a request hands it over (query and form values arrive decoded once)
BAD_NAMES = ["../x", "../../pwned", "/etc/passwd", "..\\x", "a/b", ".", "..", "x\x00y", "tab\there", "/", "\\"]


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_names_of_the_studies_folder_are_accepted(name):
    assert check_name(name, "image id") == name
    assert check_name(name, "label tag") == name


@pytest.mark.parametrize("name", BAD_NAMES)
def test_paths_and_control_characters_are_refused_with_400(name):
    with pytest.raises(RequestRefused) as err:
        check_name(name, "image id")
    assert err.value.status_code == 400
    assert str(err.value).startswith("image id ")


@pytest.mark.parametrize("value", [None, "", 3, ["a"], {"a": 1}])
def test_a_name_must_be_a_non_empty_string(value):
    with pytest.raises(RequestRefused, match="must be a non-empty string"):
        check_name(value, "label tag")


def test_length_limit_and_hidden_names():
    assert check_name("a" * MAX_NAME_LENGTH, "image id")
    with pytest.raises(RequestRefused, match="longer than"):
        check_name("a" * (MAX_NAME_LENGTH + 1), "image id")
    # a hidden file of the folder may be looked up, not created
    assert check_name(".hidden", "image id") == ".hidden"
    with pytest.raises(RequestRefused, match="starts with '.'"):
        check_name(".hidden", "image id", new=True)


def test_a_refusal_does_not_depend_on_the_file_existing(tmp_path):
    # the existence oracle of the issue: /etc/shadow and /etc/nope got different answers
    existing = tmp_path / "exists.png"
    existing.write_bytes(b"x")
    answers = []
    for path in (existing, tmp_path / "nope.png"):
        with pytest.raises(RequestRefused) as err:
            check_name(str(path), "image id")
        # the message echoes the client's own value (shortened when long), then says what is wrong with it
        answers.append((err.value.status_code, str(err.value).rsplit(" is a path", 1)[1]))
    assert answers[0] == answers[1] and answers[0][0] == 400


def test_inside_means_strictly_inside_without_following_dots(tmp_path):
    studies = tmp_path / "studies"
    assert is_inside(studies, studies / "a.png")
    assert is_inside(studies, studies / "labels" / "final" / "a.png")
    assert not is_inside(studies, studies)
    assert not is_inside(studies, studies / ".." / "a.png")
    assert not is_inside(studies, tmp_path / "studies2" / "a.png")  # a prefix is not a parent
    assert not is_inside(studies, "/etc/passwd")
    with pytest.raises(RequestRefused, match="outside the studies folder") as err:
        check_inside(studies, studies / ".." / "secret.png", "image 'x'")
    assert "secret" not in str(err.value)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{not json", "is not valid JSON"),
        ("[1, 2, 3]", "got list"),
        ("null", "got null"),
        ('"text"', "got str"),
        ("5", "got int"),
    ],
)
def test_form_fields_must_be_json_objects(text, problem):
    with pytest.raises(RequestRefused, match=problem) as err:
        json_object("params", text)
    assert "'params'" in str(err.value) and err.value.status_code == 400


def test_json_objects_and_empty_fields_are_read():
    assert json_object("params", '{"overlay": "heatmap", "threshold": 0.3}') == {"overlay": "heatmap", "threshold": 0.3}
    assert json_object("info", "") == {} and json_object("info", None) == {}  # as MONAI Label reads an empty field


@pytest.mark.parametrize(("value", "expected"), [(True, True), ("true", True), ("1", True), (None, False)])
def test_flags(value, expected):
    assert as_bool(value, "save_label") is expected
    assert as_bool("false", "save_label") is False and as_bool(False, "save_label") is False


def test_a_flag_that_is_neither_is_named():
    with pytest.raises(RequestRefused, match="save_label must be true or false"):
        as_bool("maybe", "save_label")


@pytest.mark.parametrize(
    ("given", "origin"),
    [
        ("http://localhost:3000", "http://localhost:3000"),
        ("http://localhost:3000/", "http://localhost:3000"),  # what MONAI Label's setting turns every entry into
        ("HTTPS://OHIF.Example.org:443", "https://ohif.example.org"),
        ("http://127.0.0.1:80", "http://127.0.0.1"),
        ("http://[::1]:8080", "http://[::1]:8080"),
    ],
)
def test_origins_are_written_as_browsers_send_them(given, origin):
    assert normalize_origin(given) == origin


@pytest.mark.parametrize(
    "bad", ["*", "http://*.example.org", "localhost:3000", "ftp://x", "http://x/app", "http://x?a"]
)
def test_an_origin_that_is_not_scheme_host_port_is_named(bad):
    with pytest.raises(ValueError, match="CORS origin"):
        normalize_origin(bad)


def test_origins_keep_their_order_without_repeats():
    given = ["http://b.example", "http://a.example/", "http://b.example:80"]
    assert parse_origins(given) == ["http://b.example", "http://a.example"]
    assert parse_origins([]) == []


def test_loopback_and_hosts():
    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]", "LOCALHOST"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "192.168.1.5", "labels.example.org", "127.0.0.1.example.org", "127.evil.invalid"):
        assert not is_loopback(host), host
    assert allowed_hosts(None) == ["127.0.0.1", "localhost", "::1"]
    assert allowed_hosts("Labels.example.org, 10.0.0.5") == [
        "127.0.0.1",
        "localhost",
        "::1",
        "labels.example.org",
        "10.0.0.5",
    ]
    assert allowed_hosts("0.0.0.0") == ["*"]


# -- the start script's network default (it stops before building anything: no server is started here) --------------
SCRIPT = REPO_ROOT / "tools" / "start_label_server.sh"


def _start(*args: str, auth: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONAI_LABEL_AUTH")}
    if auth is not None:
        env["MONAI_LABEL_AUTH_ENABLE"] = auth
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "192.168.1.20", "::", "labels.example.org", "127.evil.invalid", "127.0.0.1.nip.io", "127.1"]
)
def test_the_start_script_refuses_a_non_loopback_host_without_authentication(tmp_path, host):
    res = _start("--studies", str(tmp_path), "--host", host)
    assert res.returncode == 2
    assert f"--host {host} would let other machines use the server" in res.stderr
    assert "--auth-realm" in res.stderr and "--insecure-no-auth" in res.stderr


@pytest.mark.parametrize(
    ("args", "auth"),
    [
        (("--host", "0.0.0.0", "--insecure-no-auth"), None),  # told explicitly
        (("--host", "0.0.0.0"), "true"),  # MONAI Label's authentication on
        (("--host", "0.0.0.0", "--auth-realm", "https://sso.example.org/realms/monailabel"), None),
        (("--host", "localhost"), None),
        (("--host", "127.0.0.2"), None),
        (("--host", "127.255.255.254"), None),
        (("--host", "::1"), None),
        (("--host", "[::1]"), None),
    ],
)
def test_the_host_check_passes_with_authentication_or_when_told(args, auth):
    # a missing studies folder is the next check: reaching it shows the host was accepted, and nothing binds
    res = _start("--studies", "/nonexistent/studies", *args, auth=auth)
    assert res.returncode == 2 and "--studies /nonexistent/studies: not a folder" in res.stderr, res.stderr


@pytest.mark.parametrize("origin", ["http://localhost:3000/app", "*", "localhost:3000"])
def test_the_start_script_names_a_bad_cors_origin(tmp_path, origin):
    res = _start("--studies", str(tmp_path), "--cors-origin", origin)
    assert res.returncode == 2 and f"--cors-origin {origin}: expected scheme://host[:port]" in res.stderr


@pytest.mark.parametrize("bad", ["--max-upload-mb 0", "--max-upload-mb 1.5", "--max-upload-mb lots"])
def test_the_start_script_names_a_bad_upload_limit(tmp_path, bad):
    res = _start("--studies", str(tmp_path), *bad.split())
    assert res.returncode == 2 and f"{bad}: expected a whole number of MiB" in res.stderr


# -- issue 38: upload names, JSON nesting, the limits, paths decided where they resolve ------------------------------
@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("scan.png\x00.exe", "control characters (such as NUL)"),
        ("../../x.png", "is a path"),
        ("a/b.png", "is a path"),
        ("..\\x.png", "is a path"),
        ("caf\udce9.png", "not valid UTF-8"),
        ("x" * 252 + ".png", "longer than 255 bytes"),
        ("..", "not a file name"),
    ],
)
def test_an_upload_must_be_named_by_a_file_name(name, problem):
    with pytest.raises(RequestRefused, match=re.escape(problem)) as err:
        check_upload_name(name, "file")
    assert err.value.status_code == 400 and "'file'" in str(err.value)


def test_upload_names_that_are_file_names_pass():
    for name in ("scan.png", "Mammo-ä (1).nii.gz", "x" * 251 + ".png", ""):
        assert check_upload_name(name, "file") == name


def test_json_nesting_is_limited_without_recursion():
    assert json_depth(7) == 0 and json_depth([]) == 1 and json_depth({"a": [1, {"b": []}]}) == 4
    assert json_value("params", "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) is not None
    for depth in (MAX_JSON_DEPTH + 1, 900, 5000, 100_000):  # 5,000: MONAI Label's RecursionError (500)
        with pytest.raises(RequestRefused, match=f"deeper than {MAX_JSON_DEPTH} levels") as err:
            json_object("params", '{"a": ' + "[" * depth + "]" * depth + "}")
        assert err.value.status_code == 400 and "'params'" in str(err.value)
    with pytest.raises(RequestRefused, match="the JSON body is not UTF-8"):
        json_value("the JSON body", b"\xff\xfe{")


def test_limits_come_from_the_environment_with_mammogram_defaults():
    limits = Limits.from_env({})
    assert limits.max_body_bytes == 256 * 2**20  # a 16-bit 4000x5000 DICOM is 40 MB
    assert (limits.max_image_side, limits.max_patch_side, limits.max_patches) == (8192, 2048, 32)
    limits = Limits.from_env({"GLAM_LABEL_MAX_UPLOAD_MB": "4", "GLAM_LABEL_MAX_IMAGE_SIDE": " 50000 "})
    assert limits.max_body_bytes == 4 * 1024 * 1024 and limits.max_image_side == 50000
    for bad in ("0", "-1", "1.5", "lots"):
        with pytest.raises(ValueError, match=f"GLAM_LABEL_MAX_PATCHES={bad!r}: expected a positive whole number"):
            Limits.from_env({"GLAM_LABEL_MAX_PATCHES": bad})


def test_settings_records_outside_the_limits_are_refused_by_name():
    shipped = {"image_size": [736, 480], "patch_size": [128, 128], "num_patches_eval": 1}
    check_model_settings(shipped, Limits(), "model m.pt")  # the shipped model
    check_model_settings({"image_size": [2944, 1920], "patch_size": 512, "num_patches_eval": 6}, Limits(), "paper")
    cases = [
        (
            {"image_size": [40000, 40000]},
            "image_size [40000, 40000] exceeds the limit of 8192 pixels per side (GLAM_LABEL_MAX_IMAGE_SIDE raises it)",
        ),
        (
            {"patch_size": 4096},
            "patch_size [4096, 4096] exceeds the limit of 2048 pixels per side (GLAM_LABEL_MAX_PATCH_SIDE raises it)",
        ),
        (
            {"num_patches_eval": 10_000},
            "num_patches_eval 10000 exceeds the limit of 32 patches per image (GLAM_LABEL_MAX_PATCHES raises it)",
        ),
        ({"image_size": [0, 10]}, "image_size [0, 10] is not a positive size"),
        ({"image_size": "big"}, 'image_size "big" is not a positive size'),
        ({"num_patches_eval": 1.5}, "num_patches_eval 1.5 is not a positive whole number"),
        ({"image_size": [736, 480], "patch_size": [1024, 128]}, "patch_size [1024, 128] is larger than image_size"),
    ]
    for override, message in cases:
        with pytest.raises(ValueError) as err:
            check_model_settings({**shipped, **override}, Limits(), "model m.pt")
        assert str(err.value).startswith("model m.pt: ") and message in str(err.value), str(err.value)
    # the override: a larger limit lets the same record through
    check_model_settings({**shipped, "image_size": [40000, 40000]}, Limits(max_image_side=40000), "model m.pt")


def test_paths_are_decided_where_they_resolve(tmp_path):
    studies = tmp_path / "studies"
    (studies / "labels").mkdir(parents=True)
    victim = tmp_path / "victim.png"
    victim.write_bytes(b"victim")
    (studies / "a.png").write_bytes(b"a")
    os.symlink("../victim.png", studies / "link.png")
    os.symlink("a.png", studies / "alias.png")
    os.symlink(tmp_path, studies / "labels" / "out")
    # reads: the path inside the folder, also through the owner's link
    assert readable_path(studies, "a.png", "x") == str(studies / "a.png")
    assert readable_path(studies, studies / "link.png", "x") == str(studies / "link.png")
    # writes: the resolved folder and the name; never a link (wherever it points), never a folder leading out
    assert writable_path(studies, "new.png", "x") == str(studies.resolve() / "new.png")
    assert writable_path(studies, "labels/final/new.png", "x") == str(
        studies.resolve() / "labels" / "final" / "new.png"
    )
    for path in ("link.png", "alias.png", "labels/out/victim.png", "labels"):
        with pytest.raises(RequestRefused) as err:
            writable_path(studies, path, "image 'x'")
        assert err.value.status_code == 403 and str(tmp_path) not in str(err.value), path
    with pytest.raises(RequestRefused, match="outside the studies folder"):
        writable_path(studies, "../victim.png", "image 'x'")
    # deletes: a regular file, or nothing there
    assert deletable_path(studies, "a.png", "x") == str(studies.resolve() / "a.png")
    assert deletable_path(studies, "gone.png", "x") is None
    os.mkfifo(studies / "pipe.png")
    with pytest.raises(RequestRefused, match="not a regular file"):
        deletable_path(studies, "pipe.png", "x")
    assert victim.read_bytes() == b"victim"


# -- issue 45: invisible characters, huge JSON integers, the image sizes an input's header states -------------------
@pytest.mark.parametrize("char", ["\u202e", "\u200b", "\ufeff", "\u2066", "\x1b", "\x85"])
def test_ids_and_upload_names_with_invisible_characters_are_refused(char):
    code = re.escape(f"U+{ord(char):04X}")
    with pytest.raises(RequestRefused, match=code) as err:
        check_name(f"scan{char}gnp", "image id")
    assert err.value.status_code == 400
    with pytest.raises(RequestRefused, match=code):
        check_upload_name(f"scan{char}.png", "file")
    assert check_name("scan_ü_漢字", "image id") == "scan_ü_漢字"  # letters of any script pass


def test_json_integers_are_bounded_before_python_converts_them():
    digits = MAX_JSON_INT_DIGITS
    assert json_object("params", '{"n": ' + "9" * digits + "}")["n"] == int("9" * digits)
    for text in ('{"threshold": ' + "9" * 5000 + "}", '{"a": [-' + "1" * (digits + 1) + "]}"):
        with pytest.raises(RequestRefused, match="holds an integer of .* digits; the server takes at most") as err:
            json_object("params", text)
        assert err.value.status_code == 400 and "'params'" in str(err.value)
    assert json_value("the JSON body", '{"x": 1e999}')["x"] == float("inf")  # floats never raise


@pytest.mark.parametrize(
    ("shape", "status", "problem"),
    [
        ((12000, 12000), 413, "144,000,000 pixels, above the server's limit of 50,000,000"),
        ((65000, 10), 400, "65000 x 10 pixels is no mammogram"),
        ((10, 65000), 400, "no mammogram"),
        ((20, 20), 400, "each side at least 32 pixels"),
        ((3000, 200), 400, "the longer at most 10 times the shorter"),
    ],
)
def test_image_shapes_beyond_the_limits_are_refused(shape, status, problem):
    with pytest.raises(RequestRefused, match=problem) as err:
        check_image_shape(shape, Limits.from_env({}), "the uploaded file")
    assert err.value.status_code == status and str(err.value).startswith("the uploaded file: ")


def test_mammogram_shapes_pass_and_the_pixel_limit_comes_from_the_environment():
    limits = Limits.from_env({})
    for shape in [(4096, 3328), (5928, 4728), (736, 480), (1, 2944, 1920), (32, 320)]:
        check_image_shape(shape, limits, "image")
    assert limits.max_image_pixels == 50_000_000
    assert Limits.from_env({"GLAM_LABEL_MAX_IMAGE_PIXELS": "200000000"}).max_image_pixels == 200_000_000
    check_image_shape((12000, 12000), Limits.from_env({"GLAM_LABEL_MAX_IMAGE_PIXELS": "200000000"}), "image")
