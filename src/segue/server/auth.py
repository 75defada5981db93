"""What an API route requires of a request before it runs: the bearer token (when the server has
one, on every API route and the schema), and a JSON body (a state-changing request)."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Final

from fastapi import Request

from segue.server.errors import ApiError


def bearer(token: str | None) -> Callable[[Request], None]:
    """A dependency that refuses (401) a request without ``Authorization: Bearer <token>``;
    with no token, one that lets everything through."""
    expected = (token or "").encode("utf-8")

    def check(request: Request) -> None:
        if token is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, value = given.partition(" ")
        # As bytes: compare_digest refuses str with characters beyond ASCII (a 500 for a bad
        # token), and the header's bytes are what the client sent (HTTP decodes them latin-1).
        sent = value.strip().encode("latin-1", "replace")
        if scheme.lower() != "bearer" or not secrets.compare_digest(sent, expected):
            raise ApiError(401, "unauthorized", "send Authorization: Bearer <token>")

    return check


WITH_BODY: Final = frozenset({"POST", "PUT", "PATCH"})
"""The methods whose request carries a body (a ``DELETE`` says all in its address)."""


def requires_json(request: Request) -> None:
    """Refuse (415) a POST or PUT whose body is not JSON: an HTML form on another site can send
    nothing else, and ``fetch`` cannot send JSON across sites without a preflight this server
    never grants. A dependency, not middleware, so that a method a path does not take is the
    router's 405 (with its ``Allow``), whatever its body."""
    if request.method not in WITH_BODY:
        return
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media != "application/json":
        message = "send the request as JSON (Content-Type: application/json), '{}' if empty"
        raise ApiError(415, "unsupported_media_type", message)


__all__ = ["bearer", "requires_json"]
