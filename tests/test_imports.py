"""Importing a conversation document that is not sound, on a SQLite file and on PostgreSQL,
through Python and through the REST API: every document the table below breaks is refused
with the field it names (``InvalidDocumentError.field``; 422 ``invalid_document`` with
``field``), never a 500, a 409 or a 503, and nothing is stored (REQ-SEG-060).

Tool inputs nested too deep are refused where they enter (an import, a model's reply), and a
conversation that already holds one stays readable, alone and in every listing (REQ-SEG-061).
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

import httpx2
import pytest
from fastapi.testclient import TestClient

import clusters
from scenario import requirement
from scripts import run_script
from segue import (
    InvalidDocumentError,
    PostgresStore,
    Runtime,
    ScriptedModel,
    SqliteStore,
    Store,
    Tool,
)
from segue.executor.documents import record
from segue.executor.model_port import LlmReply
from segue.server import create_app
from segue.server.data import MAX_IMPORTS
from segue.statemachine import ToolCall
from segue.statemachine.content import MAX_INPUT_DEPTH
from segue.testing import live_server

pytestmark = pytest.mark.slow
cluster = clusters.cluster
MODEL: Final = "claude-sonnet-4-5"
Document = dict[str, Any]
Break = Callable[[Document], None]


async def _lookup(tool_input: dict[str, Any]) -> str:
    return f"found {tool_input.get('query', '?')}"


LOOKUP: Final = Tool(name="lookup", description="Look something up.", function=_lookup)


def _nested(levels: int) -> dict[str, Any]:
    """An object ``levels`` objects deep."""
    inner: dict[str, Any] = {}
    for _ in range(levels - 1):
        inner = {"a": inner}
    return inner


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> Document:
    """A sound export: a tool round, a second turn, a pause (its snapshot)."""

    async def main() -> Document:
        db = tmp_path_factory.mktemp("source") / "source.db"
        model = ScriptedModel(tool_every=2)
        async with Runtime(store=SqliteStore(db), llm=model, tools=[LOOKUP]) as rt:
            conv = await rt.create_conversation(model=MODEL)
            await rt.send(conv.id, "Hello.")
            await rt.send(conv.id, "Look up the tides.")
            await rt.pause(conv.id, "lunch")
            await rt.resume(conv.id)
            return await rt.export_conversation(conv.id)

    exported = asyncio.run(main())
    kinds = [m["kind"] for m in exported["messages"]]
    assert "tool_result" in kinds, kinds
    assert exported["snapshots"]
    return exported


def _at(document: Document, kind: str) -> int:
    """The place of the first message of ``kind``."""
    return next(i for i, m in enumerate(document["messages"]) if m["kind"] == kind)


def _called(document: Document) -> int:
    return next(i for i, m in enumerate(document["messages"]) if m["tool_calls"])


def _set(path: str, value: Any) -> Break:
    """Set the value at a dotted path (list places as numbers)."""

    def apply(document: Document) -> None:
        *parents, last = path.split(".")
        node: Any = document
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return apply


def _id(value: str) -> Break:
    def apply(document: Document) -> None:
        document["conversation"]["id"] = value
        document["conversation"]["state"]["config"]["id"] = value

    return apply


def _drop_message(document: Document) -> None:
    document["messages"].pop()


def _message_in_session_99(document: Document) -> None:
    document["messages"][0]["session"] = 99


def _twin_tool_calls(document: Document) -> None:
    message = document["messages"][_called(document)]
    message["tool_calls"].append(dict(message["tool_calls"][0]))


def _unpaired_result(document: Document) -> None:
    document["messages"][_at(document, "tool_result")]["tool_call_id"] = "toolu_nobody"


def _requesting_with_nothing_pending(document: Document) -> None:
    document["conversation"]["state"]["phase"] = {"kind": "llm_requesting", "attempt": 1}
    document["pending"] = []


def _twin_snapshots(document: Document) -> None:
    document["snapshots"].append(copy.deepcopy(document["snapshots"][0]))


def _deep_tool_input(document: Document) -> None:
    document["messages"][_called(document)]["tool_calls"][0]["input"] = _nested(200)


def _deep_block_input(document: Document) -> None:
    message = document["messages"][_called(document)]
    call = message["tool_calls"][0]
    block = {"type": "tool_use", "id": call["id"], "name": call["name"]}
    message["content"] = [{**block, "input": _nested(MAX_INPUT_DEPTH + 1)}]


def _not_an_object(document: Document) -> None:
    raise AssertionError  # replaced by a list whole (see _broken)


CASES: Final[list[tuple[str, Break | None, str]]] = [
    ("format", _set("format", "zip"), "format"),
    ("format version true", _set("version", True), "version"),
    ("format version 2", _set("version", 2), "version"),
    ("version true", _set("conversation.version", True), "conversation.version"),
    ("version 2**70", _set("conversation.version", 2**70), "conversation.version"),
    ("version off by one", _set("conversation.version", 99), "conversation.version"),
    ("created_at NaN", _set("conversation.created_at", math.nan), "conversation.created_at"),
    ("updated_at inf", _set("conversation.updated_at", math.inf), "conversation.updated_at"),
    ("created_at text", _set("conversation.created_at", "today"), "conversation.created_at"),
    ("at NaN", _set("transitions.0.at", math.nan), "transitions.0.at"),
    ("at -inf", _set("transitions.1.at", -math.inf), "transitions.1.at"),
    (
        "log context_tokens 2**70",
        _set("transitions.1.context_tokens", 2**70),
        "transitions.1.context_tokens",
    ),
    (
        "state context_tokens 2**70",
        _set("conversation.state.context_tokens", 2**70),
        "conversation.state.context_tokens",
    ),
    ("seq 2**70", _set("transitions.0.seq", 2**70), "transitions.0.seq"),
    ("session 'x'", _set("transitions.0.session", "x"), "transitions.0.session"),
    ("session {}", _set("transitions.0.session", {}), "transitions.0.session"),
    ("session 99 in the log", _set("transitions.0.session", 99), "transitions.0.session"),
    ("message in session 99", _message_in_session_99, "messages.0.session"),
    ("message count", _drop_message, "messages"),
    ("twin tool call ids", _twin_tool_calls, "tool_calls.1.id"),
    ("unpaired tool result", _unpaired_result, "tool_call_id"),
    ("llm_requesting, nothing pending", _requesting_with_nothing_pending, "state.phase"),
    ("twin snapshot versions", _twin_snapshots, "snapshots.1.version"),
    ("snapshot version 2**70", _set("snapshots.0.version", 2**70), "snapshots.0.version"),
    ("id a/b", _id("a/b"), "conversation.state.config.id"),
    ("id ..", _id(".."), "conversation.state.config.id"),
    ("id with a space", _id("a b"), "conversation.state.config.id"),
    ("id not the state's", _set("conversation.id", "other"), "conversation.id"),
    ("event kind", _set("transitions.0.event_kind", "tool_result"), "transitions.0.event"),
    ("phase name", _set("transitions.0.to_phase", "dancing"), "transitions.0.to_phase"),
    ("metadata not strings", _set("conversation.metadata", {"n": 1}), "conversation.metadata"),
    ("tool input 200 deep", _deep_tool_input, "tool_calls.0.input"),
    ("tool_use block too deep", _deep_block_input, "content.0.tool_use.input"),
    ("conversation missing", lambda d: d.pop("conversation"), "conversation"),
    ("not an object", _not_an_object, ""),
]


def _broken(document: Document, name: str, apply: Break | None) -> Any:
    if name == "not an object":
        return [document]
    broken = copy.deepcopy(document)
    if apply is not None:
        apply(broken)
    return broken


def _text(value: Any) -> bytes:
    """JSON text as Python writes it (``NaN``, ``Infinity`` and big integers included)."""
    return json.dumps(value).encode()


@pytest.fixture(params=["sqlite", "postgres"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Store]]:
    if request.param == "sqlite":
        yield lambda: SqliteStore(tmp_path / "imports.db")
        return
    url = request.getfixturevalue("cluster").create_database(f"imports_{tmp_path.name[-20:]}")
    yield lambda: PostgresStore(url)


@requirement("REQ-SEG-060")
def test_seg060_every_unsound_document_is_refused_in_python_with_its_field(
    document: Document, open_store: Callable[[], Store]
) -> None:
    async def main() -> None:
        async with Runtime(store=open_store(), llm=ScriptedModel()) as rt:
            for name, apply, field in CASES:
                broken = _broken(document, name, apply)
                for given in (broken, _text(broken)):  # parsed, and as JSON text
                    with pytest.raises(InvalidDocumentError) as refused:
                        await rt.import_conversation(given)
                    assert field in refused.value.field, (name, refused.value)
            assert await rt.conversations() == []  # nothing stored, not even in part
            state = await rt.import_conversation(_text(document))
            assert state.id == document["conversation"]["id"]

    asyncio.run(main())


@requirement("REQ-SEG-060")
def test_seg060_every_unsound_document_is_422_with_its_field_over_rest(
    document: Document, open_store: Callable[[], Store]
) -> None:
    app = create_app(Runtime(store=open_store(), llm=ScriptedModel()))
    headers = {"content-type": "application/json"}
    with TestClient(app, raise_server_exceptions=False) as client:
        for name, apply, field in CASES:
            body = _text(_broken(document, name, apply))
            answer = client.post("/api/conversations/import", content=body, headers=headers)
            assert answer.status_code == 422, (name, answer.text)
            said = answer.json()
            assert said["error"] == "invalid_document", (name, said)
            assert field in said["field"], (name, said)
        assert client.get("/api/conversations").json() == []
        for bad in (b"[", b"", b"null", b'"text"'):
            answer = client.post("/api/conversations/import", content=bad, headers=headers)
            assert answer.status_code == 422, (bad, answer.text)
        stored = client.post("/api/conversations/import", content=_text(document), headers=headers)
        assert stored.status_code == 201, stored.text
        again = client.post("/api/conversations/import", content=_text(document), headers=headers)
        assert again.status_code == 409  # a sound document whose id is taken: exists


@requirement("REQ-SEG-060")
def test_seg060_a_renamed_import_is_held_to_the_id_pattern(document: Document) -> None:
    for bad in ("a/b", "..", "", "a b"):
        with pytest.raises(InvalidDocumentError) as refused:
            record(document, conversation_id=bad)
        assert refused.value.field == "conversation_id"
    assert record(document, conversation_id="copy-1").state.id == "copy-1"


# --------------------------------------------------------------------------- deep tool inputs


@requirement("REQ-SEG-061")
def test_seg061_a_model_reply_whose_tool_input_is_too_deep_is_a_failed_call(
    open_store: Callable[[], Store],
) -> None:
    deep = LlmReply(
        text="Calling.",
        tool_calls=(ToolCall(id="toolu_1", name="lookup", input=_nested(200)),),
        stop_reason="tool_use",
    )
    model = ScriptedModel([deep])

    async def main() -> None:
        async with Runtime(store=open_store(), llm=model, tools=[LOOKUP]) as rt:
            conv = await rt.create_conversation(model=MODEL, retry_base_delay=0.01)
            state = await rt.send(conv.id, "Look it up.")
            assert state.phase.kind == "idle"  # the next attempt answered
            messages = await rt.messages(conv.id)
            assert [m.kind for m in messages] == ["user", "assistant"]
            assert all(not m.message.tool_calls for m in messages)  # the deep reply: not kept
            log = await rt.store.transitions(conv.id)
            assert "llm_error" in [line.event_kind for line in log]
            assert [c.state.id for c in await rt.conversations()] == [conv.id]

    asyncio.run(main())


@requirement("REQ-SEG-061")
def test_seg061_a_conversation_already_holding_a_deep_tool_input_stays_readable(
    document: Document, open_store: Callable[[], Store]
) -> None:
    """Written straight to the store (as an earlier segue let it be): every read and listing
    still answers 200."""
    deep = copy.deepcopy(document)
    deep["messages"][_called(deep)]["tool_calls"][0]["input"] = _nested(200)
    deep["conversation"]["state"]["phase"] = {"kind": "idle"}
    unchecked = record(document)
    messages = list(unchecked.messages)
    at = _called(deep)
    call = messages[at].tool_calls[0]
    deep_call = ToolCall(id=call.id, name=call.name, input=_nested(200))
    messages[at] = messages[at].model_copy(update={"tool_calls": (deep_call,)})
    held = type(unchecked)(**{**vars_of(unchecked), "messages": tuple(messages)})

    async def stored() -> str:
        store = open_store()
        try:
            return (await store.restore(held)).state.id
        finally:
            await store.close()

    cid = asyncio.run(stored())
    app = create_app(Runtime(store=open_store(), llm=ScriptedModel()))
    with TestClient(app, raise_server_exceptions=False) as client:
        for path in ("", "/messages", "/export"):
            answer = client.get(f"/api/conversations/{cid}{path}")
            assert answer.status_code == 200, (path, answer.text[:300])
        listing = client.get("/api/conversations")
        assert listing.status_code == 200, listing.text[:300]
        assert [c["id"] for c in listing.json()] == [cid]
        shown = client.get(f"/api/conversations/{cid}/messages").json()
        depth, node = 0, shown[at]["tool_calls"][0]["input"]
        while node:
            depth, node = depth + 1, node["a"]
        assert depth == 199  # read back whole


def vars_of(value: Any) -> dict[str, Any]:
    return {name: getattr(value, name) for name in value.__dataclass_fields__}


# --------------------------------------------------------------------------- memory, concurrency


def test_a_10_mb_import_holds_under_3x_its_size(tmp_path: Path) -> None:
    """``bench/bench_import.py`` traces the route's and the store's allocations from the first
    chunk of the body to the stored conversation."""
    result = run_script("bench/bench_import.py", "--mb", "10", flags=("-W", "error"))
    assert result.returncode == 0, result.stderr
    found = re.search(r"peak / document\s+([\d.]+)x", result.stdout)
    assert found is not None, result.stdout
    assert float(found[1]) < 3, result.stdout
    document = re.search(r"document\s+([\d.]+) MB", result.stdout)
    assert document is not None
    assert float(document[1]) >= 9.5


def test_imports_past_the_bound_are_503_with_retry_after(tmp_path: Path) -> None:
    """``MAX_IMPORTS`` bodies still arriving hold every slot: one more is refused before its
    body is read; once they end, imports are taken again."""
    app = create_app(Runtime(store=SqliteStore(tmp_path / "bound.db"), llm=ScriptedModel()))
    release = threading.Event()

    def slow_body() -> Iterator[bytes]:
        yield b'{"format": "segue.conversation", '
        release.wait(30)
        yield b'"version": 1}'

    with live_server(app) as url, httpx2.Client(base_url=url, timeout=60) as client:
        headers = {"content-type": "application/json"}
        with ThreadPoolExecutor(MAX_IMPORTS) as pool:
            held = [
                pool.submit(
                    client.post, "/api/conversations/import", content=slow_body(), headers=headers
                )
                for _ in range(MAX_IMPORTS)
            ]
            refused = None
            for _ in range(200):  # until both hold their slot
                refused = client.post("/api/conversations/import", content=b"{}", headers=headers)
                if refused.status_code == 503:
                    break
                time.sleep(0.02)
            release.set()
            answers = [future.result() for future in held]
        assert refused is not None
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"] == "too_many_imports"
        assert refused.headers["retry-after"] == "2"
        assert [a.status_code for a in answers] == [422] * MAX_IMPORTS  # read, then judged
        again = client.post("/api/conversations/import", content=b"{}", headers=headers)
        assert again.status_code == 422, again.text


@requirement("REQ-SEG-060")
def test_seg060_json_text_of_any_layout_imports_as_the_parsed_document(
    document: Document,
) -> None:
    """Text is validated a part at a time: indentation, brackets, quotes and escapes inside
    strings, and unicode change nothing."""
    tricky = copy.deepcopy(document)
    tricky["messages"][0]["text"] = 'a "quoted" ], {"kind": "x"}, [ \\ back\\slash \u00e9\u6f22 \n'
    tricky["conversation"]["metadata"] = {"title": '{"messages": [], "transitions": [1]}'}
    parsed = record(tricky)
    for text in (
        json.dumps(tricky).encode(),
        json.dumps(tricky, indent=2).encode(),
        json.dumps(tricky, ensure_ascii=False).encode(),
        json.dumps(tricky, indent="\t", ensure_ascii=False),
    ):
        assert record(text) == parsed
    empty = {**tricky, "messages": [], "transitions": []}
    with pytest.raises(InvalidDocumentError) as refused:
        record(json.dumps(empty, indent=1))
    assert refused.value.field == "messages"  # the state counts messages the text lacks
    for broken in (b'{"format": "segue.conversation"} x', b"{", b'{"messages": [1,', b"[]"):
        with pytest.raises(InvalidDocumentError):
            record(broken)
