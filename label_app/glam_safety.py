"""What the GLAM label server accepts from a request: names in the studies folder, JSON form fields, origins, hosts.

Plain Python (no MONAI Label import), so the rules are unit-tested in any environment. Every check raises
:class:`RequestRefused` (a 4xx status and a message naming the problem) or returns the accepted value; a refusal
never depends on whether a file exists, so the answers tell a client nothing about the filesystem.

- Datastore ids and label tags are single file-name components of the studies folder: no ``/`` or ``\\``, not
  ``.`` or ``..``, no control characters, at most :data:`MAX_NAME_LENGTH` characters; a new id (an upload) may not
  start with ``.`` either. Ids and tags are never decoded again, so an encoded ``%2e%2e%2f`` is a plain name.
- The ``params`` and ``info`` form fields of MONAI Label's routes are JSON objects.
- Cross-origin access is granted to listed origins only (``scheme://host[:port]``); requests are answered for
  loopback host names and the names the server is told to answer for (DNS rebinding).
"""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

#: longest datastore id or label tag (the stored file name adds the extension; file systems allow 255 bytes)
MAX_NAME_LENGTH = 200
#: host names every server answers for
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
#: form fields of MONAI Label's routes that carry a JSON object
JSON_FORM_FIELDS = ("params", "info")
#: ``glam_server`` sets this flag in the ``state`` of MONAI Label's FastAPI app; the app refuses to start without it
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
    """``value`` if it is a valid datastore id or label tag (``what`` names it in the message), else
    :class:`RequestRefused` (400). ``new``: an id the request creates, which may not start with ``.`` either."""
    if not isinstance(value, str) or not value:
        raise RequestRefused(f"{what} must be a non-empty string, got {_shown(value)}")
    if "/" in value or "\\" in value or value in (".", ".."):
        problem = "is a path; it must name a file of the studies folder (no '/', '\\', '.' or '..')"
    elif any(ord(c) < 32 or ord(c) == 127 for c in value):
        problem = "holds control characters"
    elif len(value) > MAX_NAME_LENGTH:
        problem = f"is longer than {MAX_NAME_LENGTH} characters"
    elif new and value.startswith("."):
        problem = "starts with '.' (hidden files are not served)"
    else:
        return value
    raise RequestRefused(f"{what} {_shown(value)} {problem}")


def is_inside(folder: str | os.PathLike, path: str | os.PathLike) -> bool:
    """Whether ``path`` lies strictly inside ``folder`` once both are absolute with ``..`` collapsed (links are not
    followed: a link the owner put in the studies folder stays usable)."""
    folder, path = os.path.abspath(folder), os.path.abspath(path)
    return path != folder and os.path.commonpath([folder, path]) == folder


def check_inside(folder: str | os.PathLike, path: str | os.PathLike, what: str) -> str:
    """``path`` if it lies inside ``folder``, else :class:`RequestRefused` (400) without the path."""
    if not is_inside(folder, path):
        raise RequestRefused(f"{what} lies outside the studies folder")
    return str(path)


def json_object(field: str, text: Any) -> dict[str, Any]:
    """The JSON object of form field ``field`` (empty: ``{}``, as MONAI Label reads it), else
    :class:`RequestRefused` (400) naming the field and what is wrong."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return {}
    if not isinstance(text, str):
        raise RequestRefused(f"form field {field!r} must be a JSON object, got a {type(text).__name__}")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise RequestRefused(
            f"form field {field!r} is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})"
        ) from None
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
    """``scheme://host[:port]`` of one allowed origin as browsers send it in ``Origin`` (lower-case host, no default
    port, no trailing ``/``); ``ValueError`` naming the entry for anything else (a path, a wildcard, ...)."""
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
    """The allowed origins, normalized, in order, without repeats (:func:`normalize_origin`)."""
    origins: list[str] = []
    for value in values:
        origin = normalize_origin(str(value))
        if origin not in origins:
            origins.append(origin)
    return origins


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) only reaches this machine."""
    host = host.strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def allowed_hosts(extra: str | None) -> list[str]:
    """Host names the server answers for: the loopback names and the comma-separated ``extra`` (``*``: any, for a
    server bound to every interface behind authentication)."""
    hosts = list(LOOPBACK_HOSTS)
    for host in (extra or "").split(","):
        host = host.strip().lower()
        if host in ("*", "0.0.0.0", "::", "[::]"):
            return ["*"]
        if host and host not in hosts:
            hosts.append(host)
    return hosts
