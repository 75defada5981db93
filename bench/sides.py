"""The two systems ``bench_langgraph.py`` compares, behind one small interface.

A *side* holds conversations and runs *turns*: a user's message goes in, an instant model
answers, and both are durable in the database when the call returns. A turn therefore persists
two events on either side, which is what "a persisted step" means in the report (a turn's time
divided by two, on both sides alike):

- **segue**: ``Runtime.send`` on a ``SqliteStore`` or a ``PostgresStore``: the message is
  committed (with the model request in the outbox), the model is asked, and its reply is
  committed; each commit is one transaction.
- **LangGraph**: a one-node ``StateGraph`` over ``MessagesState`` whose node answers at once,
  compiled with LangGraph's own checkpointer (``SqliteSaver``/``AsyncSqliteSaver``,
  ``PostgresSaver``/``AsyncPostgresSaver``) and invoked with the thread id as the conversation:
  its input is checkpointed before the node runs and the node's output after it, with
  LangGraph's default durability (``"async"``: every write is done when ``invoke`` returns).

Both answer with the same text through the same kind of model (no network, no sleeping), so the
difference is the framework and its persistence. LangGraph is an optional extra
(``pip install -e ".[bench]"``); without it only segue's side exists (``langgraph_missing``).
"""

from __future__ import annotations

import contextlib
import importlib
import sqlite3
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

from segue import Usage
from segue.executor.model_port import LlmReply, LlmRequest
from segue.executor.runtime import Runtime
from segue.executor.stores.postgres import PostgresStore
from segue.executor.stores.sqlite import SqliteStore

MODEL = "claude-sonnet-4-5"  # 200k window; the instant model's usage stays far below it
ANSWER = "Noted."
INSTALL = 'pip install -e ".[bench]"'
"""How to get LangGraph and its checkpointers (the ``bench`` extra of this repository)."""
LANGGRAPH_PACKAGES = ("langgraph", "langgraph-checkpoint-sqlite", "langgraph-checkpoint-postgres")


class Side(Protocol):
    """A system under test: conversations and turns (see the module docstring)."""

    name: str

    async def open(self) -> None:
        """Connect (outside any timing)."""
        ...

    async def conversation(self) -> str:
        """A new, empty conversation's id."""
        ...

    async def turn(self, conversation_id: str, text: str) -> None:
        """Send ``text``; return once the message and the answer are both durable."""
        ...

    async def close(self) -> None:
        """Release what ``open`` took."""
        ...


# --------------------------------------------------------------------------- segue


class InstantModel:
    """segue's model: answers every request at once with the same reply."""

    exact_preflight = False

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, request: LlmRequest) -> LlmReply:
        self.calls += 1
        if request.on_text is not None:
            request.on_text(ANSWER)
        return LlmReply(text=ANSWER, usage=Usage(input_tokens=40, output_tokens=5))

    async def context_window(self, model: str) -> int | None:
        return None

    async def count_tokens(self, request: LlmRequest) -> int | None:
        return None


class SegueSide:
    """``Runtime.send`` on a SQLite file (``where`` a path) or a PostgreSQL database
    (``where`` a conninfo, a pool of ``pool_size`` connections: ``PostgresStore``'s
    default)."""

    def __init__(self, where: str, *, pool_size: int = 4) -> None:
        self.name = "segue"
        self._where = where
        self._pool_size = pool_size
        self._runtime: Runtime | None = None

    async def open(self) -> None:
        store = (
            PostgresStore(self._where, max_size=self._pool_size)
            if self._where.startswith("host=")
            else SqliteStore(self._where)
        )
        self._runtime = Runtime(store=store, llm=InstantModel())
        await self._runtime.__aenter__()

    @property
    def runtime(self) -> Runtime:
        assert self._runtime is not None, "open() first"
        return self._runtime

    async def conversation(self) -> str:
        return (await self.runtime.create_conversation(model=MODEL)).id

    async def turn(self, conversation_id: str, text: str) -> None:
        await self.runtime.send(conversation_id, text)

    async def close(self) -> None:
        if self._runtime is not None:
            await self._runtime.__aexit__(None, None, None)
            self._runtime = None


# --------------------------------------------------------------------------- LangGraph


def langgraph_missing() -> str | None:
    """None when LangGraph and both checkpointers can be imported; else what is missing."""
    for module in (
        "langgraph.graph",
        "langgraph.checkpoint.sqlite",
        "langgraph.checkpoint.postgres",
        "langchain_core.messages",
        "aiosqlite",
    ):
        try:
            importlib.import_module(module)
        except ImportError as error:
            return f"{module} cannot be imported ({error})"
    return None


def langgraph_versions() -> str:
    """The installed versions of LangGraph and its checkpointers, for the report."""
    found = []
    for package in LANGGRAPH_PACKAGES:
        try:
            found.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            found.append(f"{package} (version unknown)")
    return ", ".join(found)


def _graph() -> Any:
    """The graph: START -> model -> END over ``MessagesState``, the model answering at once."""
    graph = importlib.import_module("langgraph.graph")
    messages = importlib.import_module("langchain_core.messages")

    def model(state: Any) -> dict[str, Any]:
        return {"messages": [messages.AIMessage(content=ANSWER)]}

    builder = graph.StateGraph(graph.MessagesState)
    builder.add_node("model", model)
    builder.add_edge(graph.START, "model")
    builder.add_edge("model", graph.END)
    return builder


def _human(text: str) -> dict[str, Any]:
    messages = importlib.import_module("langchain_core.messages")
    return {"messages": [messages.HumanMessage(content=text)]}


class LangGraphSide:
    """A LangGraph graph on one of its checkpointers. ``kind`` is ``sqlite`` (sync
    ``SqliteSaver``), ``sqlite-async`` (``AsyncSqliteSaver`` on aiosqlite), ``postgres``
    (sync ``PostgresSaver`` on one connection) or ``postgres-async`` (``AsyncPostgresSaver``
    on a pool of ``pool_size`` connections, as many as ``PostgresStore``'s default pool; with
    ``setup=False`` it expects the tables to exist).

    SQLite files are opened as segue opens its own: WAL (LangGraph's ``setup()`` sets it) and
    ``synchronous=NORMAL`` (SQLite's default in WAL is FULL, an fsync per commit, which segue
    does not pay either): a committed step survives the process, on both sides alike."""

    def __init__(self, kind: str, where: str, *, pool_size: int = 4, setup: bool = True) -> None:
        self.name = "LangGraph"
        self._setup = setup
        self._kind = kind
        self._where = where
        self._pool_size = pool_size
        self._stack = contextlib.AsyncExitStack()
        self._graph: Any = None
        self._sync = kind in ("sqlite", "postgres")

    async def open(self) -> None:
        checkpointer = await self._checkpointer()
        self._graph = _graph().compile(checkpointer=checkpointer)

    async def _checkpointer(self) -> Any:
        kind, where, stack = self._kind, self._where, self._stack
        if kind == "sqlite":
            saver_module = importlib.import_module("langgraph.checkpoint.sqlite")
            conn = sqlite3.connect(where, check_same_thread=False)
            stack.callback(conn.close)
            saver = saver_module.SqliteSaver(conn)
            saver.setup()
            conn.execute("PRAGMA synchronous = NORMAL")
            return saver
        if kind == "sqlite-async":
            aiosqlite = importlib.import_module("aiosqlite")
            saver_module = importlib.import_module("langgraph.checkpoint.sqlite.aio")
            connection = await stack.enter_async_context(aiosqlite.connect(where))
            saver = saver_module.AsyncSqliteSaver(connection)
            await saver.setup()
            await connection.execute("PRAGMA synchronous = NORMAL")
            return saver
        saver_module = importlib.import_module("langgraph.checkpoint.postgres")
        if kind == "postgres":
            saver = stack.enter_context(saver_module.PostgresSaver.from_conn_string(where))
            saver.setup()
            return saver
        aio = importlib.import_module("langgraph.checkpoint.postgres.aio")
        pool_module = importlib.import_module("psycopg_pool")
        rows = importlib.import_module("psycopg.rows")
        pool = pool_module.AsyncConnectionPool(
            where,
            min_size=1,
            max_size=self._pool_size,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": rows.dict_row},
            open=False,
        )
        await pool.open()
        stack.push_async_callback(pool.close)
        saver = aio.AsyncPostgresSaver(pool)
        if self._setup:  # workers started together would race to create the tables
            await saver.setup()
        return saver

    async def conversation(self) -> str:
        return uuid.uuid4().hex

    async def turn(self, conversation_id: str, text: str) -> None:
        config = {"configurable": {"thread_id": conversation_id}}
        if self._sync:
            self._graph.invoke(_human(text), config)
        else:
            await self._graph.ainvoke(_human(text), config)

    async def close(self) -> None:
        await self._stack.aclose()


def sqlite_sides(scratch: Path, label: str, *, concurrent: bool) -> list[Side]:
    """segue and (if installed) LangGraph, each on a new file in ``scratch``."""
    sides: list[Side] = [SegueSide(str(scratch / f"segue-{label}.db"))]
    if langgraph_missing() is None:
        kind = "sqlite-async" if concurrent else "sqlite"
        sides.append(LangGraphSide(kind, str(scratch / f"langgraph-{label}.db")))
    return sides
