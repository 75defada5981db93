"""The bearer token: every API route (and the schema) requires it when the server has one."""

from __future__ import annotations

import secrets
from collections.abc import Callable

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


__all__ = ["bearer"]
