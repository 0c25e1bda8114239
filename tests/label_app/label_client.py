"""The label server as the tests start and talk to it: tools/start_label_server.sh on a free 127.0.0.1 port,
plain HTTP requests that return the status instead of raising, and a stop that the tests check."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import nrrd
import numpy as np
from conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "tools" / "start_label_server.sh"
SETUP_TIMEOUT_S = 1500
START_TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


FileField = Path | tuple[str, bytes]


def multipart(fields: Mapping[str, str], files: Mapping[str, FileField] | None = None) -> tuple[bytes, str]:
    """A multipart/form-data body and its content type; a file is a path or ``(filename, bytes)``."""
    boundary = uuid.uuid4().hex
    body = b""
    for name, value in fields.items():
        body += f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
    for name, file in (files or {}).items():
        filename, data = (file.name, file.read_bytes()) if isinstance(file, Path) else file
        body += (
            (
                f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
                "Content-Type: application/octet-stream\r\n\r\n"
            ).encode()
            + data
            + b"\r\n"
        )
    body += f"--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


class Server:
    def __init__(self, port: int, log: Path, pid: int | None = None) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.log = log
        self.pid = pid  # the server's process (the start script execs it)

    def scratch(self) -> Path:
        """The app's temporary folder (uploads, results), as the log names it."""
        found = re.findall(r"GLAM temporary folder \(uploads, results\): (\S+)", self.log.read_text())
        assert found, "the log names no temporary folder"
        return Path(found[-1])

    def rss_mb(self) -> float:
        """The server process's resident memory, MiB (Linux)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: Mapping[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        """(status, lower-cased headers, body) of one request; HTTP errors are answers, not exceptions."""
        req = urllib.request.Request(self.base + path, data=body, method=method, headers=dict(headers or {}))
        try:
            with urllib.request.urlopen(req, timeout=180) as r:
                return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
        except urllib.error.HTTPError as e:
            return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()

    def form(
        self,
        method: str,
        path: str,
        fields: Mapping[str, str],
        files: Mapping[str, FileField] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        body, ctype = multipart(fields, files)
        return self.request(method, path, body, {"Content-Type": ctype, **(headers or {})})

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self.base + path, timeout=60) as r:
            return json.loads(r.read())

    def infer(self, query: str, params: dict | None = None, upload: Path | None = None) -> tuple[int, bytes]:
        status, _, content = self.form(
            "POST", f"/infer/glam?{query}", {"params": json.dumps(params or {})}, {"file": upload} if upload else None
        )
        return status, content

    def infer_map(self, tmp: Path, query: str, params: dict, upload: Path | None = None) -> tuple[np.ndarray, dict]:
        """(map (H, W) as the bundle's convention, NRRD header) of an output=image request."""
        status, content = self.infer(query + "&output=image", params, upload)
        assert status == 200, content[:500]
        path = tmp / f"{uuid.uuid4().hex}.nrrd"
        path.write_bytes(content)
        array, header = nrrd.read(str(path), index_order="C")
        return array, header

    def is_up(self) -> bool:
        """Whether anything answers HTTP on the port (an answer with an error status counts)."""
        try:
            urllib.request.urlopen(self.base + "/info/", timeout=10).close()
        except urllib.error.HTTPError:
            return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False
        return True


def label_python() -> str:
    """The label environment's python (built by the start script on first use)."""
    res = subprocess.run(["bash", str(SCRIPT), "--setup-only"], capture_output=True, text=True, timeout=SETUP_TIMEOUT_S)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout.strip().splitlines()[-1]


@contextmanager
def running_server(studies: Path, log: Path, *args: str, env: Mapping[str, str] | None = None) -> Iterator[Server]:
    """The server of ``studies`` on a free 127.0.0.1 port (``args``: more start_label_server.sh options), stopped
    on exit; the exit checks that nothing answers on the port any more."""
    label_python()
    port = free_port()
    cmd = ["bash", str(SCRIPT), "--studies", str(studies), "--port", str(port), "--device", "cpu", *args]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env, start_new_session=True)
    srv = Server(port, log, proc.pid)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not srv.is_up():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"server did not start (exit {proc.poll()}):\n{log.read_text()[-4000:]}")
            time.sleep(1)
        yield srv
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    assert proc.poll() is not None and not srv.is_up()  # stopped
    scratch = re.findall(r"GLAM temporary folder \(uploads, results\): (\S+)", log.read_text())
    assert scratch and not any(Path(p).exists() for p in scratch), scratch  # removed at shutdown
