"""The page, driven in real headless Chromium by Playwright, against the real server (uvicorn on
a free port, a real SQLite store, the offline scripted model): what a person sees and does near
the limit. The meter moving through 80% and 90% with the banners in sight, the warning and the
manual continuation landing in the new conversation, the exhausted state with the input disabled
and the child started beside the composer, a failed sub-agent's typed error, the reply
streaming in and tools running, a reload in the middle of a reply losing nothing, pause and
resume with the snapshot list, the keyboard, and the orderings that once broke the page's
script (a click before the state was read; the watch stream ahead of the turn's own).

The limit and a streamed reply with tools run on the offline model and on each provider's real
client (``browsing.served``). More of the page (a second tab, Markdown, an unknown id, the app
mounted under a prefix) is in ``test_browser_page.py``; its screens (how much room the messages
get at each moment, on a desktop and a phone, and the screenshots in ``docs/screenshots``) in
``test_browser_screens.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, Route, expect

import browsing
from browsing import (
    Served,
    Tabs,
    hold,
    in_view,
    meter,
    new_conversation,
    newest_in_view,
    release,
    send,
    shown_in_the_messages,
    state,
    stored,
    turn_over,
)
from gated import HOLD_AT_MOST, HeldMidway
from segue import Runtime, SqliteStore
from segue.server import create_app
from segue.testing import live_server

pytestmark = pytest.mark.slow
browser, server, tabs, page = browsing.browser, browsing.server, browsing.tabs, browsing.page
served = browsing.served


def the_warning_in_sight(page: Page, figure: float) -> None:
    """With the newest reply in view, the meter and the warning are in sight too, and the
    warning says the meter's own figure."""
    newest_in_view(page)
    warning = page.locator("#warning")
    expect(warning).to_be_visible()
    expect(warning).to_contain_text(f"{figure:g}% full")
    expect(page.get_by_role("button", name="Continue in a new conversation")).to_be_enabled()
    assert in_view(page, "#meter"), "the meter scrolled out of sight"
    assert in_view(page, "#warning"), "the warning scrolled out of sight"


def test_the_meter_the_warning_the_limit_and_the_seeded_child(served: Served, page: Page) -> None:
    """On the offline model and on each provider's real client."""
    server = served.url
    parent = new_conversation(page, server, window=3_000, offline=served.offline)
    readings: list[tuple[float, str]] = []
    warned = False
    for turn in range(1, 30):
        send(page, f"Tell me more, part {turn}.")
        readings.append(meter(page))
        if page.locator("#exhausted").is_visible():
            break
        if readings[-1][1] == "warning" and not warned:
            warned = True
            the_warning_in_sight(page, readings[-1][0])
    values = [value for value, _ in readings]
    assert values == sorted(values), readings  # it only fills up
    levels = [level for _, level in readings]
    assert "warning" in levels, readings
    assert levels[-1] == "critical", readings
    assert values[-1] >= 90
    assert all((v >= 80) == (lv != "ok") for v, lv in readings), readings
    expect(page.locator("#meter-label")).to_have_text(f"{values[-1]:g}%")

    banner = page.get_by_role("status").filter(has_text="context limit")
    expect(banner).to_contain_text("Read-only")
    expect(page.locator("#warning")).to_be_hidden()
    # The composer is reduced to its one action: no box, no buttons that do nothing.
    for gone in ("Your message", "Pin this message"):
        expect(page.get_by_label(gone)).to_be_hidden()
    for gone in ("Send", "Pause", "Resume", "Cancel the turn"):
        expect(page.get_by_role("button", name=gone)).to_be_hidden()
    start = page.get_by_role("button", name="Start a new conversation")
    newest_in_view(page)
    for shown in ("#meter", "#exhausted", "#start-new"):
        assert in_view(page, shown), f"{shown} is out of sight at the limit"
    summary = str(state(server, parent)["summary"])
    page.get_by_role("button", name="Read its continuation summary").click()
    shown_summary = page.locator("#messages li.continuation").last
    expect(shown_summary).to_contain_text(summary.split(":", 1)[0])
    assert shown_in_the_messages(page, shown_summary), "the summary is not in view"

    start.click()
    page.wait_for_url(lambda address: not address.endswith(parent))
    child = page.url.rsplit("/", 1)[1]
    assert re.fullmatch(r"[0-9a-f]{32}", child)
    back = page.get_by_role("link", name="Continued from the previous conversation")
    expect(back).to_have_attribute("href", f"/c/{parent}")
    expect(page.locator("#messages")).to_contain_text("Summary of the earlier conversation")
    expect(page.get_by_label("Your message")).to_be_enabled()
    expect(page.locator("#chain-place")).to_have_text("Part 2 of 2")
    back.click()
    page.wait_for_url(f"{server}/c/{parent}")
    expect(page.locator("#chain-place")).to_have_text("Part 1 of 2")
    forward = page.get_by_role("link", name="Continued in a new conversation")
    expect(forward).to_have_attribute("href", f"/c/{child}")
    # It has its child: the page leads there instead of offering to start another.
    expect(page.get_by_role("link", name="Go to the new conversation")).to_have_attribute(
        "href", f"/c/{child}"
    )
    expect(page.get_by_role("button", name="Start a new conversation")).to_be_hidden()
    expect(page.get_by_label("without the summary")).to_be_hidden()


def test_continuing_by_hand_shows_it_works_then_lands_in_the_new_conversation(
    page: Page, server: str
) -> None:
    """While the summary is written (the answer to /continue is held here until the page has
    been looked at) the page says so and takes no input; then it opens the new conversation,
    seeded with the summary, without a second click."""
    parent = new_conversation(page, server, window=3_000)
    for turn in range(1, 30):
        send(page, f"Part {turn}.")
        if meter(page)[1] == "warning":
            break
    else:
        pytest.fail("the warning never came")
    continuing = re.compile(rf".*/api/conversations/{parent}/continue$")
    held = hold(page, continuing)
    with page.expect_request(continuing):
        page.get_by_role("button", name="Continue in a new conversation").click()
    working = page.get_by_role("status").filter(has_text="Writing a summary")
    expect(working).to_be_visible()
    expect(page.get_by_role("button", name="Send")).to_be_disabled()
    expect(page.get_by_role("button", name="Continue in a new conversation")).to_be_disabled()
    release(page, continuing, held)
    page.wait_for_url(lambda address: not address.endswith(parent))
    child = page.url.rsplit("/", 1)[1]
    expect(page.locator("#messages li.summary")).to_have_count(1)
    expect(page.get_by_label("Your message")).to_be_enabled()
    assert state(server, parent)["child_id"] == child
    assert state(server, child)["parent_id"] == parent


def test_a_child_without_the_summary(page: Page, server: str) -> None:
    parent = new_conversation(page, server, window=3_000)
    for turn in range(1, 30):
        send(page, f"Part {turn}.")
        if page.locator("#exhausted").is_visible():
            break
    else:
        pytest.fail("the limit never came")
    page.get_by_label("without the summary").check()
    page.get_by_role("button", name="Start a new conversation").click()
    page.wait_for_url(lambda address: not address.endswith(parent))
    expect(
        page.get_by_role("link", name="Continued from the previous conversation")
    ).to_be_visible()
    turn_over(page)
    expect(page.locator("#messages li")).to_have_count(0)  # not seeded


def test_a_failed_sub_agent_shows_its_typed_error_and_no_warning(page: Page, server: str) -> None:
    new_conversation(page, server, behavior="intentionally_unhandled", window=3_000)
    for turn in range(1, 30):
        send(page, f"Work item {turn}.")
        if page.locator("#failed").is_visible():
            break
        if meter(page)[1] == "warning":
            warning = page.locator("#warning")
            expect(warning).to_contain_text("this sub-agent stops")
            expect(warning.get_by_role("button")).to_be_hidden()  # continuing would fail it
    failed = page.get_by_role("alert").filter(has_text="This conversation failed")
    expect(failed).to_contain_text("context_exhausted")
    expect(page.locator("#warning")).to_be_hidden()
    expect(page.get_by_role("button", name="Start a new conversation")).to_be_visible()


# --------------------------------------------------------------------------- a turn


WATCH_THE_TURN = """() => { window.grew = false; window.toolLines = [];
  const seen = new WeakMap();
  new MutationObserver(() => {
    document.querySelectorAll('#messages li.streaming .text').forEach((text) => {
      const before = seen.get(text) || 0, now = text.textContent.length;
      if (before > 0 && now > before) window.grew = true;  // shown while it was written
      seen.set(text, now); });
    document.querySelectorAll('#messages li.tool').forEach(
      (li) => window.toolLines.push(li.textContent)); }).observe(
  document.getElementById('messages'), {childList: true, subtree: true, characterData: true}); }"""
"""Remembers whether a reply's text grew while it streamed, and every tool line shown."""


def test_the_reply_streams_in_and_tools_show_as_they_run(served: Served, page: Page) -> None:
    """On the offline model and on each provider's real client: the adapter's text deltas
    reach the page, which shows the reply growing; the tool runs in sight."""
    cid = new_conversation(page, served.url, window=200_000, offline=served.offline)
    page.evaluate(WATCH_THE_TURN)
    send(page, "Stream this, please.")
    for turn in range(3):  # the model calls its tool every third question
        send(page, f"And more {turn}.")
    # Seen growing in one of the four replies (a busy machine may hand the page a short
    # reply's deltas all at once, and then it is drawn once).
    assert page.evaluate("window.grew"), "no reply was ever seen while it was written"
    lines = page.evaluate("window.toolLines")
    assert any(line.startswith("Running lookup(") for line in lines), lines
    assert any(line.startswith("lookup finished: Notes on") for line in lines), lines
    expect(
        page.locator("#messages li.assistant").filter(has_text="Called lookup(")
    ).not_to_have_count(0)
    kept = stored(served.url, cid)
    replies = [m["text"] for m in kept if m["kind"] == "assistant" and m["text"]]
    shown = page.locator("#messages li.assistant .text").all_inner_texts()
    assert [" ".join(t.split()) for t in shown if t] == [" ".join(r.split()) for r in replies]


def test_a_reload_in_the_middle_of_a_reply_loses_nothing(tabs: Tabs, tmp_path: Path) -> None:
    """Reloaded while the reply is half written (its deltas still coming every few
    milliseconds until the page has shown the turn running again, each on the watch stream
    while the page reads the state): the turn goes on, and the page ends with the whole
    reply, once."""
    model = HeldMidway()
    app = create_app(Runtime(store=SqliteStore(tmp_path / "slow.db"), llm=model))
    with live_server(app) as url:
        page = tabs.open()
        cid = new_conversation(page, url, window=200_000)
        page.get_by_label("Your message").fill("A long answer, please.")
        page.get_by_role("button", name="Send").click()
        try:
            assert model.halfway.wait(HOLD_AT_MOST)
            expect(page.locator("#messages li.streaming .text").last).not_to_have_text("")
            page.reload()
            expect(page.locator("#input-reason")).to_contain_text("busy")  # the turn goes on
        finally:
            model.gate.set()
        expect(page.get_by_label("Your message")).to_be_enabled()  # until it is over
        reply = [m["text"] for m in stored(url, cid) if m["kind"] == "assistant"]
        assert len(reply) == 1
        assert len(str(reply[0])) == 18_000
        expect(page.locator("#messages li.user")).to_have_count(1)
        expect(page.locator("#messages li.assistant .text")).to_have_text(str(reply[0]).strip())
        tabs.close()


def test_pause_asks_why_then_resume_and_the_snapshot_list(page: Page, server: str) -> None:
    cid = new_conversation(page, server, window=200_000)
    send(page, "Start the job.")
    page.get_by_role("button", name="Pause").click()
    reason = page.get_by_label("Why pause? (kept in the snapshot)")
    expect(reason).to_be_focused()
    page.keyboard.press("Escape")  # changed their mind: nothing paused
    expect(reason).to_be_hidden()
    expect(page.get_by_role("button", name="Pause")).to_be_enabled()
    assert state(server, cid)["phase"] == "idle"
    page.get_by_role("button", name="Pause").click()
    reason.fill("waiting for the deploy window")
    reason.press("Enter")  # pauses; the message box's form never sees it
    expect(page.get_by_role("status").filter(has_text="paused")).to_contain_text(
        "waiting for the deploy window"
    )
    expect(reason).to_be_hidden()
    expect(page.get_by_label("Your message")).to_be_hidden()  # Resume is the way on
    expect(page.get_by_role("button", name="Send")).to_be_hidden()
    page.get_by_role("button", name="Snapshots (1)").click()
    rows = page.get_by_role("dialog", name="Snapshots").get_by_role("table").locator("tbody tr")
    expect(rows).to_have_count(1)
    cells = rows.first.locator("td")
    expect(cells.nth(0)).to_have_text("v1")
    expect(cells.nth(2)).to_have_text("waiting for the deploy window")
    expect(cells.nth(3)).to_have_text("1")  # the session
    expect(cells.nth(4)).to_have_text(re.compile(r"^\d+ s$|^\d+ min \d+ s$"))  # how long it ran
    link = rows.first.get_by_role("link", name="JSON of v1")
    whole = page.request.get(link.get_attribute("href") or "")
    assert whole.ok
    assert (whole.json()["version"], whole.json()["reason"]) == (1, "waiting for the deploy window")
    assert whole.json()["checkpoint"]
    kinds = [m["kind"] for m in stored(server, cid)]
    assert kinds.count("user") == 1  # the Enter in the reason's box sent no message
    page.get_by_role("button", name="Close").click()
    page.get_by_role("button", name="Resume").click()
    expect(page.get_by_label("Your message")).to_be_enabled()
    expect(page.locator("#paused")).to_be_hidden()
    assert state(server, cid)["session"] == 2


def test_the_keyboard_alone_sends_and_html_stays_text(page: Page, server: str) -> None:
    cid = new_conversation(page, server, window=200_000)
    expect(page.get_by_label("Your message")).to_have_attribute(
        "placeholder", re.compile("Enter sends, Shift\\+Enter: new line")
    )
    for _ in range(20):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.id") == "text":
            break
    else:
        pytest.fail("Tab never reached the message box")
    hostile = '<img src=x onerror="window.pwned=1"><b id="bold">bold</b>'
    page.keyboard.type(hostile)
    page.keyboard.press("Shift+Enter")  # a new line, not a send
    page.keyboard.type("second line")
    expect(page.get_by_label("Your message")).to_have_value(f"{hostile}\nsecond line")
    assert stored(server, cid) == []
    page.keyboard.press("Enter")  # sends, as the placeholder says
    turn_over(page)
    expect(page.locator("#messages li.assistant")).not_to_have_count(0)
    expect(page.locator("#messages li.user .text")).to_contain_text(hostile)
    assert page.evaluate("window.pwned") is None
    assert page.locator("#bold").count() == 0
    assert page.locator("#messages img").count() == 0
    for role, name in [  # an idle conversation's controls, each named
        ("button", "Send"),
        ("button", "Pause"),
        ("meter", "Context window used"),
        ("textbox", "Your message"),
    ]:
        expect(page.get_by_role(role, name=name)).to_have_count(1)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- orderings


STATE = re.compile(r".*/api/conversations/[0-9a-f]{32}$")


def the_transcript_once(page: Page, url: str, cid: str) -> None:
    """The page shows the stored transcript's user messages and replies, each once (a turn may
    hold two replies: the scripted model calls its tool every third answer)."""
    kept = stored(url, cid)
    users = [m["text"] for m in kept if m["kind"] == "user"]
    replies = [m["text"].strip() for m in kept if m["kind"] == "assistant"]
    expect(page.locator("#messages li.user .text")).to_have_text(users)
    expect(page.locator("#messages li.assistant .text")).to_have_text(replies)


def test_a_send_before_the_state_is_read_waits_for_it(page: Page, server: str) -> None:
    """Under load the page once took a click before its first read of the state had answered,
    and threw ("Cannot read properties of undefined (reading 'slice')"). The read is held here
    until the page has been asked to send: the controls wait for the state."""
    cid = str(httpx_create(server))
    held = hold(page, STATE)
    with page.expect_request(STATE):
        page.goto(f"{server}/c/{cid}")
    expect(page.get_by_role("button", name="Send")).to_be_disabled()
    expect(page.get_by_label("Your message")).to_be_disabled()
    expect(page.locator("#input-reason")).to_have_text("Loading the conversation…")
    page.evaluate("document.getElementById('composer').requestSubmit()")  # what a click did
    assert held, "the state was never asked for"
    release(page, STATE, held)
    send(page, "Now, with the state read.")
    the_transcript_once(page, server, cid)


def test_the_watch_stream_ahead_of_the_turns_own_shows_the_turn_once(
    page: Page, server: str
) -> None:
    """The turn's own event stream is held back until the turn is over, so the watch stream
    delivers every update of it first: the page shows the turn once, not twice."""
    cid = new_conversation(page, server, window=200_000)
    messages = re.compile(rf".*/api/conversations/{cid}/messages$")

    def late(route: Route) -> None:
        if route.request.method != "POST":
            route.continue_()
            return
        answered = route.fetch()  # the whole stream: the turn is over when it returns
        route.fulfill(response=answered)

    page.evaluate(  # the most messages of each kind the page ever shows meanwhile
        """() => { window.most = {user: 0, assistant: 0};
        new MutationObserver(() => { for (const kind of ['user', 'assistant']) {
          const shown = document.querySelectorAll(`#messages li.${kind}`).length;
          window.most[kind] = Math.max(window.most[kind], shown); } }).observe(
          document.getElementById('messages'), {childList: true, subtree: true}); }"""
    )
    page.route(messages, late)
    send(page, "One turn, seen once.")
    page.unroute(messages)
    the_transcript_once(page, server, cid)
    replies = sum(1 for m in stored(server, cid) if m["kind"] == "assistant")
    assert page.evaluate("window.most") == {"user": 1, "assistant": replies}


def httpx_create(url: str) -> str:
    import httpx2

    created = httpx2.post(f"{url}/api/conversations", json={"context_window": 200_000})
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


def test_the_form_takes_a_local_servers_window(page: Page, server: str) -> None:
    """A window that is not a multiple of 1,000 (llama.cpp's 2,048, a model's 4,096) is taken
    as typed: the real-model tier found the form refusing it without a word."""
    cid = new_conversation(page, server, window=2048)
    assert state(server, cid)["context_window"] == 2048
