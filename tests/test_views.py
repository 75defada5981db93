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

from api import create, send, sse
from cli_run import invoke
from segue import MemoryStore, Runtime, ScriptedModel
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


def test_docs_views_names_every_field_of_every_view() -> None:
    page = (Path(__file__).parent.parent / "docs" / "views.md").read_text(encoding="utf-8")
    for view in (ConversationView, MessageView, SnapshotView, LinkView, DoneView):
        assert f"`{view.__name__}`" in page
        missing = [name for name in view.model_fields if f"`{name}`" not in page]
        assert missing == [], (view.__name__, missing)
