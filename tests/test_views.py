"""One JSON shape of a conversation's state everywhere a client reads it: a REST answer, a
turn's ``done`` event, a watch stream's ``done``, and the CLI's ``--json`` (``segue.views``,
``docs/views.md``); and the Python ``DoneUpdate`` turned into it with ``DoneView``.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import httpx2
import pytest
from pydantic import TypeAdapter

from api import create, send, sse
from cli_run import invoke
from segue import MemoryStore, Runtime, ScriptedModel, ToolRegistry, Update, update_json
from segue.executor.updates import DoneUpdate
from segue.server.run import ServerConfig, build_app
from segue.testing import live_server
from segue.views import ConversationView, DoneView, LinkView, MessageView, SnapshotView

pytestmark = pytest.mark.slow


def watched_done(url: str, cid: str, opened: threading.Event, into: list[Any]) -> None:
    """Read the conversation's watch stream until its first ``done``."""
    with httpx2.stream("GET", f"{url}/api/conversations/{cid}/events", timeout=60) as response:
        opened.set()
        text = ""
        for chunk in response.iter_text():
            text += chunk
            events = [e for e in sse_text(text) if e[0] == "done"]
            if events:
                into.append(events[0][1])
                return


def sse_text(text: str) -> list[tuple[str, dict[str, Any]]]:
    return sse(httpx2.Response(200, text=text))


def test_a_state_has_one_shape_in_rest_both_streams_and_the_cli(tmp_path: Path) -> None:
    db = tmp_path / "views.db"
    with (
        live_server(build_app(ServerConfig(db=db, chunk_delay=0.0))) as url,
        httpx2.Client(base_url=url, timeout=60) as http,
    ):
        cid = create(http)["id"]
        opened, watched = threading.Event(), list[dict[str, Any]]()
        watcher = threading.Thread(target=watched_done, args=(url, cid, opened, watched))
        watcher.start()
        assert opened.wait(60)
        streamed = send(http, cid, "What is a context window?")[-1][1]
        watcher.join(60)
        rest = http.get(f"/api/conversations/{cid}").json()
    cli = json.loads(invoke("show", cid, "--db", str(db), "--json").stdout)["conversation"]
    assert streamed["state"] == rest
    assert watched[0]["state"] == rest
    assert cli == rest
    assert rest["phase"] == "idle"  # the phase's kind, a string
    assert rest["title"] == "What is a context window?"
    assert set(rest) == set(ConversationView.model_fields)


def test_done_view_turns_a_python_done_update_into_the_apis_shape() -> None:
    async def turn() -> DoneUpdate:
        async with Runtime(store=MemoryStore(), llm=ScriptedModel()) as rt:
            cid = (await rt.create_conversation(model="claude-sonnet-4-6")).id
            updates = [u async for u in rt.stream(cid, "Hello.")]
            done = updates[-1]
            assert isinstance(done, DoneUpdate)
            return done

    done = asyncio.run(turn())
    assert json.loads(done.model_dump_json())["state"]["phase"] == {"kind": "idle"}  # the core's
    shown = json.loads(DoneView.of(done).model_dump_json())
    assert shown["kind"] == "done"
    assert shown["state"]["phase"] == "idle"
    assert shown["reply"] == done.reply


def test_update_json_turns_every_update_of_a_turn_into_the_streams_json() -> None:
    """``update_json``: every update a real turn yields (text, tools, occupancy, done...) as the
    JSON the server's events carry: each but ``done`` reads back as the same update, ``done``
    is ``DoneView``'s shape (its phase a string)."""

    async def turn() -> list[Update]:
        tools = ToolRegistry()

        @tools.tool(description="Look a word up.")
        async def lookup(tool_input: dict[str, object]) -> str:
            return f"{tool_input.get('query')}: found"

        model = ScriptedModel(tool_every=1, reply_chars=60, chunk_chars=10)
        async with Runtime(store=MemoryStore(), llm=model, tools=tools) as rt:
            cid = (await rt.create_conversation(model="claude-sonnet-4-6")).id
            return [u async for u in rt.stream(cid, "Hello.")]

    updates = asyncio.run(turn())
    kinds = {u.kind for u in updates}
    assert {"user_message", "text", "tool_started", "tool_finished", "occupancy"} <= kinds
    reader: TypeAdapter[Update] = TypeAdapter(Update)
    for update in updates:
        encoded = update_json(update)
        assert json.loads(encoded)["kind"] == update.kind
        if isinstance(update, DoneUpdate):
            assert json.loads(encoded) == json.loads(DoneView.of(update).model_dump_json())
            assert json.loads(encoded)["state"]["phase"] == "idle"
        else:
            assert reader.validate_json(encoded) == update


def test_docs_views_names_every_field_of_every_view() -> None:
    page = (Path(__file__).parent.parent / "docs" / "views.md").read_text(encoding="utf-8")
    for view in (ConversationView, MessageView, SnapshotView, LinkView, DoneView):
        assert f"`{view.__name__}`" in page
        missing = [name for name in view.model_fields if f"`{name}`" not in page]
        assert missing == [], (view.__name__, missing)
