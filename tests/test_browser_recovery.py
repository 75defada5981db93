"""The page when things go wrong: a conversation that failed for a reason no rule recognised
offers its way on (its last turns, or nothing, carried into a new conversation) and keeps the
failure's reason on the old one; a first read that fails is tried again, saying so; a stream
that drops the page (``reset``) is recovered from by reading the state again; and a read that
an update overtook never shows a message twice.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from playwright.sync_api import Page, Route, expect

import browsing
from api import create, send
from browsing import Tabs, newest_in_view, stored, turn_over
from segue import LlmCallError, LlmReply, LlmRequest, Runtime, ScriptedModel, SqliteStore
from segue.server import create_app
from segue.testing import live_server

pytestmark = pytest.mark.slow
browser, server, tabs = browsing.browser, browsing.server, browsing.tabs

FAIL = "(fail now)"
UNRECOGNISED = "the provider answered 400: a kind of refusal nobody knew of"


def answer(request: LlmRequest) -> LlmReply:
    """Every request answered, but a turn whose message asks to fail: that one fails with an
    error no rule recognises (neither retryable nor an overflow)."""
    last = next((m.text for m in reversed(request.messages) if m.kind == "user"), "")
    if request.purpose == "turn" and FAIL in last:
        raise LlmCallError(UNRECOGNISED, fatal=True, status_code=400)
    return LlmReply(text=f"Noted: {last}")


@pytest.fixture
def failing(tmp_path: Path) -> Iterator[str]:
    model = ScriptedModel(window=24_000, default=answer)
    runtime = Runtime(store=SqliteStore(tmp_path / "failing.db"), llm=model)
    with live_server(create_app(runtime)) as url:
        yield url


def failed_on_the_page(page: Page, url: str) -> str:
    page.goto(f"{url}/")
    page.get_by_role("button", name="New conversation").click()
    page.wait_for_url(re.compile(r"/c/[0-9a-f]{32}$"))
    turn_over(page)
    for text in ("Remember the number 41.", f"What was it? {FAIL}"):
        page.get_by_label("Your message").fill(text)
        page.get_by_role("button", name="Send").click()
        turn_over(page)
    return page.url.rsplit("/", 1)[1]


@pytest.mark.parametrize("carried", [True, False])
def test_a_failed_conversation_offers_its_way_on_and_keeps_its_reason(
    carried: bool, failing: str, tabs: Tabs
) -> None:
    page = tabs.open()
    parent = failed_on_the_page(page, failing)
    failed = page.get_by_role("alert").filter(has_text="This conversation failed")
    expect(failed).to_contain_text(UNRECOGNISED)
    expect(page.get_by_label("Your message")).to_be_enabled()  # a message may recover it
    carry = page.get_by_label("with its last 3 exchanges")
    expect(carry).to_be_checked()  # no summary to carry: its last turns, unless told
    expect(page.get_by_label("without the summary")).to_be_hidden()
    if not carried:
        carry.uncheck()
    page.get_by_role("button", name="Start a new conversation").click()
    page.wait_for_url(lambda address: not address.endswith(parent))
    turn_over(page)
    child = page.url.rsplit("/", 1)[1]
    users = page.locator("#messages li.user .text")
    if carried:
        expect(users).to_have_text(["Remember the number 41.", f"What was it? {FAIL}"])
        expect(page.locator("#messages li.assistant .text")).to_have_text(
            "Noted: Remember the number 41."
        )
    else:
        expect(page.locator("#messages li")).to_have_count(0)
    page.get_by_label("Your message").fill("Go on from here.")
    page.get_by_role("button", name="Send").click()
    turn_over(page)
    expect(page.locator("#messages li.assistant").last).to_contain_text("Go on from here.")

    page.get_by_role("link", name="Continued from the previous conversation").click()
    page.wait_for_url(f"{failing}/c/{parent}")
    turn_over(page)
    expect(failed).to_contain_text(UNRECOGNISED)  # the old one keeps its reason
    expect(page.get_by_role("link", name="Go to the new conversation")).to_have_attribute(
        "href", f"/c/{child}"
    )
    expect(page.get_by_role("button", name="Start a new conversation")).to_be_hidden()


def answered_once(page: Page, pattern: re.Pattern[str], **answer: Any) -> None:
    """The page's first request to ``pattern`` answered with ``answer`` (``Route.fulfill``'s
    arguments); the ones after it go to the server."""
    answered: list[Route] = []

    def once(route: Route) -> None:
        if answered:
            route.continue_()
            return
        answered.append(route)
        route.fulfill(**answer)

    page.route(pattern, once)


def test_a_first_read_that_fails_is_tried_again_saying_so(server: str, tabs: Tabs) -> None:
    with httpx2.Client(base_url=server, timeout=60) as http:
        cid = create(http, context_window=200_000)["id"]
        send(http, cid, "Are you there?")
    page = tabs.open()
    the_state = re.compile(rf"/api/conversations/{cid}$")
    unavailable = '{"error": "unavailable", "message": "the store cannot be used now"}'
    answered_once(page, the_state, status=503, content_type="application/json", body=unavailable)
    page.goto(f"{server}/c/{cid}")
    problem = page.get_by_role("alert").filter(has_text="could not be read")
    expect(problem).to_contain_text("the store cannot be used now")
    expect(problem).to_contain_text("trying again")
    expect(page.locator("#messages li.user .text")).to_have_text("Are you there?")
    expect(problem).to_be_hidden()
    turn_over(page)
    expect(page.get_by_role("button", name="Send")).to_be_enabled()


def test_a_stream_that_drops_the_page_is_recovered_by_reading_again(
    server: str, tabs: Tabs
) -> None:
    with httpx2.Client(base_url=server, timeout=60) as http:
        cid = create(http, context_window=200_000)["id"]
        send(http, cid, "First question.")
    page = tabs.open()
    events = re.compile(rf"/api/conversations/{cid}/events$")
    reads: list[str] = []
    page.on("request", lambda r: reads.append(r.url) if r.url.endswith(cid) else None)
    reset = 'event: reset\ndata: {"message": "you fell too far behind"}\n\n'
    answered_once(page, events, status=200, content_type="text/event-stream", body=reset)
    page.goto(f"{server}/c/{cid}")
    turn_over(page)
    with httpx2.Client(base_url=server, timeout=60) as http:
        send(http, cid, "A question from elsewhere.")
    expect(page.locator("#messages li.user .text")).to_have_text(
        ["First question.", "A question from elsewhere."]
    )
    assert len(reads) >= 2  # read at open, and again after the reset
    newest_in_view(page)


# A page whose watch stream can be held back (the test's own hand on the browser's fetch, not
# the page's code): its updates then reach the page after a read that already holds them, as
# they do from another server process a moment behind the store.
HOLD_THE_WATCH = """
(() => {
  const realFetch = window.fetch.bind(window);
  window.watchHeld = false;
  window.fetch = async (input, init) => {
    const response = await realFetch(input, init);
    if (!String(input).endsWith('/events')) return response;
    const reader = response.body.getReader();
    const body = new ReadableStream({
      async pull(controller) {
        const { value, done } = await reader.read();
        while (window.watchHeld) await new Promise((resolve) => setTimeout(resolve, 20));
        if (done) controller.close(); else controller.enqueue(value);
      },
    });
    return new Response(body, { status: response.status, headers: response.headers });
  };
})();
"""
MOST_SHOWN = """() => { window.most = {user: 0, assistant: 0};
  new MutationObserver(() => { for (const kind of ['user', 'assistant']) {
    const shown = document.querySelectorAll(`#messages li.${kind}`).length;
    window.most[kind] = Math.max(window.most[kind], shown); } }).observe(
    document.getElementById('messages'), {childList: true, subtree: true}); }"""


def test_updates_a_read_already_holds_are_never_shown_twice(server: str, tabs: Tabs) -> None:
    with httpx2.Client(base_url=server, timeout=60) as http:
        cid = create(http, context_window=200_000)["id"]
        page = tabs.open()
        page.add_init_script(HOLD_THE_WATCH)
        page.goto(f"{server}/c/{cid}")
        turn_over(page)
        page.evaluate(MOST_SHOWN)
        page.evaluate("window.watchHeld = true")
        turn = threading.Thread(target=send, args=(http, cid, "Asked from another tab."))
        turn.start()
        turn.join(60)
        # The page reads now (as after any reconnect): the turn, whole, before its updates.
        page.evaluate("async () => (await import('./static/js/view.js')).reload()")
        expect(page.locator("#messages li.user .text")).to_have_text("Asked from another tab.")
        the_state = re.compile(rf"/api/conversations/{cid}$")
        with page.expect_request(the_state):  # the turn's done, read back
            page.evaluate("window.watchHeld = false")  # the turn's updates arrive, late
        turn_over(page)
        replies = sum(1 for m in stored(server, cid) if m["kind"] == "assistant")
        assert page.evaluate("window.most") == {"user": 1, "assistant": replies}
        send(http, cid, "And once more.")  # a new turn from elsewhere is shown as it runs
        expect(page.locator("#messages li.user")).to_have_count(2)
