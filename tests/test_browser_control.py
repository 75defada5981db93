"""The user's control at the limit on the page, in real Chromium: the create form's summary
prompt and model and the manual trigger's focus, checked on the limit's request as each
provider's fake API received it (Anthropic's and OpenAI's real clients behind the server); a
pinned message sent and marked in words; a pin too large refused beside its box; a pause asked
for while a turn runs, taken at its end; a snapshot's JSON read with the page's token.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

import backends
import browsing
from backends import PROVIDERS, SUMMARY_MODELS, Backend
from browsing import Tabs, new_conversation, send, state, stored, turn_over
from gated import Gated
from segue import Runtime, SqliteStore
from segue.server import create_app
from segue.server.run import ServerConfig, build_app
from segue.testing import live_server
from segue.testing.conformance import Said, Sent

pytestmark = pytest.mark.slow
browser, server, tabs, page = browsing.browser, browsing.server, browsing.tabs, browsing.page

CUSTOM = "Write the hand-over as three bullets: done, doing, next."
TOKEN = "a-page-token-for-the-test"  # noqa: S105  # a test token, not a secret


def last_user_text(sent: Sent) -> str:
    users = [turn.text for turn in sent.turns if turn.role == "user"]
    return users[-1] if users else ""


@pytest.fixture(params=PROVIDERS)
def near_the_limit(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Backend]]:
    """The server with a key; every answer of the provider's fake API fills 83% of a
    3,000-token window (past the warning, short of the threshold)."""
    with backends.backend(request.param) as fake:
        fake.default(Said(text="Noted.", prompt=2_500, output=5))
        with live_server(fake.app(tmp_path / "limit.db")) as url:
            yield url, fake


def test_the_create_forms_summary_settings_and_the_focus_reach_the_limits_request(
    near_the_limit: tuple[str, Backend], tabs: Tabs
) -> None:
    """(The server is set up first, so its pages are closed before it stops.)"""
    url, fake = near_the_limit
    summary_model = SUMMARY_MODELS[fake.provider]
    page = tabs.open()
    page.goto(f"{url}/")
    page.get_by_label("Context window (tokens, optional)").fill("3000")
    page.get_by_text("At the limit (advanced)").click()
    page.get_by_label("Summary prompt (optional").fill(CUSTOM)
    page.get_by_label("Summary model (optional").fill(summary_model)
    page.get_by_role("button", name="New conversation").click()
    page.wait_for_url(re.compile(r"/c/[0-9a-f]{32}$"))
    turn_over(page)
    parent = page.url.rsplit("/", 1)[1]
    assert (state(url, parent)["summary_prompt"], state(url, parent)["summary_model"]) == (
        CUSTOM,
        summary_model,
    )
    send(page, "Plan the schema change.")
    expect(page.locator("#warning")).to_be_visible()
    focus = page.get_by_label("Keep above all (optional)")
    expect(focus).to_be_enabled()
    focus.fill("the index decisions")
    page.get_by_role("button", name="Continue in a new conversation").click()
    page.wait_for_url(lambda address: not address.endswith(parent))
    turn_over(page)
    turn, limit = fake.sent()
    assert turn.raw["model"] == fake.model
    assert limit.raw["model"] == summary_model
    assert CUSTOM in last_user_text(limit)
    assert "the index decisions" in last_user_text(limit)


def test_a_pinned_message_is_marked_in_words_and_a_pin_too_large_is_refused(
    page: Page, server: str
) -> None:
    cid = new_conversation(page, server, window=20_000)
    box, pin = page.get_by_label("Your message"), page.get_by_label("Pin this message")
    box.fill("Never touch the migrations folder.")
    pin.check()
    page.get_by_role("button", name="Send").click()
    turn_over(page)
    expect(pin).not_to_be_checked()  # a pin is for one message
    send(page, "An ordinary one.")
    pinned = page.locator("#messages li.user").filter(has_text="Pinned: never summarised away")
    expect(pinned).to_have_count(1)
    expect(pinned.locator(".text")).to_have_text("Never touch the migrations folder.")
    assert [(m["text"], m["pinned"]) for m in stored(server, cid) if m["kind"] == "user"] == [
        ("Never touch the migrations folder.", True),
        ("An ordinary one.", False),
    ]
    page.reload()  # as stored, not only as sent
    turn_over(page)
    expect(page.locator("#messages li.user.pinned")).to_have_count(1)
    expect(page.locator("#messages li.user.pinned")).to_contain_text("Pinned")

    too_much = "keep this " * 2_400  # more than a quarter of the window
    box.fill(too_much)
    pin.check()
    page.get_by_role("button", name="Send").click()
    reason = page.locator("#send-problem")
    expect(reason).to_contain_text("cannot be pinned")
    expect(reason).to_contain_text("Send it unpinned")
    expect(box).to_have_value(too_much)
    assert len(stored(server, cid)) == 4  # nothing more stored


def test_a_pause_during_a_turn_is_taken_at_its_end(tabs: Tabs, tmp_path: Path) -> None:
    model = Gated(reply_chars=200)
    app = create_app(Runtime(store=SqliteStore(tmp_path / "gated.db"), llm=model))
    with live_server(app) as url:
        page = tabs.open()
        cid = new_conversation(page, url, window=50_000)
        page.get_by_label("Your message").fill("A long job.")
        page.get_by_role("button", name="Send").click()
        assert model.asked.wait(30)
        page.get_by_role("button", name="Pause").click()
        reason = page.get_by_label("Why pause? (kept in the snapshot)")
        reason.fill("the end of the day")
        page.get_by_role("button", name="Pause now").click()
        pausing = page.get_by_role("status").filter(has_text="Pausing when this turn ends")
        expect(pausing).to_be_visible()
        expect(page.get_by_role("button", name="Pause")).to_be_hidden()  # asked once
        assert state(url, cid)["phase"] == "llm_requesting"  # the turn goes on meanwhile
        model.gate.set()
        turn_over(page)
        paused = page.get_by_role("status").filter(has_text="This conversation is paused")
        expect(paused).to_contain_text("the end of the day")
        expect(pausing).to_be_hidden()
        page.get_by_role("button", name="Snapshots (1)").click()
        expect(page.get_by_role("table").locator("tbody tr")).to_have_count(1)
        expect(page.locator("#messages li.assistant")).not_to_have_count(0)  # the turn ended
        tabs.close()


def test_a_snapshots_json_is_read_with_the_pages_token(tabs: Tabs, tmp_path: Path) -> None:
    app = build_app(ServerConfig(db=tmp_path / "token.db", chunk_delay=0.0, token=TOKEN))
    with live_server(app) as url:
        page = tabs.open()
        page.goto(f"{url}/#token={TOKEN}")  # the page takes it, then forgets the address
        cid = new_conversation(page, url, window=200_000)
        send(page, "Start the job.")
        page.get_by_role("button", name="Pause").click()
        page.get_by_label("Why pause? (kept in the snapshot)").fill("a token test")
        page.get_by_role("button", name="Pause now").click()
        page.get_by_role("button", name="Snapshots (1)").click()
        link = page.get_by_role("link", name="JSON of v1")
        expect(link).to_have_attribute("href", f"{url}/api/conversations/{cid}/snapshots/1")
        link.click()
        expect(page.get_by_role("heading", name="Snapshot v1")).to_be_visible()
        expect(page.locator("#snapshot-json")).to_contain_text('"reason": "a token test"')
        expect(page.locator("#snapshot-json")).to_contain_text('"session_seconds"')
        assert page.url == f"{url}/c/{cid}"  # read in place: a plain link cannot send the token
        tabs.close()
