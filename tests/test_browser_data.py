"""A chat backend's conversations on the page, in real Chromium at 1280x800 and 375x740: the
list a page at a time ("More" follows the API's ``Link`` header), titles from metadata or from
the first words, a "Delete" that asks first in a dialog naming the conversation (and refuses a
running turn until told to stop it), the window's source where the meter is (an assumed one
said plainly), and the provider's compaction and context editing told as they happen.

``SEGUE_UPDATE_SCREENSHOTS=1`` writes the screenshots of ``docs/screenshots`` as each moment is
reached (the list's pages, the delete dialog, an assumed window).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from playwright.sync_api import Page, expect

import backends
import browsing
from api import create, send
from browsing import Tabs, turn_over
from gated import HOLD_AT_MOST, Gated
from segue import Runtime, ScriptedModel, SqliteStore
from segue.server import create_app
from segue.server.run import ServerConfig, build_app, demo_tools
from segue.testing import live_server
from segue.testing.anthropic_server import FakeAnthropicServer, MessageReply, ToolUse

pytestmark = pytest.mark.slow
browser, tabs = browsing.browser, browsing.tabs

SCREENS = {"1280x800": {"width": 1280, "height": 800}, "375x740": {"width": 375, "height": 740}}
SHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"
KEY = "sk-ant-browser-data-0123456789"


def screenshot(page: Page, moment: str, size: str, *, whole: bool = False) -> None:
    """``whole``: the whole page, not only what the screen shows."""
    if os.environ.get("SEGUE_UPDATE_SCREENSHOTS") == "1":
        SHOTS.mkdir(exist_ok=True)
        page.screenshot(path=str(SHOTS / f"{moment}-{size}.png"), full_page=whole)


def fits(page: Page) -> None:
    """Nothing wider than the screen."""
    assert page.evaluate("document.documentElement.scrollWidth - innerWidth") == 0


@pytest.fixture
def offline(tmp_path: Path) -> Iterator[str]:
    """A server of this test's own, offline, as ``segue serve`` runs it without a key."""
    app = build_app(ServerConfig(db=tmp_path / "page.db", chunk_delay=0.0))
    with live_server(app) as url:
        yield url


@pytest.mark.parametrize("size", SCREENS)
def test_the_list_pages_with_more_and_titles_from_metadata_or_first_words(
    size: str, offline: str, tabs: Tabs
) -> None:
    with httpx2.Client(base_url=offline, timeout=60) as http:
        oldest = create(http)["id"]
        send(http, oldest, "Plan the schema migration for the billing tables tonight please.")
        for number in range(24):
            create(http, metadata={"user": "u-17", "title": f"Tides, part {number}"})
    page = tabs.open(viewport=SCREENS[size])
    page.goto(f"{offline}/")
    items = page.locator("#conversations li")
    expect(items).to_have_count(20)
    expect(items.first.get_by_role("link")).to_have_text("Tides, part 23")  # newest first
    more = page.get_by_role("button", name="More")
    expect(more).to_be_visible()
    fits(page)
    screenshot(page, "list", size, whole=True)
    more.click()
    expect(items).to_have_count(25)  # the next page after the first, none twice
    expect(more).to_be_hidden()  # the last page
    titled = page.get_by_role("link", name="Plan the schema migration for the billing tables…")
    expect(titled).to_have_attribute("href", f"/c/{oldest}")
    names = [name.strip() for name in items.get_by_role("link").all_inner_texts()]
    assert len(set(names)) == 25
    fits(page)


@pytest.mark.parametrize("size", SCREENS)
def test_delete_asks_first_naming_the_conversation_then_goes_back_to_the_list(
    size: str, offline: str, tabs: Tabs
) -> None:
    with httpx2.Client(base_url=offline, timeout=60) as http:
        kept = create(http, metadata={"title": "Kept"})["id"]
        cid = create(http, metadata={"title": "Moving house"})["id"]
        send(http, cid, "Remember: the blue boxes go upstairs.")
    page = tabs.open(viewport=SCREENS[size])
    page.goto(f"{offline}/c/{cid}")
    turn_over(page)
    page.get_by_role("button", name="Delete").click()
    dialog = page.get_by_role("dialog", name="Delete “Moving house”?")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("removed for good")
    expect(dialog.get_by_role("button", name="Keep it")).to_be_focused()  # Enter keeps it
    fits(page)
    screenshot(page, "delete", size)
    dialog.get_by_role("button", name="Keep it").click()
    expect(dialog).to_be_hidden()
    assert httpx2.get(f"{offline}/api/conversations/{cid}").status_code == 200

    page.get_by_role("button", name="Delete").click()
    dialog.get_by_role("button", name="Delete", exact=True).click()
    page.wait_for_url(f"{offline}/")
    expect(page.locator("#conversations li")).to_have_count(1)
    expect(page.get_by_role("link", name="Kept")).to_have_attribute("href", f"/c/{kept}")
    assert httpx2.get(f"{offline}/api/conversations/{cid}").status_code == 404


def test_delete_offers_its_chain_and_refuses_a_running_turn_until_told_to_stop_it(
    tmp_path: Path, tabs: Tabs
) -> None:
    app = create_app(Runtime(store=SqliteStore(tmp_path / "chain.db"), llm=ScriptedModel()))
    with live_server(app) as url, httpx2.Client(base_url=url, timeout=60) as http:
        parent = create(http, metadata={"title": "Part one"})["id"]
        send(http, parent, "Hello.")
        assert http.post(f"/api/conversations/{parent}/continue", json={}).status_code == 200
        child = http.post(f"/api/conversations/{parent}/children", json={}).json()["id"]
        page = tabs.open()
        page.goto(f"{url}/c/{child}")
        turn_over(page)
        page.get_by_role("button", name="Delete").click()
        dialog = page.get_by_role("dialog")
        chain = dialog.get_by_label("and the other conversation of its continuation chain")
        expect(chain).not_to_be_checked()
        dialog.get_by_role("button", name="Keep it").click()

        held = Gated(window=24_000)
        busy_app = create_app(Runtime(store=SqliteStore(tmp_path / "held.db"), llm=held))
        with live_server(busy_app) as busy_url, httpx2.Client(base_url=busy_url, timeout=60) as b:
            cid = create(b, metadata={"title": "Still answering"})["id"]
            turn = threading.Thread(target=send, args=(b, cid, "A long answer, please."))
            turn.start()
            assert held.asked.wait(HOLD_AT_MOST)
            busy = tabs.open()
            busy.goto(f"{busy_url}/c/{cid}")
            expect(busy.get_by_role("button", name="Cancel the turn")).to_be_visible()
            busy.get_by_role("button", name="Delete").click()
            asked = busy.get_by_role("dialog", name="Delete “Still answering”?")
            asked.get_by_role("button", name="Delete", exact=True).click()
            expect(asked.get_by_role("alert")).to_contain_text("it was not deleted")
            assert b.get(f"/api/conversations/{cid}").status_code == 200
            asked.get_by_role("button", name="Stop the turn and delete").click()
            busy.wait_for_url(f"{busy_url}/")
            assert b.get(f"/api/conversations/{cid}").status_code == 404
            held.gate.set()
            turn.join(HOLD_AT_MOST)
            tabs.close()

        page = tabs.open()
        page.goto(f"{url}/c/{child}")
        turn_over(page)
        page.get_by_role("button", name="Delete").click()
        page.get_by_label("and the other conversation of its continuation chain").check()
        page.get_by_role("dialog").get_by_role("button", name="Delete", exact=True).click()
        page.wait_for_url(f"{url}/")
        expect(page.get_by_text("No conversations yet")).to_be_visible()
        tabs.close()


@pytest.mark.parametrize("size", SCREENS)
def test_an_assumed_window_is_said_where_the_meter_is(
    size: str, tmp_path: Path, tabs: Tabs
) -> None:
    with backends.backend("openai") as fake:
        fake.respond(backends.chat)
        app = fake.app(tmp_path / "assumed.db", model="house-model")  # no one knows its window
        with live_server(app) as url, httpx2.Client(base_url=url, timeout=60) as http:
            assumed = create(http)["id"]
            given = create(http, context_window=50_000)["id"]
            page = tabs.open(viewport=SCREENS[size])
            page.goto(f"{url}/c/{assumed}")
            turn_over(page)
            source = page.locator("#window-source")
            expect(source).to_have_text("window assumed: 128,000 tokens")
            expect(source).to_be_visible()
            expect(source).to_have_attribute("title", re.compile("Nobody reported"))
            assert browsing.in_view(page, "#window-source")
            fits(page)
            screenshot(page, "window-assumed", size)
            page.goto(f"{url}/c/{given}")
            turn_over(page)
            expect(source).to_have_text("window given")
            expect(source).not_to_have_class(re.compile("assumed"))
            tabs.close()


def test_the_providers_fallback_and_what_it_cleared_are_told_in_the_transcript(
    tmp_path: Path, tabs: Tabs
) -> None:
    clear: dict[str, Any] = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": 1_000},
        "keep": {"type": "tool_uses", "value": 1},
    }
    with FakeAnthropicServer(default=MessageReply(text="Noted.")) as fake:
        fake.refuse_compaction = True
        fake.enqueue(
            *(MessageReply(text="", tool_uses=(ToolUse("lookup", {"query": q}),)) for q in "abc")
        )
        config = ServerConfig(
            db=tmp_path / "provider.db", provider="anthropic", api_key=KEY, base_url=fake.url
        )
        with live_server(build_app(config, tools=demo_tools())) as url:
            page = tabs.open()
            page.goto(f"{url}/")
            page.get_by_label("Behaviour at the limit").select_option("compact_in_place")
            page.get_by_label("Who compacts").select_option("provider")
            page.get_by_text("At the limit (advanced)").click()
            page.get_by_label("Context edits (optional").fill(f"[{json.dumps(clear)}]")
            page.get_by_role("button", name="New conversation").click()
            page.wait_for_url(re.compile(r"/c/[0-9a-f]{32}$"))
            turn_over(page)
            expect(page.locator("#phase")).to_contain_text("the provider compacts")
            page.get_by_label("Your message").fill("Hello? " + "word " * 1_500)
            page.get_by_role("button", name="Send").click()
            turn_over(page)
            notes = page.locator("#messages li.note")
            expect(notes.filter(has_text="The provider could not compact")).to_have_count(1)
            cleared = notes.filter(has_text="The provider cleared old tool results")
            expect(cleared.first).to_contain_text(re.compile(r"[\d,]+ tokens"))
            expect(page.locator("#phase")).to_contain_text(
                "segue compacts (the provider could not)"
            )
            cid = page.url.rsplit("/", 1)[1]
            assert httpx2.get(f"{url}/api/conversations/{cid}").json()["compaction_fallback"]
            tabs.close()
