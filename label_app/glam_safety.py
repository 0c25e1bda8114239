"""What the GLAM label server accepts from a request: names, paths, JSON form fields, origins, hosts and sizes.

Plain Python (no MONAI Label import). Every check returns the accepted value or raises :class:`RequestRefused` (4xx
and a message); a refusal never depends on whether a file exists. Ids and tags are single file-name components;
paths are decided on where they resolve, and nothing is written or deleted through a link.
"""

from __future__ import annotations

import ipaddress
import json
import os
import stat
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple
from urllib.parse import urlsplit

#: longest datastore id or label tag (the stored name adds the extension)
MAX_NAME_LENGTH = 200
#: deepest JSON nesting a request may carry (Python's parser fails near 1000)
MAX_JSON_DEPTH = 32
MAX_UPLOAD_NAME_BYTES = 255
#: most digits of a JSON integer (Python refuses more than 4300)
MAX_JSON_INT_DIGITS = 64
#: Unicode categories refused in names: controls and invisible format characters (U+202E), which disguise a name
INVISIBLE_CATEGORIES = ("Cc", "Cf")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
JSON_FORM_FIELDS = ("params", "info")
#: set by ``glam_server`` in the FastAPI app's ``state``; the app refuses to start without it
SERVER_FLAG = "glam_guarded"
_DEFAULT_PORTS = {"http": 80, "https": 443}


class RequestRefused(ValueError):
    """A request the server refuses: ``status_code`` (4xx) and a message that names the problem."""

    def __init__(self, message: str, status_code: int = 400) -> None:
        super().__init__(message)
        self.status_code = status_code


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_name(value: Any, what: str, *, new: bool = False) -> str:
    """``value`` if it is a valid datastore id or label tag, else :class:`RequestRefused` (400).

    Args:
        value: the name.
        what: names it in the message.
        new: an id the request creates, which may not start with ``.`` either.
    """
    if not isinstance(value, str) or not value:
        raise RequestRefused(f"{what} must be a non-empty string, got {_shown(value)}")
    if "/" in value or "\\" in value or value in (".", ".."):
        problem = "is a path; it must name a file of the studies folder (no '/', '\\', '.' or '..')"
    elif not is_utf8(value):
        problem = "is not valid UTF-8"
    elif invisible_characters(value):
        problem = f"holds control or invisible format characters ({invisible_characters(value)})"
    elif len(value) > MAX_NAME_LENGTH:
        problem = f"is longer than {MAX_NAME_LENGTH} characters"
    elif new and value.startswith("."):
        problem = "starts with '.' (hidden files are not served)"
    else:
        return value
    raise RequestRefused(f"{what} {_shown(value)} {problem}")


def invisible_characters(text: str) -> str:
    """The code points of ``text`` in :data:`INVISIBLE_CATEGORIES`, as ``U+202E, U+0000`` (empty: none)."""
    found = dict.fromkeys(f"U+{ord(c):04X}" for c in text if unicodedata.category(c) in INVISIBLE_CATEGORIES)
    return ", ".join(found)


def is_utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (a non-UTF-8 file name carries surrogates no JSON answer can hold)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown_name(name: str | bytes) -> str:
    """A file name for a log line, non-UTF-8 bytes escaped."""
    return "'" + os.fsencode(name).decode("utf-8", errors="backslashreplace") + "'"


def check_upload_name(value: Any, field: str) -> str:
    """The file name of an upload in form field ``field`` (empty allowed), else :class:`RequestRefused` (400)."""
    if value is None or value == "":
        return ""
    if not isinstance(value, str):
        raise RequestRefused(f"the file name of form field {field!r} must be text, got {_shown(value)}")
    if "/" in value or "\\" in value:
        problem = "is a path; send the file's name only (no '/' or '\\')"
    elif not is_utf8(value):
        problem = "is not valid UTF-8"
    elif invisible_characters(value):
        problem = (
            f"holds control characters (such as NUL) or invisible format characters: {invisible_characters(value)}"
        )
    elif len(value.encode("utf-8")) > MAX_UPLOAD_NAME_BYTES:
        problem = f"is longer than {MAX_UPLOAD_NAME_BYTES} bytes"
    elif value in (".", ".."):
        problem = "is not a file name"
    else:
        return value
    raise RequestRefused(f"the file name {_shown(value)} of form field {field!r} {problem}")


def is_inside(folder: str | os.PathLike, path: str | os.PathLike) -> bool:
    """Whether ``path`` lies strictly inside ``folder``, lexically (links not followed)."""
    folder, path = os.path.abspath(folder), os.path.abspath(path)
    return path != folder and os.path.commonpath([folder, path]) == folder


def check_inside(folder: str | os.PathLike, path: str | os.PathLike, what: str) -> str:
    """``path`` if it lies inside ``folder``, else :class:`RequestRefused` (400) without the path."""
    if not is_inside(folder, path):
        raise RequestRefused(f"{what} lies outside the studies folder")
    return str(path)


def _inside_or_equal(folder: str, path: str) -> bool:
    return path == folder or os.path.commonpath([folder, path]) == folder


def _links_between(folder: str, path: str) -> list[str]:
    """The symbolic links among ``path`` and its parents below ``folder``."""
    links, current = [], folder
    for part in os.path.relpath(path, folder).split(os.sep):
        current = os.path.join(current, part)
        if os.path.islink(current):
            links.append(current)
    return links


def readable_path(folder: str | os.PathLike, path: str | os.PathLike, what: str) -> str:
    """``path`` inside ``folder`` (normalized, not resolved) if the server may read it.

    It must resolve inside ``folder`` or pass only through links of the server's own user (images on another disk);
    the path returned never shows where a link leads.

    Raises:
        RequestRefused: 400 for a path outside, 403 for another user's link.
    """
    root = os.path.realpath(folder)
    lexical = check_inside(root, os.path.normpath(os.path.join(root, path)), what)
    if _inside_or_equal(root, os.path.realpath(lexical)):
        return lexical
    for link in _links_between(root, lexical):
        owner = os.lstat(link).st_uid
        if owner != os.geteuid():
            raise RequestRefused(
                f"{what} is reached through a symbolic link of another user (uid {owner}) that leads outside the "
                "studies folder: the server follows only its own user's links",
                403,
            )
    return lexical


def writable_path(folder: str | os.PathLike, path: str | os.PathLike, what: str) -> str:
    """Where a write to ``path`` inside ``folder`` lands: its resolved folder joined with its name; write by rename.

    Raises:
        RequestRefused: 403 when the folder leads outside through a link, or the file is a link or a folder.
    """
    root = os.path.realpath(folder)
    lexical = check_inside(root, os.path.normpath(os.path.join(root, path)), what)
    parent = os.path.realpath(os.path.dirname(lexical))
    if not _inside_or_equal(root, parent):
        raise RequestRefused(
            f"{what}: its folder is a symbolic link that leads outside the studies folder; the server writes and "
            "deletes only inside it",
            403,
        )
    target = os.path.join(parent, os.path.basename(lexical))
    if os.path.islink(target):
        raise RequestRefused(
            f"{what} is a symbolic link: the server reads through links but never writes or deletes through them "
            "(replace or remove the link on the server itself)",
            403,
        )
    if os.path.isdir(target):
        raise RequestRefused(f"{what} is a folder, not a file", 403)
    return target


def deletable_path(folder: str | os.PathLike, path: str | os.PathLike, what: str) -> str | None:
    """The regular file to unlink for ``path`` (as :func:`writable_path`), or None when nothing is there."""
    target = writable_path(folder, path, what)
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(mode):
        raise RequestRefused(f"{what} is not a regular file: the server deletes only files it could have written", 403)
    return target


def json_depth(value: Any) -> int:
    """How deep lists and objects nest in a parsed JSON value (a scalar: 0)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth + 1)
            stack.extend((v, depth + 1) for v in item)
    return deepest


def json_value(what: str, text: str | bytes) -> Any:
    """The JSON value of ``text`` nested at most :data:`MAX_JSON_DEPTH` deep, else :class:`RequestRefused` (400)."""
    too_deep = f"{what} nests lists or objects deeper than {MAX_JSON_DEPTH} levels"

    def bounded_int(digits: str) -> int:
        if len(digits.lstrip("-")) > MAX_JSON_INT_DIGITS:
            raise RequestRefused(
                f"{what} holds an integer of {len(digits.lstrip('-'))} digits; the server takes at most "
                f"{MAX_JSON_INT_DIGITS}"
            )
        return int(digits)

    try:
        value = json.loads(text, parse_int=bounded_int)
    except RequestRefused:
        raise
    except json.JSONDecodeError as e:
        raise RequestRefused(f"{what} is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    except UnicodeDecodeError:
        raise RequestRefused(f"{what} is not UTF-8 text") from None
    except RecursionError:  # the parser gives up near 1000 levels
        raise RequestRefused(too_deep) from None
    if json_depth(value) > MAX_JSON_DEPTH:
        raise RequestRefused(too_deep)
    return value


def json_object(field: str, text: Any) -> dict[str, Any]:
    """The JSON object of form field ``field`` (empty: ``{}``), else :class:`RequestRefused` (400)."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return {}
    if not isinstance(text, str):
        raise RequestRefused(f"form field {field!r} must be a JSON object, got a {type(text).__name__}")
    value = json_value(f"form field {field!r}", text)
    if not isinstance(value, dict):
        kind = "null" if value is None else type(value).__name__
        raise RequestRefused(f"form field {field!r} must be a JSON object ({{...}}), got {kind}")
    return value


def as_bool(value: Any, what: str) -> bool:
    """A request flag sent as JSON (``true``) or as text (``"true"``, ``"1"``, ``"yes"``, ...)."""
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off", ""):
        return False
    raise RequestRefused(f"{what} must be true or false, got {_shown(value)}")


def normalize_origin(value: str) -> str:
    """An allowed origin as browsers send it: ``scheme://host[:port]``, lower-case, no default port.

    Raises:
        ValueError: naming the entry for anything else (a path, a wildcard, ...).
    """
    text = str(value).strip()
    hint = "expected scheme://host[:port], e.g. http://localhost:3000"
    if "*" in text:
        raise ValueError(f"CORS origin {text!r}: wildcards are not accepted, list each origin ({hint})")
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"CORS origin {text!r}: bad port ({hint})") from None
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise ValueError(f"CORS origin {text!r}: {hint}")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"CORS origin {text!r}: an origin has no path, query or user ({hint})")
    host = parts.hostname.lower()
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}" + (f":{port}" if port and port != _DEFAULT_PORTS[parts.scheme] else "")


def parse_origins(values: Iterable[Any]) -> list[str]:
    """The allowed origins, normalized, in order, without repeats."""
    origins: list[str] = []
    for value in values:
        origin = normalize_origin(str(value))
        if origin not in origins:
            origins.append(origin)
    return origins


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) only reaches this machine."""
    host = host.strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def allowed_hosts(extra: str | None) -> list[str]:
    """The loopback names and the comma-separated ``extra`` (``*``: any host)."""
    hosts = list(LOOPBACK_HOSTS)
    for host in (extra or "").split(","):
        host = host.strip().lower()
        if host in ("*", "0.0.0.0", "::", "[::]"):
            return ["*"]
        if host and host not in hosts:
            hosts.append(host)
    return hosts


#: environment variable -> (default, what it bounds)
LIMIT_VARIABLES = {
    "GLAM_LABEL_MAX_UPLOAD_MB": (256, "the size of a request body (an upload), in MiB"),
    "GLAM_LABEL_MAX_IMAGE_SIDE": (8192, "each side of the model's image_size (the preprocessing window), in pixels"),
    "GLAM_LABEL_MAX_PATCH_SIDE": (2048, "each side of the model's patch_size, in pixels"),
    "GLAM_LABEL_MAX_PATCHES": (32, "the patches per image (num_patches_eval)"),
    "GLAM_LABEL_MAX_IMAGE_PIXELS": (50_000_000, "the pixels of an input image, as its header states them"),
}
#: the shortest side (pixels) and largest aspect ratio of an input (a mammogram's is about 1.2-1.6)
MIN_IMAGE_SIDE = 32
MAX_IMAGE_ASPECT = 10


class Limits(NamedTuple):
    """What one request and one model may ask of the server (:data:`LIMIT_VARIABLES`); the model limits keep a
    checkpoint's settings from making every image allocate gigabytes."""

    max_upload_mb: int = LIMIT_VARIABLES["GLAM_LABEL_MAX_UPLOAD_MB"][0]
    max_image_side: int = LIMIT_VARIABLES["GLAM_LABEL_MAX_IMAGE_SIDE"][0]
    max_patch_side: int = LIMIT_VARIABLES["GLAM_LABEL_MAX_PATCH_SIDE"][0]
    max_patches: int = LIMIT_VARIABLES["GLAM_LABEL_MAX_PATCHES"][0]
    max_image_pixels: int = LIMIT_VARIABLES["GLAM_LABEL_MAX_IMAGE_PIXELS"][0]

    @property
    def max_body_bytes(self) -> int:
        return self.max_upload_mb * 1024 * 1024

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Limits:
        """The limits the environment sets; ``ValueError`` naming a variable that is not a positive whole number."""
        environ = os.environ if environ is None else environ
        values = {}
        for (name, (default, meaning)), field in zip(LIMIT_VARIABLES.items(), cls._fields):
            text = str(environ.get(name, "")).strip()
            if not text:
                values[field] = default
                continue
            if not text.isdigit() or int(text) < 1:
                raise ValueError(f"{name}={text!r}: expected a positive whole number ({meaning}; default {default})")
            values[field] = int(text)
        return cls(**values)


def check_image_shape(shape: Iterable[int], limits: Limits, what: str) -> None:
    """Refuse, from the header's ``shape``, an image above ``limits.max_image_pixels`` (413) or of no mammogram's
    shape (400: :data:`MIN_IMAGE_SIDE`, :data:`MAX_IMAGE_ASPECT`); ``what`` names it."""
    dims = [int(d) for d in shape]
    pixels = 1
    for d in dims:
        pixels *= max(d, 0)
    size = " x ".join(str(d) for d in dims)
    if pixels > limits.max_image_pixels:
        raise RequestRefused(
            f"{what}: its header states {size} = {pixels:,} pixels, above the server's limit of "
            f"{limits.max_image_pixels:,} (GLAM_LABEL_MAX_IMAGE_PIXELS raises it)",
            413,
        )
    sides = [d for d in dims if d != 1] if len(dims) > 2 else dims
    if len(sides) != 2:
        return  # not 2-D: the reader names the problem
    short, long = min(sides), max(sides)
    if short < MIN_IMAGE_SIDE or long > MAX_IMAGE_ASPECT * short:
        raise RequestRefused(
            f"{what}: an image of {size} pixels is no mammogram the model can place (each side at least "
            f"{MIN_IMAGE_SIDE} pixels, the longer at most {MAX_IMAGE_ASPECT} times the shorter)"
        )


def _pair(value: Any) -> list[int] | None:
    """``(rows, cols)`` of a size setting (an int or two ints), None for anything else."""
    items = list(value) if isinstance(value, (list, tuple)) else [value, value]
    if len(items) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in items):
        return None
    return items


def check_model_settings(settings: Mapping[str, Any], limits: Limits, source: str) -> None:
    """Refuse a model whose ``image_size``, ``patch_size`` or ``num_patches_eval`` lie outside ``limits``.

    Raises:
        ValueError: naming each setting, ``source``, the limit and the environment variable that raises it.
    """
    problems = []
    bounds = [
        ("image_size", limits.max_image_side, "GLAM_LABEL_MAX_IMAGE_SIDE", "pixels per side"),
        ("patch_size", limits.max_patch_side, "GLAM_LABEL_MAX_PATCH_SIDE", "pixels per side"),
    ]
    for name, limit, variable, unit in bounds:
        if name not in settings:
            continue
        pair = _pair(settings[name])
        if pair is None or min(pair) < 1:
            problems.append(f"{name} {json.dumps(settings[name])} is not a positive size (rows, cols)")
        elif max(pair) > limit:
            problems.append(f"{name} {pair} exceeds the limit of {limit} {unit} ({variable} raises it)")
    if "num_patches_eval" in settings:
        count = settings["num_patches_eval"]
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            problems.append(f"num_patches_eval {json.dumps(count)} is not a positive whole number")
        elif count > limits.max_patches:
            problems.append(
                f"num_patches_eval {count} exceeds the limit of {limits.max_patches} patches per image "
                "(GLAM_LABEL_MAX_PATCHES raises it)"
            )
    image, patch = _pair(settings.get("image_size")), _pair(settings.get("patch_size"))
    if image and patch and not problems and (patch[0] > image[0] or patch[1] > image[1]):
        problems.append(f"patch_size {patch} is larger than image_size {image}")
    if problems:
        raise ValueError(f"{source}: {'; '.join(problems)}; the label server refuses the model")
