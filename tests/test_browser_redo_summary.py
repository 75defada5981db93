""" "Make this summary again" on the page (REQ-SEG-063), in real Chromium: the button and its focus
field sit in the latest compaction summary of an idle compact_in_place conversation, and
clicking it puts a new summary in place (the old one kept above it) with the focus on its
request."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from playwright.sync_api import expect

import browsing
from browsing import Tabs, state, stored, turn_over
from segue import Runtime, ScriptedModel, SqliteStore
from segue.server import create_app
from segue.testing import live_server

pytestmark = pytest.mark.slow
browser, tabs = browsing.browser, browsing.tabs


@pytest.fixture
def compacted(tmp_path: Path) -> Iterator[tuple[str, str, ScriptedModel]]:
    """A server on the scripted model, and a compact_in_place conversation compacted once."""
    model = ScriptedModel()
    app = create_app(Runtime(store=SqliteStore(tmp_path / "redo.db"), llm=model))
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=60) as http:
        body = {"behavior": "compact_in_place", "context_window": 50_000}
        cid = http.post("/api/conversations", json=body).json()["id"]
        for turn in range(6):
            sent = {"text": f"turn {turn}: the code is K-{turn}"}
            assert http.post(f"/api/conversations/{cid}/messages", json=sent).status_code == 200
        assert http.post(f"/api/conversations/{cid}/continue", json={}).status_code == 200
        yield url, cid, model


def test_seg063_the_page_makes_the_summary_again_with_a_focus(
    compacted: tuple[str, str, ScriptedModel], tabs: Tabs
) -> None:
    url, cid, model = compacted
    page = tabs.open()
    page.goto(f"{url}/c/{cid}")
    turn_over(page)
    summaries = page.locator("#messages li.summary")
    expect(summaries).to_have_count(1)
    again = summaries.last.get_by_role("button", name="Make this summary again")
    expect(again).to_be_visible()
    summaries.last.get_by_label("Keep above all in the new summary (optional)").fill("the codes")
    again.click()
    expect(summaries).to_have_count(2)
    turn_over(page)
    assert state(url, cid)["generation"] == 3
    asked = model.requests[-1]
    assert asked.purpose == "compaction"
    assert asked.instruction is not None
    assert "the codes" in asked.instruction
    kinds = [message["kind"] for message in stored(url, cid)]
    assert kinds.count("summary") == 2
    # The button moved to the newest summary, ready to be used again.
    expect(summaries.first.get_by_role("button", name="Make this summary again")).to_have_count(0)
    expect(summaries.last.get_by_role("button", name="Make this summary again")).to_be_enabled()
    # And the compaction is taken back: the history before it is what the model sees again.
    summaries.last.get_by_role("button", name="Take this compaction back").click()
    expect(page.get_by_role("button", name="Make this summary again")).to_be_hidden()
    turn_over(page)
    assert state(url, cid)["generation"] == 4
    expect(page.locator("#problem")).to_be_hidden()
