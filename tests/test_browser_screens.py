"""The page on a desktop (1280x800) and a phone (375x740), measured at each moment of a
conversation: the messages get at least half of the screen, at the warning and at the limit too
(the sticky parts compact, the read-only composer reduced to its one action, the continuation
summary read where there is room); the newest message is in view after every turn, on open and
in the child, unless the reader scrolled up, who is then told of new messages; and the README's
own window (``segue serve --context-window N``) shows the warning before the limit.

``SEGUE_UPDATE_SCREENSHOTS=1`` writes the screenshots of ``docs/screenshots`` (the warning, the
limit and the child at both sizes) as the test reaches each moment.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from playwright.sync_api import Page, expect

import browsing
from api import create, send
from browsing import (
    Tabs,
    in_view,
    messages_room,
    newest_in_view,
    shown_in_the_messages,
    turn_over,
)
from segue.server.run import ServerConfig, build_app
from segue.testing import live_server

pytestmark = pytest.mark.slow
browser, server, tabs = browsing.browser, browsing.server, browsing.tabs

ROOT = Path(__file__).resolve().parent.parent
SCREENS = {"1280x800": {"width": 1280, "height": 800}, "375x740": {"width": 375, "height": 740}}
SHOTS = ROOT / "docs" / "screenshots"
HALF = 0.5


def readme_window() -> int:
    """The window the README suggests for reaching the limit in a few messages."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(r"`segue serve --context-window ([\d,]+)`", readme)
    assert found is not None, "the README no longer suggests a window"
    return int(found[1].replace(",", ""))


@pytest.fixture(scope="module")
def readme_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``segue serve --context-window N`` as the README suggests it (offline)."""
    db = tmp_path_factory.mktemp("screens") / "screens.db"
    config = ServerConfig(db=db, chunk_delay=0.002, context_window=readme_window())
    with live_server(build_app(config)) as url:
        yield url


def screenshot(page: Page, moment: str, size: str) -> None:
    if os.environ.get("SEGUE_UPDATE_SCREENSHOTS") == "1":
        SHOTS.mkdir(exist_ok=True)
        page.screenshot(path=str(SHOTS / f"{moment}-{size}.png"))


def roomy(page: Page, moment: str) -> dict[str, float]:
    """The newest message in view, the document unscrolled, the messages given half the
    screen at least: what was measured."""
    measured = newest_in_view(page)
    assert measured["scrolled"] == 0, (moment, measured)  # only the messages scroll
    assert measured["room"] >= HALF * measured["height"], (moment, measured)
    return measured


@pytest.mark.parametrize("size", SCREENS)
def test_the_messages_have_room_and_the_newest_in_view_at_each_moment(
    size: str, readme_server: str, tabs: Tabs
) -> None:
    page = tabs.open(viewport=SCREENS[size])
    failed_loads: list[str] = []
    page.on("response", lambda r: failed_loads.append(r.url) if r.status >= 400 else None)
    page.goto(f"{readme_server}/")
    page.get_by_role("button", name="New conversation").click()  # the server's window
    page.wait_for_url(re.compile(r"/c/[0-9a-f]{32}$"))
    parent = page.url.rsplit("/", 1)[1]
    turn_over(page)
    warned = False
    for turn in range(1, 60):
        page.get_by_label("Your message").fill(f"Tell me more, part {turn}.")
        page.get_by_role("button", name="Send").click()
        turn_over(page)
        if page.locator("#exhausted").is_visible():
            break
        measured = newest_in_view(page)
        assert measured["scrolled"] == 0, measured
        if page.locator("#warning").is_visible() and not warned:
            warned = True  # seen on the way, with a turn to spare before the limit
            roomy(page, "warning")
            assert in_view(page, "#warning")
            assert in_view(page, "#continue")  # its button, not scrolled away
            screenshot(page, "warning", size)
    else:
        pytest.fail("the limit never came")
    assert warned, "the README's window went past the warning without showing it"

    roomy(page, "limit")
    for shown in ("#meter", "#exhausted", "#start-new"):
        assert in_view(page, shown), shown
    composer = page.locator("#composer")
    expect(composer.get_by_role("button")).to_have_count(1)  # its one action
    expect(composer.get_by_role("textbox")).to_have_count(0)
    screenshot(page, "limit", size)
    page.get_by_role("button", name="Read its continuation summary").click()
    summary = page.locator("#messages li.continuation").last
    assert shown_in_the_messages(page, summary)
    assert messages_room(page)["room"] >= HALF * SCREENS[size]["height"]

    page.get_by_role("button", name="Start a new conversation").click()
    page.wait_for_url(lambda address: not address.endswith(parent))
    turn_over(page)
    expect(page.locator("#messages li.summary")).to_have_count(1)
    roomy(page, "child")
    page.get_by_label("Your message").fill("And where were we?")
    page.get_by_role("button", name="Send").click()
    turn_over(page)
    roomy(page, "child")
    screenshot(page, "child", size)

    page.goto(f"{readme_server}/c/{parent}")  # opened again: at its newest message, not its oldest
    turn_over(page)
    roomy(page, "opened")
    assert failed_loads == []  # no 404 (the icon included) on any load


def test_a_reader_who_scrolled_up_stays_there_and_is_told_of_new_messages(
    server: str, tabs: Tabs
) -> None:
    with httpx2.Client(base_url=server, timeout=60) as http:
        cid = create(http, context_window=200_000)["id"]
        for turn in range(4):
            send(http, cid, f"Fill the screen, part {turn}.")
        page = tabs.open(viewport=SCREENS["1280x800"])
        page.goto(f"{server}/c/{cid}")
        turn_over(page)
        newest_in_view(page)
        box = page.locator("#messages").bounding_box()
        assert box is not None
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.mouse.wheel(0, -5_000)  # the reader goes back up to read
        expect(page.locator("#messages li").first).to_be_in_viewport()
        another = threading.Thread(target=send, args=(http, cid, "Another tab's question."))
        another.start()
        another.join(60)
        button = page.get_by_role("button", name="New messages ↓")
        expect(button).to_be_visible()  # said, not scrolled to
        expect(page.locator("#messages li.user").last).to_have_text(
            re.compile("Another tab's question")
        )
        expect(page.locator("#messages li").first).to_be_in_viewport()
        button.click()
        newest_in_view(page)
        expect(button).to_be_hidden()


def test_the_list_shows_titles_and_dates_and_reads_on_a_phone(server: str, tabs: Tabs) -> None:
    with httpx2.Client(base_url=server, timeout=60) as http:
        cid = create(http, context_window=200_000)["id"]
        send(http, cid, "Plan the schema migration for the billing tables tonight please.")
        empty = create(http)["id"]
    page = tabs.open(viewport=SCREENS["375x740"])
    page.goto(f"{server}/")
    titled = page.get_by_role("link", name="Plan the schema migration for the billing tables…")
    expect(titled).to_have_attribute("href", f"/c/{cid}")
    item = page.locator("#conversations li").filter(has=titled)
    expect(item).to_contain_text(re.compile(r"20\d\d"))  # its date
    expect(item).to_contain_text("idle")
    expect(page.locator("#conversations li").filter(has_text=empty[:8])).to_contain_text(
        "New conversation (no message yet)"
    )
    assert page.evaluate("document.documentElement.scrollWidth - innerWidth") == 0
    # Words wrap whole (the list once broke "co / ntext exhausted" mid-word).
    assert titled.evaluate("(e) => getComputedStyle(e).overflowWrap") == "break-word"
    meta = item.locator(".meta")
    assert meta.evaluate("(e) => getComputedStyle(e).overflowWrap") == "normal"
    browsing.unfold_options(page)  # folded on a phone
    behaviour = page.get_by_label("Behaviour at the limit")
    fits = behaviour.evaluate(
        "(e) => { const c = document.createElement('canvas').getContext('2d');"
        " c.font = getComputedStyle(e).font;"
        " return c.measureText(e.selectedOptions[0].text).width + 24 <= e.clientWidth; }"
    )
    assert fits, "the behaviour's choice is cut off"
