"""The page: one HTML document for ``/`` and ``/c/{id}``, and the static files it loads.

The page's URLs are relative to a ``<base href>`` the server writes into it from the request's
``root_path``, so the app works where it is mounted (``parent.mount("/segue", app)``) or behind
a proxy's prefix. The static files are a fixed set, listed from the package when the app is
built: a name from a URL is looked up in it, never joined onto a path.
"""

from __future__ import annotations

import html
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Final

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, Response

from segue.server.errors import ApiError

_STATIC: Final = resources.files("segue.server") / "static"
_MEDIA: Final = {
    ".js": "text/javascript",
    ".mjs": "text/javascript",
    ".css": "text/css",
    ".txt": "text/plain",
    ".svg": "image/svg+xml",
}
_BASE_MARK: Final = "<!--base-->"


def static_files() -> dict[str, tuple[bytes, str]]:
    """Every file under ``static/`` the page may load, by its path there: content and type."""
    found: dict[str, tuple[bytes, str]] = {}

    def walk(folder: Traversable, prefix: str) -> None:
        for entry in folder.iterdir():
            if entry.is_dir():
                walk(entry, f"{prefix}{entry.name}/")
                continue
            suffix = entry.name[entry.name.rfind(".") :] if "." in entry.name else ""
            media = _MEDIA.get(suffix)
            if media is not None and not entry.name.startswith("."):
                found[prefix + entry.name] = (entry.read_bytes(), media)

    walk(_STATIC, "")
    return found


def install(app: FastAPI) -> None:
    """The page's routes on ``app``."""
    page = (_STATIC / "index.html").read_text(encoding="utf-8")
    if _BASE_MARK not in page:
        msg = "index.html lost the mark where the server writes its <base href>"
        raise RuntimeError(msg)
    files = static_files()
    caching = {"cache-control": "no-cache"}  # a new version of segue is seen at once

    def document(request: Request) -> HTMLResponse:
        root = str(request.scope.get("root_path", "")).rstrip("/")
        base = f'<base href="{html.escape(root, quote=True)}/">'
        return HTMLResponse(page.replace(_BASE_MARK, base, 1), headers=caching)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def home(request: Request) -> HTMLResponse:
        return document(request)

    @app.get("/c/{conversation_id}", response_class=HTMLResponse, include_in_schema=False)
    async def conversation_page(request: Request, conversation_id: str) -> HTMLResponse:
        return document(request)  # the page reads the id from its address

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:
        # Browsers (and tools) that ignore the page's <link rel="icon"> ask here: the same icon.
        content, media = files["favicon.svg"]
        return Response(content, media_type=media, headers=caching)

    @app.get("/static/{name:path}", include_in_schema=False)
    async def static(name: str) -> Response:
        found = files.get(name)
        if found is None:
            raise ApiError(404, "not_found", f"no static file {name!r}")
        content, media = found
        return Response(content, media_type=media, headers=caching)


__all__ = ["install", "static_files"]
