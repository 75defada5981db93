"""A summary made again and a compaction taken back through the REST API and the command line
(REQ-SEG-063 to 065): a real server over a SQLite file, and ``segue`` as the user runs it, each
checked against what the store then holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

import cli_run
from api import create, error, gated_app, held_turn, send
from cli_run import plain_output
from segue import ContextExhaustionBehavior, Runtime, ScriptedModel, SqliteStore
from segue.server import create_app
from segue.testing import live_server

COMPACT = "compact_in_place"


@pytest.fixture(autouse=True)
def _plain_output(monkeypatch: pytest.MonkeyPatch) -> None:
    plain_output(monkeypatch, "ANTHROPIC_API_KEY")


def summaries(db: Path, cid: str) -> list[str]:
    async def read() -> list[str]:
        store = SqliteStore(db)
        try:
            return [
                m.message.text for m in await store.messages(cid) if m.message.kind == "summary"
            ]
        finally:
            await store.close()

    return asyncio.run(read())


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[httpx2.Client, object, Path]]:
    db = tmp_path / "redo.db"
    app, model = gated_app(db)
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=60) as client:
        yield client, model, db


def test_seg063_rest_makes_the_summary_again_and_takes_it_back(
    served: tuple[httpx2.Client, object, Path],
) -> None:
    http, model, db = served
    cid = create(http, behavior=COMPACT, context_window=50_000)["id"]
    base = f"/api/conversations/{cid}"
    with held_turn(http, cid, model):  # type: ignore[arg-type]
        assert "running" in error(http.post(f"{base}/redo-summary", json={}), 409, "busy")
        error(http.post(f"{base}/undo-compaction", json={}), 409, "busy")
    error(http.post(f"{base}/redo-summary", json={}), 409, "no_compaction")
    for turn in range(6):
        send(http, cid, f"turn {turn}: the code is K-{turn}")
    assert http.post(f"{base}/continue", json={}).json()["generation"] == 2
    bad = http.post(f"{base}/redo-summary", json={"focus": "   "})
    assert bad.status_code == 422, bad.text
    redone = http.post(f"{base}/redo-summary", json={"focus": "the codes", "summary_model": "m-2"})
    assert redone.status_code == 200, redone.text
    assert redone.json()["generation"] == 3
    assert len(summaries(db, cid)) == 2  # the old one kept as a version
    undone = http.post(f"{base}/undo-compaction", json={})
    assert undone.status_code == 200, undone.text
    assert undone.json()["generation"] == 4
    error(http.post(f"{base}/undo-compaction", json={}), 409, "no_compaction")


def test_seg064_rest_refuses_an_undo_that_does_not_fit_with_the_figures(tmp_path: Path) -> None:
    app = create_app(Runtime(store=SqliteStore(tmp_path / "fit.db"), llm=ScriptedModel()))
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=60) as http:
        cid = create(http, behavior=COMPACT, context_window=3_000)["id"]
        for turn in range(40):
            send(http, cid, f"turn {turn}: " + "tides and moons " * 30)
            if http.get(f"/api/conversations/{cid}").json()["generation"] > 1:
                break
        refused = http.post(f"/api/conversations/{cid}/undo-compaction", json={})
        assert refused.status_code == 422, refused.text
        body = refused.json()
        assert body["error"] == "does_not_fit"
        assert body["needed_tokens"] >= body["threshold_tokens"] > 0
        assert http.get(f"/api/conversations/{cid}").json()["generation"] == 2


def test_seg063_the_cli_makes_the_summary_again_and_takes_it_back(tmp_path: Path) -> None:
    db = tmp_path / "cli.db"

    async def compacted() -> str:
        async with Runtime(store=SqliteStore(db), llm=ScriptedModel()) as rt:
            conv = await rt.create_conversation(
                model="claude-sonnet-4-5",
                behavior=ContextExhaustionBehavior.COMPACT_IN_PLACE,
                context_window=50_000,
            )
            for turn in range(6):
                await rt.send(conv.id, f"turn {turn}: the code is K-{turn}")
            await rt.continue_manually(conv.id)
            return conv.id

    cid = asyncio.run(compacted())
    where = ["--db", str(db), "--offline"]
    redone = cli_run.invoke("redo-summary", cid[:8], "--focus", "the codes", *where)
    assert redone.exit_code == 0, redone.output
    assert "summary made again" in redone.stdout
    assert "generation 3" in redone.stdout
    assert len(summaries(db, cid)) == 2
    blank = cli_run.invoke("redo-summary", cid[:8], "--focus", "  ", *where)
    assert blank.exit_code == 2, blank.output
    undone = cli_run.invoke("undo-compaction", cid[:8], *where)
    assert undone.exit_code == 0, undone.output
    assert "compaction taken back" in undone.stdout
    again = cli_run.invoke("undo-compaction", cid[:8], *where)
    assert again.exit_code == 1
    assert "taken back" in again.output
