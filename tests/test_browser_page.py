"""More of the page in real Chromium: a phone's width, a second tab on a running turn, Markdown
and raw HTML side by side (a reply from each provider's real client), a refused message kept in
its box, compaction's banner, figures that never round across a threshold, an unknown
conversation, and the app mounted under a prefix in another FastAPI application.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from playwright.sync_api import Page, expect

import backends
import browsing
from backends import PROVIDERS
from browsing import Tabs, meter, new_conversation, send, state, stored, turn_over, unfold_options
from gated import HeldMidway
from segue import Runtime, ScriptedModel, SqliteStore
from segue.server import create_app
from segue.testing import live_server
from segue.testing.conformance import Said

pytestmark = pytest.mark.slow
browser, server, tabs, page = browsing.browser, browsing.server, browsing.tabs, browsing.page

PHONE = {"width": 375, "height": 667}


def overflow(page: Page) -> int:
    """How many pixels the page is wider than the window (0: nothing to scroll sideways)."""
    width: int = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    return width


# --------------------------------------------------------------------------- a phone


def test_at_375_pixels_nothing_is_wider_than_the_screen(tabs: Tabs, server: str) -> None:
    phone = tabs.open(viewport=PHONE)
    phone.goto(f"{server}/")
    expect(phone.get_by_role("button", name="New conversation")).to_be_visible()
    assert overflow(phone) == 0
    unfold_options(phone)  # folded on a phone, the list gets the room
    assert overflow(phone) == 0
    for label in ("Behaviour at the limit", "Context window (tokens, optional)"):
        box = phone.get_by_label(label).bounding_box()
        assert box is not None
        assert box["x"] >= 0
        assert box["x"] + box["width"] <= PHONE["width"], label
    cid = new_conversation(phone, server, window=3_000)
    long_word = "x" * 300
    send(phone, f"A long word: {long_word}\n\n```\n{long_word}\n```")
    expect(phone.locator("#messages li.user pre")).to_have_count(1)
    assert overflow(phone) == 0
    for _ in range(30):  # to the limit: the banners and the composer at a phone's width
        if phone.locator("#exhausted").is_visible():
            break
        send(phone, "More, please.")
    expect(phone.get_by_role("button", name="Start a new conversation")).to_be_visible()
    assert overflow(phone) == 0
    assert state(server, cid)["phase"] == "context_exhausted"


# --------------------------------------------------------------------------- a second tab


def test_a_second_tab_shows_the_running_turn_and_takes_no_message(
    tabs: Tabs, tmp_path: Path
) -> None:
    model = HeldMidway(reply_chars=1_200)  # written until the test has seen the second tab
    slow = create_app(Runtime(store=SqliteStore(tmp_path / "tabs.db"), llm=model))
    with live_server(slow) as url:
        first = tabs.open()
        cid = new_conversation(first, url, window=200_000)
        second = tabs.tab(first.context)
        second.goto(f"{url}/c/{cid}")
        turn_over(second)
        expect(second.get_by_role("button", name="Send")).to_be_enabled()

        first.get_by_label("Your message").fill("Tell the other tab.")
        first.get_by_role("button", name="Send").click()
        try:
            expect(second.locator("#messages li.user .text")).to_have_text("Tell the other tab.")
            expect(second.get_by_role("button", name="Send")).to_be_disabled()
            expect(second.locator("#input-reason")).to_contain_text("busy")
            expect(second.locator("#phase")).not_to_contain_text("idle")
            expect(second.locator("#messages li.streaming .text").last).not_to_have_text("")
        finally:
            model.gate.set()
        turn_over(first)
        turn_over(second)
        expect(second.get_by_role("button", name="Send")).to_be_enabled()
        replies = [m["text"].strip() for m in stored(url, cid) if m["kind"] == "assistant"]
        for tab in (first, second):
            expect(tab.locator("#messages li.user")).to_have_count(1)
            expect(tab.locator("#messages li.assistant .text")).to_have_text(replies)
        tabs.close()


# --------------------------------------------------------------------------- Markdown


MARKDOWN = """# A heading

Some **bold**, some `code`, and a [link](https://example.org/).

```python
print("in a block")
```

<b id="raw-bold">raw bold</b> <img src="x" onerror="window.pwned = 1">

[run me](javascript:window.pwned=2) and ![a picture](https://example.org/p.png)
"""


@pytest.fixture(params=PROVIDERS)
def markdown_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The server with a key, answered by the provider's fake API with a Markdown reply."""
    with backends.backend(request.param) as fake:
        fake.default(Said(text=MARKDOWN, prompt=400, output=80, pieces=6))
        with live_server(fake.app(tmp_path / "md.db")) as url:
            yield url


def test_markdown_is_rendered_and_raw_html_stays_text(markdown_server: str, tabs: Tabs) -> None:
    page = tabs.open()
    page.goto(f"{markdown_server}/")
    page.get_by_label("Context window (tokens, optional)").fill("200000")
    page.get_by_role("button", name="New conversation").click()
    page.wait_for_url(re.compile(r"/c/[0-9a-f]{32}$"))
    turn_over(page)
    send(page, 'Mine: **strong** and <i id="raw-italic">raw italic</i>')

    mine = page.locator("#messages li.user .text")
    expect(mine.locator("strong")).to_have_text("strong")
    expect(mine).to_contain_text('<i id="raw-italic">raw italic</i>')  # shown, as written
    reply = page.locator("#messages li.assistant .text")
    expect(reply.locator("h1")).to_have_text("A heading")
    expect(reply.locator("strong")).to_have_text("bold")
    expect(reply.locator("pre code")).to_have_text('print("in a block")')
    font = reply.locator("pre code").evaluate("(e) => getComputedStyle(e).fontFamily")
    assert "mono" in font.lower(), font
    expect(reply).to_contain_text('<b id="raw-bold">raw bold</b>')
    expect(reply).to_contain_text('<img src="x" onerror="window.pwned = 1">')
    link = reply.get_by_role("link", name="link")
    expect(link).to_have_attribute("href", "https://example.org/")
    expect(link).to_have_attribute("rel", "noopener noreferrer nofollow")
    expect(reply).to_contain_text("run me")
    expect(reply.locator("a[href*='javascript' i]")).to_have_count(0)  # its address removed
    expect(reply.get_by_role("link", name="a picture")).to_be_visible()  # a link, not an image
    for raw in ("#raw-bold", "#raw-italic", "#messages img", "#messages script"):
        assert page.locator(raw).count() == 0, raw
    assert page.evaluate("window.pwned") is None


# --------------------------------------------------------------------------- refusals


def test_a_refused_message_stays_in_its_box_with_the_reason_beside_it(
    page: Page, server: str
) -> None:
    cid = new_conversation(page, server, window=1_000)
    too_long = "A very long message. " * 400
    box = page.get_by_label("Your message")
    box.fill(too_long)
    page.get_by_role("button", name="Send").click()
    reason = page.locator("#send-problem")
    expect(reason).to_contain_text("too long for the conversation's context window")
    expect(reason).not_to_contain_text("attach")  # the page has no way to attach a file
    expect(box).to_have_value(too_long)
    expect(page.locator("#messages li.user")).to_have_count(0)
    expect(page.get_by_role("button", name="Send")).to_be_enabled()
    assert stored(server, cid) == []
    box.fill("A short one.")
    expect(reason).to_be_hidden()
    page.get_by_role("button", name="Send").click()
    turn_over(page)
    expect(page.locator("#messages li.user")).to_have_count(1)


# --------------------------------------------------------------------------- the banner


def test_compaction_has_its_own_banner_and_it_goes_when_the_room_is_made(
    page: Page, server: str
) -> None:
    cid = new_conversation(page, server, behavior="compact_in_place", window=6_000)
    warned = False
    for turn in range(1, 40):  # about 5% a turn: some turn lands between 80% and 90%
        send(page, f"Keep going, part {turn}.")
        if state(server, cid)["generation"] > 1:
            break
        if meter(page)[1] == "warning":
            warned = True
            warning = page.locator("#warning")
            expect(warning).to_contain_text("older messages are summarised")
            expect(warning).not_to_contain_text("new conversation")
            expect(warning.get_by_role("button")).to_have_text("Compact now")
    else:
        pytest.fail("it never compacted")
    assert warned, "the warning never showed before the compaction"
    value, level = meter(page)
    assert level == "ok", (value, level)
    expect(page.locator("#warning")).to_be_hidden()
    expect(page.get_by_label("Your message")).to_be_enabled()


def test_figures_never_round_across_a_threshold(page: Page, server: str) -> None:
    new_conversation(page, server, window=200_000)
    shown = page.evaluate(
        """async () => {
          const { percentText } = await import('./static/js/meter.js');
          const at = (w, c) => ({ warning_tokens: w, continuation_tokens: c });
          return [
            percentText(797, 1000, at(800, 900)),
            percentText(896, 1000, at(800, 900)),
            percentText(800, 1000, at(800, 900)),
            percentText(806, 1000, at(805, 900)),
            percentText(1000, 1000, at(800, 900)),
          ];
        }"""
    )
    assert shown == ["79", "89", "80", "80.6", "100"]


# --------------------------------------------------------------------------- addresses


def test_an_unknown_conversation_says_so_and_offers_nothing(page: Page, server: str) -> None:
    page.goto(f"{server}/c/{'0' * 32}")
    expect(page.get_by_role("heading", name="No such conversation")).to_be_visible()
    expect(page.locator("#missing")).to_contain_text("0" * 32)
    for name in ("Send", "Pause", "Resume", "Cancel the turn"):
        expect(page.get_by_role("button", name=name)).to_be_hidden()
    expect(page.get_by_label("Your message")).to_be_hidden()
    page.get_by_role("link", name="All conversations").click()
    expect(page.get_by_role("heading", name="Conversations")).to_be_visible()


def test_the_page_works_mounted_under_a_prefix(tabs: Tabs, tmp_path: Path) -> None:
    runtime = Runtime(store=SqliteStore(tmp_path / "mounted.db"), llm=ScriptedModel(window=24_000))
    segue_app = create_app(runtime)
    parent = FastAPI(lifespan=segue_app.router.lifespan_context)
    parent.mount("/segue", segue_app)
    with live_server(parent) as url:
        page = tabs.open()
        cid = new_conversation(page, f"{url}/segue", window=3_000)
        assert page.url == f"{url}/segue/c/{cid}"
        send(page, "Hello from under a prefix.")
        expect(page.locator("#messages li.assistant")).not_to_have_count(0)
        page.get_by_role("link", name="segue").click()
        listed = page.get_by_role("link", name="Hello from under a prefix.")
        expect(listed).to_have_attribute("href", f"/segue/c/{cid}")
        tabs.close()
