"""The label server's request rules (label_app/glam_safety.py: plain Python, tested here in the project's
environment): which ids and tags name a file of the studies folder, the JSON form fields, origins and hosts."""

from __future__ import annotations

import importlib.util
import os
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
    for host in ("0.0.0.0", "::", "192.168.1.5", "labels.example.org", "127.0.0.1.example.org"):
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
SCRIPT = REPO_ROOT / "scripts" / "start_label_server.sh"


def _start(*args: str, auth: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONAI_LABEL_AUTH")}
    if auth is not None:
        env["MONAI_LABEL_AUTH_ENABLE"] = auth
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20", "::", "labels.example.org"])
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
