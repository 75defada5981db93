"""The provider's own compaction and context editing through the server, as ``segue serve
--provider anthropic`` runs them (the real SDK at the fake Anthropic API): the create request
takes ``compaction`` and ``context_edits``, an adapter that cannot honour them is a 422
``unsupported_option``, and the ``fallback`` and ``context_edited`` updates reach the turn's
stream; the fallback reaches a tab watching through another server process on the same store
too, read back from the store.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import httpx2
import pytest

from api import create, error, send, sse
from cli_run import invoke, one_error_line
from segue.server.run import ServerConfig, build_app, demo_tools
from segue.testing import live_server
from segue.testing.anthropic_server import FakeAnthropicServer, MessageReply, ToolUse

pytestmark = pytest.mark.slow

KEY: Final = "sk-ant-server-provider-context-0123456789"
CLEAR_TOOL_USES: Final = {
    "type": "clear_tool_uses_20250919",
    "trigger": {"type": "input_tokens", "value": 1_000},
    "keep": {"type": "tool_uses", "value": 1},
}


@pytest.fixture
def fake() -> Iterator[FakeAnthropicServer]:
    with FakeAnthropicServer(default=MessageReply(text="Noted.")) as server:
        yield server


def claude_app(fake: FakeAnthropicServer, db: Path) -> Any:
    config = ServerConfig(db=db, provider="anthropic", api_key=KEY, base_url=fake.url)
    return build_app(config, tools=demo_tools())


def watched(url: str, cid: str, opened: threading.Event, into: list[tuple[str, Any]]) -> None:
    """A second tab's watch stream of the conversation, until its first ``done``."""
    with httpx2.stream("GET", f"{url}/api/conversations/{cid}/events", timeout=60) as response:
        opened.set()
        text = ""
        for chunk in response.iter_text():
            text += chunk
            events = sse(httpx2.Response(200, text=text))
            if any(name == "done" for name, _ in events):
                into.extend(events)
                return


def test_a_provider_that_cannot_compact_is_told_on_the_stream_and_in_another_process(
    fake: FakeAnthropicServer, tmp_path: Path
) -> None:
    fake.refuse_compaction = True
    db = tmp_path / "shared.db"
    with (
        live_server(claude_app(fake, db)) as url,
        live_server(claude_app(fake, db)) as other,
        httpx2.Client(base_url=url, timeout=60) as http,
    ):
        created = create(http, behavior="compact_in_place", compaction="provider")
        assert (created["compaction"], created["compaction_fallback"]) == ("provider", False)
        cid = created["id"]
        opened, elsewhere = threading.Event(), list[tuple[str, Any]]()
        tab = threading.Thread(target=watched, args=(other, cid, opened, elsewhere))
        tab.start()
        assert opened.wait(60)
        events = send(http, cid, "Hello?")
        tab.join(60)
        state = http.get(f"/api/conversations/{cid}").json()
    fallbacks = [data for name, data in events if name == "fallback"]
    assert len(fallbacks) == 1
    assert "compact" in fallbacks[0]["reason"]
    assert (state["phase"], state["compaction_fallback"]) == ("idle", True)
    assert [name for name, _ in elsewhere].count("fallback") == 1  # read back from the store
    assert elsewhere[-1][0] == "done"


def test_context_edits_are_taken_and_what_they_cleared_streams(
    fake: FakeAnthropicServer, tmp_path: Path
) -> None:
    reading = [MessageReply(text="", tool_uses=(ToolUse("lookup", {"query": n}),)) for n in "abc"]
    fake.enqueue(*reading)
    with (
        live_server(claude_app(fake, tmp_path / "edits.db")) as url,
        httpx2.Client(base_url=url, timeout=60) as http,
    ):
        cid = create(http, context_edits=[CLEAR_TOOL_USES])["id"]
        events = send(http, cid, "Look up a, b and c, then sum up. " + "word " * 1_500)
    edited = [data for name, data in events if name == "context_edited"]
    assert edited, [name for name, _ in events]
    assert edited[0]["strategy"] == "clear_tool_uses_20250919"
    assert edited[0]["cleared_input_tokens"] > 0
    sent = fake.message_requests()
    assert all(r.body["context_management"]["edits"] == [CLEAR_TOOL_USES] for r in sent)


def test_options_the_model_cannot_honour_are_422_before_anything_is_stored(
    tmp_path: Path,
) -> None:
    offline = build_app(ServerConfig(db=tmp_path / "offline.db", chunk_delay=0.0))
    with live_server(offline) as url, httpx2.Client(base_url=url, timeout=60) as http:
        asked = {"behavior": "compact_in_place", "compaction": "provider"}
        error(http.post("/api/conversations", json=asked), 422, "unsupported_option")
        edits = {"context_edits": [CLEAR_TOOL_USES]}
        error(http.post("/api/conversations", json=edits), 422, "unsupported_option")
        wrong = {"compaction": "provider"}  # the default behaviour does not compact in place
        assert "compact_in_place" in error(
            http.post("/api/conversations", json=wrong), 422, "invalid_request"
        )
        unknown = {"context_edits": [{"type": "clear_everything"}]}
        error(http.post("/api/conversations", json=unknown), 422, "invalid_request")
        assert http.get("/api/conversations").json() == []


def test_the_servers_own_compaction_and_edits_apply_where_a_request_leaves_them_out(
    fake: FakeAnthropicServer, tmp_path: Path
) -> None:
    config = ServerConfig(
        db=tmp_path / "defaults.db",
        provider="anthropic",
        api_key=KEY,
        base_url=fake.url,
        compaction="provider",
        context_edits=(CLEAR_TOOL_USES,),
    )
    with live_server(build_app(config)) as url, httpx2.Client(base_url=url, timeout=60) as http:
        compacting = create(http, behavior="compact_in_place")
        chatting = create(http)  # the default behaviour: the server's compaction does not apply
        own = create(http, behavior="compact_in_place", compaction="segue", context_edits=[])
        for cid in (compacting["id"], chatting["id"], own["id"]):
            send(http, cid, "Hello?")
    assert [c["compaction"] for c in (compacting, chatting, own)] == ["provider", "segue", "segue"]
    edits = [r.body.get("context_management", {}).get("edits", []) for r in fake.message_requests()]
    assert [sorted(e["type"] for e in sent) for sent in edits] == [
        ["clear_tool_uses_20250919", "compact_20260112"],
        ["clear_tool_uses_20250919"],
        [],
    ]


def test_segue_serve_refuses_provider_options_without_the_provider(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    compacting = invoke("serve", "--db", str(tmp_path / "s.db"), "--compaction", "provider")
    assert compacting.exit_code == 2
    assert "--compaction provider needs the provider" in one_error_line(compacting)
    edits = invoke("serve", "--db", str(tmp_path / "s.db"), "--context-edits", "[{}]")
    assert edits.exit_code == 2
    assert "--context-edits" in one_error_line(edits)
