"""What the server refuses before any route runs, over real HTTP: a request to a name that is not
this machine's (DNS rebinding), a state-changing request from another site or not in JSON (a
cross-site form), and the headers every response carries; the schema behind the token, and an
empty token refused where the app is built.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from api import create, error, send
from segue import MemoryStore, Runtime, ScriptedModel
from segue.server import create_app
from segue.server.run import ServerConfig, build_app
from segue.testing import live_server

pytestmark = pytest.mark.slow

TOKEN = "t0ken-for-the-guard-test"  # noqa: S105  # a test token, not a secret
STATIC = Path(__file__).resolve().parents[1] / "src" / "segue" / "server" / "static"


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``segue serve`` as a fresh clone runs it: loopback, no token."""
    db = tmp_path_factory.mktemp("guard") / "guard.db"
    with live_server(build_app(ServerConfig(db=db, chunk_delay=0.0))) as served:
        yield served


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


# --------------------------------------------------------------------------- the host


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:{port}",
        "localhost.evil.example:{port}",
        "127.0.0.1.nip.io:{port}",
        "0.0.0.0:{port}",
        "192.168.1.20:{port}",
    ],
)
def test_a_rebinding_host_reads_and_changes_nothing(url: str, host: str) -> None:
    """A page on a name that resolves to 127.0.0.1 reaches the port, but sends its own Host."""
    named = {"host": host.format(port=port_of(url))}
    with httpx2.Client(base_url=url, timeout=30) as http:
        before = http.get("/api/conversations").json()
        assert "localhost only" in error(
            http.get("/api/conversations", headers=named), 403, "forbidden"
        )
        created = http.post("/api/conversations", json={}, headers=named)
        error(created, 403, "forbidden")
        error(http.get("/", headers=named), 403, "forbidden")
        error(http.get("/static/app.css", headers=named), 403, "forbidden")
        assert http.get("/api/conversations").json() == before


@pytest.mark.parametrize(
    "host", ["localhost:{port}", "127.0.0.1:{port}", "[::1]:{port}", "localhost"]
)
def test_loopback_names_are_answered(url: str, host: str) -> None:
    named = {"host": host.format(port=port_of(url))}
    with httpx2.Client(base_url=url, timeout=30) as http:
        assert http.get("/api/conversations", headers=named).status_code == 200
        assert http.post("/api/conversations", json={}, headers=named).status_code == 201


def test_with_a_token_any_name_may_ask_with_it(tmp_path: Path) -> None:
    config = ServerConfig(db=tmp_path / "open.db", host="0.0.0.0", token=TOKEN)  # noqa: S104
    with live_server(build_app(config)) as url, httpx2.Client(base_url=url, timeout=30) as http:
        named = {"host": "segue.example.org"}
        error(http.get("/api/conversations", headers=named), 401, "unauthorized")
        authorized = {**named, "authorization": f"Bearer {TOKEN}"}
        assert http.get("/api/conversations", headers=authorized).status_code == 200


def test_an_application_names_the_hosts_it_is_served_by() -> None:
    runtime = Runtime(store=MemoryStore(), llm=ScriptedModel(window=20_000))
    app = create_app(runtime, allowed_hosts=["chat.internal"])
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=30) as http:
        assert http.get("/api/info", headers={"host": "chat.internal:8080"}).status_code == 200
        error(http.get("/api/info", headers={"host": "other.internal"}), 403, "forbidden")


# --------------------------------------------------------------------------- other sites


def routes(cid: str) -> list[str]:
    """Every state-changing route, for one conversation."""
    base = f"/api/conversations/{cid}"
    return [
        "/api/conversations",
        f"{base}/messages",
        f"{base}/continue",
        f"{base}/cancel",
        f"{base}/pause",
        f"{base}/resume",
        f"{base}/children",
    ]


def snapshot(http: httpx2.Client, cid: str) -> tuple[Any, ...]:
    """Everything a forged request could change."""
    state = http.get(f"/api/conversations/{cid}").json()
    return (
        len(http.get("/api/conversations").json()),
        state["phase"],
        state["session"],
        state["child_id"],
        http.get(f"/api/conversations/{cid}/messages").json(),
        http.get(f"/api/conversations/{cid}/snapshots").json(),
    )


def test_a_cross_site_form_changes_nothing(url: str) -> None:
    """A form on another site posts form-encoded with its Origin; ``fetch`` in no-cors mode
    posts text/plain; neither is taken, on any route, and the conversation stays as it was."""
    with httpx2.Client(base_url=url, timeout=30) as http:
        cid = create(http)["id"]
        send(http, cid, "Hello.")
        before = snapshot(http, cid)
        foreign = "https://evil.example"
        for path in routes(cid):
            form = {"text": "pwned", "reason": "pwned", "seed_with_summary": "true"}
            forged = http.post(path, data=form, headers={"origin": foreign})
            assert "evil.example" in error(forged, 403, "forbidden")
            error(http.post(path, data=form), 415, "unsupported_media_type")  # no Origin
            plain = {"content-type": "text/plain"}
            error(
                http.post(path, content=b'{"text": "pwned"}', headers=plain),
                415,
                "unsupported_media_type",
            )
            as_json = {"origin": foreign}
            error(http.post(path, json={"text": "pwned"}, headers=as_json), 403, "forbidden")
            error(http.post(path, json={}, headers={"origin": "null"}), 403, "forbidden")
            other_port = f"http://127.0.0.1:{port_of(url) + 1}"
            error(http.post(path, json={}, headers={"origin": other_port}), 403, "forbidden")
        assert snapshot(http, cid) == before
        own = {"origin": url}  # the page itself: its own origin, JSON
        continued = http.post(f"/api/conversations/{cid}/continue", json={}, headers=own)
        assert continued.json()["phase"] == "context_exhausted"


# --------------------------------------------------------------------------- headers


def assert_shielded(response: httpx2.Response) -> None:
    headers = response.headers
    policy = headers["content-security-policy"]
    assert "frame-ancestors 'none'" in policy
    assert "script-src 'self'" in policy
    assert "unsafe-inline" not in policy
    assert "unsafe-eval" not in policy
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "no-referrer"
    assert headers["x-frame-options"] == "DENY"


def test_every_response_carries_the_security_headers(url: str) -> None:
    with httpx2.Client(base_url=url, timeout=30) as http:
        cid = create(http)["id"]
        responses = [
            http.get("/"),
            http.get(f"/c/{cid}"),
            http.get("/static/app.css"),
            http.get("/api/info"),
            http.get("/api/conversations/nope"),  # an error
            http.post("/api/conversations", data={"a": "b"}),  # refused by the guard
            http.post(f"/api/conversations/{cid}/messages", json={"text": "Hi."}),  # SSE
            http.post(
                "/api/conversations",
                content=b"x" * (9 * 1024 * 1024),
                headers={"content-type": "application/json"},
            ),  # 413
            http.get("/api/conversations", headers={"host": "evil.example"}),  # 403
        ]
        assert [r.status_code for r in responses] == [200, 200, 200, 200, 404, 415, 200, 413, 403]
        for response in responses:
            assert_shielded(response)


def test_the_page_runs_no_inline_script() -> None:
    """What the policy forbids is not in the page: no inline script, no handler attributes."""
    page = (STATIC / "index.html").read_text(encoding="utf-8")
    assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", page) == []
    assert re.findall(r"\son[a-z]+\s*=", page) == []
    assert "style=" not in page


# --------------------------------------------------------------------------- the token


def test_the_schema_is_behind_the_token(tmp_path: Path) -> None:
    app = build_app(ServerConfig(db=tmp_path / "schema.db", token=TOKEN))
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=30) as http:
        error(http.get("/openapi.json"), 401, "unauthorized")
        error(
            http.get("/openapi.json", headers={"authorization": "Bearer nope"}), 401, "unauthorized"
        )
        schema = http.get("/openapi.json", headers={"authorization": f"Bearer {TOKEN}"})
        assert "/api/conversations" in schema.json()["paths"]
        assert http.get("/docs").status_code == 404  # its scripts would come from a CDN
        assert http.get("/").status_code == 200  # the page holds no data


def test_every_api_route_is_behind_the_token(tmp_path: Path) -> None:
    """Each group of routes is a router of its own: none may be included without the token
    (the health probes aside: a load balancer's probe has none, and they say nothing of
    conversations)."""
    app = build_app(ServerConfig(db=tmp_path / "routes.db", token=TOKEN))
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=30) as http:
        schema = http.get("/openapi.json", headers={"authorization": f"Bearer {TOKEN}"}).json()
        asked = [
            (method, re.sub(r"\{[^}]*\}", "1", path))
            for path, operations in schema["paths"].items()
            for method in operations
            if path not in ("/healthz", "/readyz")
        ]
        assert len(asked) >= 15  # every route the API has, not a few of them
        for method, path in asked:
            # A POST in JSON, or the cross-site check would refuse it before the token is asked
            body: dict[str, Any] | None = {} if method == "post" else None
            response = http.request(method, path, json=body)
            assert response.status_code == 401, (method, path, response.text)


@pytest.mark.parametrize("token", ["", "   "])
def test_an_empty_token_is_refused_where_the_app_is_built(token: str, tmp_path: Path) -> None:
    runtime = Runtime(store=MemoryStore(), llm=ScriptedModel(window=20_000))
    with pytest.raises(ValueError, match="token is empty"):
        create_app(runtime, token=token)
    with pytest.raises(ValueError, match="token is empty"):
        build_app(ServerConfig(db=tmp_path / "empty.db", token=token))
