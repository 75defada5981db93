"""The API's errors: one JSON shape, ``{"error": code, "message": text}``, mapped once from
segue's exceptions by type (never by message text), and handlers that answer every error a
client can cause without closing its connection.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from segue.executor._log import get_logger
from segue.executor.errors import (
    CompactionDoesNotFitError,
    ConversationExhaustedError,
    ConversationExistsError,
    ConversationNotFoundError,
    InvalidCursorError,
    InvalidDocumentError,
    InvalidMessageError,
    InvalidMetadataError,
    MessageRejectedError,
    NoCompactionError,
    NotPausedError,
    SegueError,
    StoreLockedError,
    StoreUnavailableError,
    UnsupportedOptionError,
)
from segue.server.schemas import ErrorBody

_log = get_logger("segue.server")
_REFUSALS: Final[dict[str, tuple[int, str]]] = {
    "invalid": (422, "invalid_request"),
    "too_large": (422, "message_too_large"),
    "busy": (409, "busy"),
    "paused": (409, "paused"),
    "failed": (409, "failed"),
    "exhausted": (409, "read_only"),
}
"""A refused message's cause, as an HTTP status and a stable error code."""
_INVALID: Final[tuple[tuple[type[SegueError], str], ...]] = (
    (InvalidMetadataError, "invalid_metadata"),
    (InvalidCursorError, "invalid_cursor"),
    (InvalidDocumentError, "invalid_document"),
    (UnsupportedOptionError, "unsupported_option"),
    (CompactionDoesNotFitError, "does_not_fit"),
)
"""A caller's mistake the runtime refused before storing anything, as a 422's stable code."""
_CONFLICTS: Final[tuple[tuple[type[SegueError], str], ...]] = (
    (NotPausedError, "not_paused"),
    (ConversationExistsError, "exists"),
    (NoCompactionError, "no_compaction"),
)
"""A state that does not allow what was asked, as a 409's stable code."""
_HTTP_CODES: Final = {
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    415: "unsupported_media_type",
}


class ApiError(Exception):
    """An error the API answers with its own status and code."""

    def __init__(
        self, status: int, code: str, message: str, *, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = headers or {}


def error(status: int, code: str, message: str, **details: Any) -> JSONResponse:
    """``details``: the ``ErrorBody`` fields beyond the code and message (``field``, the
    figures of ``does_not_fit``)."""
    body = ErrorBody(error=code, message=message, **details)
    return JSONResponse(body.model_dump(exclude_none=True), status_code=status)


def _details(exc: Exception) -> dict[str, Any]:
    """What an error's body says beyond its message: where in an import it is, or the figures
    of an undone compaction that does not fit."""
    if isinstance(exc, InvalidDocumentError):
        return {"field": exc.field}
    if isinstance(exc, CompactionDoesNotFitError):
        return {"needed_tokens": exc.needed_tokens, "threshold_tokens": exc.threshold_tokens}
    return {}


def mapped(exc: Exception) -> JSONResponse:
    """segue's exceptions as the API's errors."""
    if isinstance(exc, ApiError):
        answer = error(exc.status, exc.code, exc.message)
        answer.headers.update(exc.headers)
        return answer
    if isinstance(exc, ConversationNotFoundError):
        return error(404, "not_found", str(exc))
    if isinstance(exc, ConversationExhaustedError):
        return error(409, "read_only", str(exc))
    if isinstance(exc, MessageRejectedError):
        status, code = _REFUSALS.get(exc.cause, (409, "rejected"))
        return error(status, code, str(exc))
    for status, kinds in ((409, _CONFLICTS), (422, _INVALID)):
        for kind, code in kinds:
            if isinstance(exc, kind):
                return error(status, code, str(exc), **_details(exc))
    if isinstance(exc, StoreUnavailableError | StoreLockedError):
        # The type only: the driver's text may name the database's host or file.
        message = f"the store cannot be used now ({type(exc).__name__}): try again shortly"
        return error(503, "unavailable", message)
    if isinstance(exc, ValidationError):
        return error(422, "invalid_request", readable(exc.errors()))
    if isinstance(exc, InvalidMessageError | ValueError):
        return error(422, "invalid_request", str(exc))
    if isinstance(exc, SegueError):
        return error(409, "conflict", str(exc))
    _log.error("request_failed", error_type=type(exc).__name__)
    return error(500, "internal", "the server failed; nothing of the request was lost")


_METHODS: Final = ("DELETE", "GET", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> str:
    """Every method the request's path takes, for a 405's ``Allow`` (RFC 9110): Starlette's
    router names only the first route it found for the path, not the others.

    An API path's are those its OpenAPI schema documents, the most literal template first
    (``/api/conversations/import`` takes POST, though a conversation could be named
    ``import``); any other path's (the page's), each method matched as a request of it would
    be (the routes of included routers too, which FastAPI keeps behind routes of its own)."""
    documented = _documented(request.app.openapi().get("paths", {}), _route_path(request))
    if documented is not None:
        return ", ".join(documented)
    methods = []
    for method in _METHODS:
        asked = {**request.scope, "method": method}
        if any(route.matches(asked)[0] == Match.FULL for route in request.app.router.routes):
            methods.append(method)
    return ", ".join(methods)


def _route_path(request: Request) -> str:
    """The request's path within the app (without the prefix it is mounted under)."""
    path, root = request.url.path, str(request.scope.get("root_path", ""))
    return path[len(root) :] if root and path.startswith(root) else path


def _documented(paths: dict[str, Any], path: str) -> list[str] | None:
    """The methods of the schema's path template that matches ``path`` with the most literal
    segments, or None when none matches."""
    parts = path.split("/")
    best: tuple[int, list[str]] | None = None
    for template, item in paths.items():
        pattern = template.split("/")
        if len(pattern) != len(parts):
            continue
        literal = [p.startswith("{") and p.endswith("}") for p in pattern]
        if not all(
            free or p == given for p, given, free in zip(pattern, parts, literal, strict=True)
        ):
            continue
        score = literal.count(False)
        if best is None or score > best[0]:
            methods = sorted(m.upper() for m in item if m.upper() in _METHODS)
            best = (score, methods)
    return None if best is None else best[1]


def readable(errors: Sequence[Any]) -> str:
    """Validation errors as a person reads them: ``text: Field required``, and a body that is
    not JSON said so (not ``body.1: JSON decode error``)."""
    said: list[str] = []
    for item in errors:
        if item.get("type") == "json_invalid":
            reason = (item.get("ctx") or {}).get("error")
            said.append(f"the body is not valid JSON{f' ({reason})' if reason else ''}")
            continue
        where = [str(part) for part in item.get("loc", ()) if part != "body"]
        message = str(item.get("msg", "is not valid"))
        said.append(f"{'.'.join(where)}: {message}" if where else message)
    return "; ".join(dict.fromkeys(said)) or "the request is not valid"


def install(app: FastAPI) -> None:
    """Handlers for every error a client can cause, each of its own type: Starlette's catch-all
    for ``Exception`` answers too, but then re-raises (a traceback in the log, the connection
    closed under a client that did nothing worse than send bad input)."""

    @app.exception_handler(Exception)
    async def any_error(_request: Request, exc: Exception) -> JSONResponse:
        return mapped(exc)

    @app.exception_handler(ValueError)  # pydantic's ValidationError included
    async def bad_value(_request: Request, exc: ValueError) -> JSONResponse:
        return mapped(exc)

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return mapped(exc)

    @app.exception_handler(SegueError)
    async def segue_error(_request: Request, exc: SegueError) -> JSONResponse:
        return mapped(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return error(422, "invalid_request", readable(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:  # a body FastAPI could not parse: bad input, like the rest
            return error(422, "invalid_request", f"the body is not valid JSON ({exc.detail})")
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        answer = error(exc.status_code, code, str(exc.detail))
        answer.headers.update(exc.headers or {})
        if exc.status_code == 405:
            answer.headers["allow"] = allowed_methods(request)
        return answer


__all__ = ["ApiError", "allowed_methods", "error", "install", "mapped", "readable"]
