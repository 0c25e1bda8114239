"""The GLAM label server: MONAI Label's FastAPI app, made safe before it starts (``--uvicorn_app glam_server:app``).

MONAI Label's app answers every web origin with credentials, does not check its form fields and offers routes that
read or write outside the studies folder. Here: cross-origin access only for ``GLAM_LABEL_CORS_ORIGINS``, hosts only
loopback and ``GLAM_LABEL_ALLOWED_HOSTS``; JSON form fields, upload names, ``session_id`` and inference inputs
checked; bodies bounded by ``GLAM_LABEL_MAX_UPLOAD_MB``; :data:`REMOVED_ROUTES` answer 404; the auth token check
names its RSA algorithms; refusals answer 4xx with one message (docs/monailabel.md).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

APP_DIR = Path(__file__).resolve().parent
if str(APP_DIR) not in sys.path:
    sys.path.insert(0, str(APP_DIR))

from fastapi import Depends, FastAPI, HTTPException, Request  # noqa: E402
from fastapi.middleware.cors import CORSMiddleware  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from glam_safety import (  # noqa: E402
    JSON_FORM_FIELDS,
    SERVER_FLAG,
    Limits,
    RequestRefused,
    allowed_hosts,
    check_upload_name,
    json_object,
    json_value,
    normalize_origin,
    parse_origins,
)
from monailabel.app import app  # noqa: E402
from monailabel.config import settings  # noqa: E402
from monailabel.interfaces.exception import (  # noqa: E402
    ImageNotFoundException,
    LabelNotFoundException,
    MONAILabelError,
    MONAILabelException,
)
from starlette.datastructures import UploadFile  # noqa: E402
from starlette.exceptions import HTTPException as StarletteHTTPException  # noqa: E402
from starlette.types import ASGIApp, Message, Receive, Scope, Send  # noqa: E402

logger = logging.getLogger(__name__)

#: routes not offered (404, with everything under them): they reach outside the studies folder or the app lacks them
REMOVED_ROUTES = ("/model", "/logs", "/proxy", "/ohif", "/infer/wsi", "/infer/wsi_v2", "/reload", "/train", "/scoring")
#: what a realm's RSA public key verifies (never HMAC: the key is public)
TOKEN_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
_FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")
INFER_PATH = re.compile(r"/infer/[^/]+")
BODY_METHODS = ("POST", "PUT", "PATCH", "DELETE")
SPOOL_IN_MEMORY = 1 << 20  # larger bodies go to an unnamed temporary file
REPLAY_CHUNK = 1 << 20
MAX_JSON_BODY = 1 << 20  # batch inference's parameters are a few hundred bytes


def _host_of(netloc: str) -> str:
    return (urlsplit("//" + netloc).hostname or "").lower()


class RequestGuard:
    """ASGI middleware checking what MONAI Label's routes do not (module docstring); refusals are
    ``{"detail": message}`` with their 4xx.

    The body is read first, bounded by ``max_body`` (413 once passed, nothing more read), spooled to an unnamed
    temporary file and replayed to the app.
    """

    def __init__(
        self,
        app: ASGIApp,
        origins: Sequence[str],
        hosts: Sequence[str],
        max_body: int = Limits().max_body_bytes,
    ) -> None:
        self.app = app
        self.origins = set(origins)
        self.hosts = set(hosts)
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body: Any = None
        try:
            try:
                self._check_headers(Request(scope))
                self._check_path(scope)
                query = self._check_query(scope)
                body = await self._read_body(scope, receive)
                fields = await self._check_body(scope, body)
                self._check_infer_input(scope, query, fields)
            except RequestRefused as e:
                logger.info("refused %s %s: %s", scope.get("method"), scope.get("path"), e)
                await JSONResponse({"detail": str(e)}, status_code=e.status_code)(scope, receive, send)
                return
            await self.app(scope, self._replay(body, receive) if body is not None else receive, send)
        finally:
            if body is not None:
                body.close()

    def _check_headers(self, request: Request) -> None:
        host = request.headers.get("host", "")
        if "*" not in self.hosts and _host_of(host) not in self.hosts:
            raise RequestRefused(
                f"host {host!r} is not a name this server answers for: loopback names and GLAM_LABEL_ALLOWED_HOSTS"
            )
        origin = request.headers.get("origin")
        if origin is None:
            return  # not a browser (Slicer, scripts)
        try:
            if normalize_origin(origin) in self.origins:
                return
        except ValueError:
            pass  # "null" and other non-origins: refused below
        if not host or urlsplit(origin).netloc.lower() != host.lower():
            raise RequestRefused(
                f"cross-origin request from {origin!r} refused: the server grants no origin it was not given "
                "(GLAM_LABEL_CORS_ORIGINS, start_label_server.sh --cors-origin)",
                403,
            )

    @staticmethod
    def _check_path(scope: Scope) -> None:
        path = scope.get("path", "")
        if any(path == p or path.startswith(p + "/") for p in REMOVED_ROUTES):
            raise RequestRefused(f"{path}: not offered by the GLAM server", 404)

    @staticmethod
    def _check_query(scope: Scope) -> dict[str, list[str]]:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        if any(v for v in query.get("session_id", [])):
            raise RequestRefused(
                "session_id: MONAI Label sessions are not enabled in the GLAM app; name a datastore image or "
                "upload the file with the request"
            )
        return query

    @staticmethod
    def _check_infer_input(scope: Scope, query: dict[str, list[str]], fields: set[str]) -> None:
        """``POST /infer/{model}`` needs an input and an output the app writes, and takes no ``label`` upload."""
        if scope.get("method") != "POST" or not INFER_PATH.fullmatch(scope.get("path", "")):
            return
        if "dicom_seg" in query.get("output", []):
            raise RequestRefused("output=dicom_seg needs a DICOMweb datastore: ask for output=image or json")
        if "label" in fields:
            raise RequestRefused("form field 'label': GLAM takes no label with an inference, only the image")
        if not any(query.get("image", [])) and "file" not in fields:
            raise RequestRefused("no input: name a datastore image (?image=ID) or upload one as the form field 'file'")

    def _too_large(self, size: str) -> RequestRefused:
        mib = self.max_body / 2**20
        return RequestRefused(
            f"request body of {size} exceeds the server's limit of {mib:g} MiB "
            "(start_label_server.sh --max-upload-mb, GLAM_LABEL_MAX_UPLOAD_MB)",
            413,
        )

    async def _read_body(self, scope: Scope, receive: Receive) -> Any:
        """The request's body in an unnamed temporary file (None without one), refused (413) past the limit."""
        declared = Request(scope).headers.get("content-length")
        if declared is not None:
            if not declared.strip().isdigit():
                raise RequestRefused(f"Content-Length {declared!r} is not a number")
            if int(declared) > self.max_body:
                raise self._too_large(f"{int(declared)} bytes")
        if scope.get("method") not in BODY_METHODS:
            return None
        spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)
        try:
            received, more = 0, True
            while more:
                message = await receive()
                if message["type"] != "http.request":
                    raise RequestRefused("the client went away before the body was sent")
                chunk = message.get("body", b"")
                received += len(chunk)
                if received > self.max_body:
                    raise self._too_large(f"more than {self.max_body} bytes")
                spool.write(chunk)
                more = message.get("more_body", False)
            spool.seek(0)
        except BaseException:
            spool.close()
            raise
        return spool

    @staticmethod
    def _replay(body: Any, receive: Receive | None = None) -> Receive:
        """A ``receive`` handing over ``body`` in 1 MiB messages, then the client's own (its disconnect)."""
        size = body.seek(0, os.SEEK_END)
        body.seek(0)
        done = False

        async def replay() -> Message:
            nonlocal done
            if done:
                return await receive() if receive is not None else {"type": "http.disconnect"}
            chunk = body.read(REPLAY_CHUNK)
            done = body.tell() >= size
            return {"type": "http.request", "body": chunk, "more_body": not done}

        return replay

    async def _check_body(self, scope: Scope, body: Any) -> set[str]:
        """Check a form's JSON fields and upload names, or a JSON body's nesting; returns the form's field names."""
        if body is None:
            return set()
        content_type = Request(scope).headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type == "application/json":
            text = body.read(MAX_JSON_BODY + 1)
            body.seek(0)
            if len(text) > MAX_JSON_BODY:
                raise RequestRefused(
                    f"a JSON body of more than {MAX_JSON_BODY} bytes: the server's requests are smaller", 413
                )
            if text.strip():
                json_value("the JSON body", text)
            return set()
        if content_type not in _FORM_TYPES:
            return set()
        try:
            form = await Request(scope, self._replay(body)).form()
        except StarletteHTTPException as e:  # malformed multipart: Starlette names the problem
            raise RequestRefused(f"malformed form data: {e.detail}") from None
        try:
            for field in JSON_FORM_FIELDS:
                if field in form:
                    json_object(field, form[field])
            for field, value in form.multi_items():
                if isinstance(value, UploadFile):
                    check_upload_name(value.filename, field)
            return set(form.keys())
        finally:
            await form.close()


async def _refused(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestRefused)
    return JSONResponse({"detail": str(exc)}, status_code=exc.status_code)


async def _monailabel_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, MONAILabelException)
    if isinstance(exc, (ImageNotFoundException, LabelNotFoundException)):
        return JSONResponse({"detail": exc.msg}, status_code=404)
    if exc.error == MONAILabelError.INVALID_INPUT:
        return JSONResponse({"detail": exc.msg}, status_code=400)
    raise exc  # a server-side failure: 500, traceback logged


def _install_token_check(api: FastAPI) -> None:
    """MONAI Label's bearer-token check with the RSA algorithms named (PyJWT 2 refuses tokens otherwise)."""
    import jwt
    import requests
    from monailabel.endpoints.user import auth

    async def current_user(token: str = Depends(auth.oauth2_scheme)) -> auth.User:
        try:
            key = auth.get_public_key(settings.MONAI_LABEL_AUTH_REALM_URI)
        except requests.RequestException as e:
            raise HTTPException(503, f"cannot fetch the realm's public key ({type(e).__name__})") from None
        try:
            payload = jwt.decode(token, key, algorithms=list(TOKEN_ALGORITHMS), options={"verify_aud": False})
        except jwt.InvalidTokenError as e:
            raise HTTPException(401, f"invalid token: {e}", headers={"WWW-Authenticate": "Bearer"}) from None
        roles: Any = payload
        for part in settings.MONAI_LABEL_AUTH_TOKEN_ROLES.split("#"):
            roles = roles.get(part) if isinstance(roles, dict) else None
        return auth.User(
            username=str(payload.get(settings.MONAI_LABEL_AUTH_TOKEN_USERNAME) or ""),
            email=payload.get(settings.MONAI_LABEL_AUTH_TOKEN_EMAIL),
            name=payload.get(settings.MONAI_LABEL_AUTH_TOKEN_NAME),
            roles=[str(r) for r in roles] if isinstance(roles, list) else [],
        )

    api.dependency_overrides[auth.get_current_user] = current_user


def _close_apps_on_shutdown(api: FastAPI) -> None:
    """``close()`` the apps MONAI Label created after its shutdown: uvicorn re-raises stop signals, so ``atexit``
    handlers never run."""
    from monailabel.interfaces.utils.app import apps

    original = api.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[Any]:
        async with original(app) as state:
            yield state
        for instance in list(apps.values()):
            close = getattr(instance, "close", None)
            if callable(close):
                close()

    api.router.lifespan_context = lifespan


def _in_worker_threads(api: FastAPI) -> None:
    """Run MONAI Label's inference routes in FastAPI's worker threads: as ``async`` functions they held the event
    loop for a whole inference. Signatures and dependencies (the token check) are kept."""
    from fastapi.routing import APIRoute
    from monailabel.endpoints import batch_infer, infer

    blocking = {infer.api_run_inference: infer.run_inference, batch_infer.api_run: batch_infer.run}
    # older FastAPI copies included routes into the app, newer ones resolve the routers at the first request
    for router in (api.router, infer.router, batch_infer.router):
        for index, route in enumerate(router.routes):
            impl = blocking.get(route.endpoint) if isinstance(route, APIRoute) else None
            if impl is not None:
                router.routes[index] = _threaded_route(route, impl)
        if hasattr(router, "_routes_version"):  # tell a newer FastAPI that the routes changed
            router._routes_version += 1


def _threaded_route(route: Any, impl: Callable[..., Any]) -> Any:
    """``route`` with a plain function calling ``impl`` as its endpoint, of the same signature."""
    import inspect

    from fastapi.routing import APIRoute

    def endpoint(**kwargs: Any) -> Any:
        kwargs.pop("user", None)  # the token check has run (a dependency); the implementation takes no user
        return impl(**kwargs)

    endpoint.__signature__ = inspect.signature(route.endpoint)  # type: ignore[attr-defined]
    endpoint.__name__ = route.endpoint.__name__
    return APIRoute(
        route.path,
        endpoint,
        methods=list(route.methods),
        summary=route.summary,
        name=route.name,
        tags=route.tags,
        dependencies=route.dependencies,
        responses=route.responses,
    )


def configure(api: FastAPI) -> FastAPI:
    """Make MONAI Label's FastAPI app ``api`` the GLAM server (module docstring), before it starts."""
    origins = parse_origins(o for o in os.environ.get("GLAM_LABEL_CORS_ORIGINS", "").split(",") if o.strip())
    hosts = allowed_hosts(os.environ.get("GLAM_LABEL_ALLOWED_HOSTS"))
    limits = Limits.from_env()
    api.user_middleware[:] = [m for m in api.user_middleware if m.cls is not CORSMiddleware]
    api.add_middleware(RequestGuard, origins=origins, hosts=hosts, max_body=limits.max_body_bytes)
    if origins:  # outside the guard, for the listed origins' preflights; no cookies: auth is a bearer token
        methods = ["GET", "HEAD", "POST", "PUT", "DELETE"]
        api.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=methods, allow_headers=["*"])
    api.add_exception_handler(RequestRefused, _refused)
    api.add_exception_handler(MONAILabelException, _monailabel_error)
    if settings.MONAI_LABEL_AUTH_ENABLE:
        _install_token_check(api)
    _close_apps_on_shutdown(api)
    _in_worker_threads(api)
    setattr(api.state, SERVER_FLAG, True)
    logger.info(
        "GLAM server: cross-origin access for %s; hosts %s; request bodies up to %d MiB; authentication %s; "
        "not offered: %s",
        origins or "no origin",
        hosts,
        limits.max_upload_mb,
        f"on ({settings.MONAI_LABEL_AUTH_REALM_URI})" if settings.MONAI_LABEL_AUTH_ENABLE else "off",
        list(REMOVED_ROUTES),
    )
    return api


configure(app)
