"""A tab on another server process: two ``segue serve`` processes on one database (a SQLite file;
a PostgreSQL database on a throwaway cluster), a page open on B while a message is sent through
A. Without a reload, B shows the user's message and takes no other while the turn runs, then
the reply, the meter and the end of the turn, as the store tells it.

Both servers run a provider's real client (``--provider anthropic`` or ``openai``) against its
fake API in this process, whose answer is held until the test has seen B show the turn running
(no race against a fixed delay). Over SQLite each test runs on both providers; the PostgreSQL
one, which adds a store rather than a provider, on Anthropic's.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx2
import pytest
from playwright.sync_api import APIResponse, Route, expect

import backends
import browsing
import clusters
from api import create, send
from backends import PROVIDERS, Backend
from browsing import Tabs, meter, turn_over
from gated import HOLD_AT_MOST
from segue.executor.models.providers import Provider
from segue.testing.conformance import Said
from segue.testing.postgres import ThrowawayCluster
from serving import segue_serve

pytestmark = pytest.mark.slow
cluster = clusters.cluster  # one throwaway cluster for the module
browser, tabs = browsing.browser, browsing.tabs

WINDOW = 50_000
REPLY = "The tide turns twice a day, whichever process you ask."


class HeldAnswers:
    """The fake API's answer, held until ``gate`` opens; ``asked`` says a request arrived."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        self.gate = threading.Event()

    def __call__(self) -> Said:
        self.asked.set()
        self.gate.wait(HOLD_AT_MOST)
        return Said(text=REPLY, prompt=20_000, output=15)


class TwoServers(NamedTuple):
    """Servers A and B on one store, a client of A, and a conversation created through it."""

    a: str
    b: str
    http: httpx2.Client
    fake: Backend
    held: HeldAnswers
    cid: str


@contextlib.contextmanager
def two_servers(store_args: list[str], provider: Provider) -> Iterator[TwoServers]:
    """Two ``segue serve`` on the store ``store_args`` names, each running ``provider``'s real
    client against its fake API (whose answers are held, and which records the server that
    asked in ``x-server``)."""
    held = HeldAnswers()
    with backends.backend(provider) as fake:
        fake.default(held)
        args = [*store_args, *fake.args, "--context-window", str(WINDOW)]
        with (
            segue_serve(*args, "--header", "X-Server:a", env=fake.env) as a,
            segue_serve(*args, "--header", "X-Server:b", env=fake.env) as b,
            httpx2.Client(base_url=a, timeout=HOLD_AT_MOST) as http,
        ):
            yield TwoServers(a, b, http, fake, held, create(http)["id"])


@contextlib.contextmanager
def a_turn_through_a(servers: TwoServers) -> Iterator[list[Any]]:
    """ "Ask A." sent through A from another thread: inside the block A's model has been asked
    and holds its answer; after it the turn is over, and the list holds its events."""
    events: list[Any] = []
    turn = threading.Thread(target=lambda: events.extend(send(servers.http, servers.cid, "Ask A.")))
    turn.start()
    try:
        assert servers.held.asked.wait(60)
        yield events
    finally:
        servers.held.gate.set()
        turn.join(timeout=HOLD_AT_MOST)


def a_turn_through_a_seen_on_b(tabs: Tabs, store_args: list[str], provider: Provider) -> None:
    with two_servers(store_args, provider) as servers:
        page = tabs.open()
        page.goto(f"{servers.b}/c/{servers.cid}")
        turn_over(page)
        expect(page.get_by_role("button", name="Send")).to_be_enabled()
        assert meter(page) == (0.0, "ok")
        page.evaluate("window.sameDocument = true")  # gone if the page reloads

        with a_turn_through_a(servers) as events:
            expect(page.locator("#messages li.user .text")).to_have_text("Ask A.")
            expect(page.get_by_role("button", name="Send")).to_be_disabled()
            expect(page.locator("#input-reason")).to_contain_text("busy")
            expect(page.locator("#phase")).not_to_contain_text("idle")
        assert events[-1][1]["state"]["phase"] == "idle"

        expect(page.locator("#messages li.assistant .text")).to_have_text(REPLY)
        expect(page.locator("#meter-label")).to_have_text("40%")  # 20,015 of 50,000
        turn_over(page)
        expect(page.get_by_role("button", name="Send")).to_be_enabled()
        expect(page.locator("#messages li.user")).to_have_count(1)
        assert page.evaluate("window.sameDocument") is True
        assert len(servers.fake.sent()) == 1  # A answered; B only watched
        tabs.close()


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_tab_on_another_process_over_sqlite(
    provider: Provider, tabs: Tabs, tmp_path: Path
) -> None:
    a_turn_through_a_seen_on_b(tabs, ["--db", str(tmp_path / "shared.db")], provider)


def test_a_tab_on_another_process_over_postgresql(tabs: Tabs, cluster: ThrowawayCluster) -> None:
    database = cluster.create_database("two_servers")
    a_turn_through_a_seen_on_b(tabs, ["--database-url", database], "anthropic")


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_pause_asked_on_b_is_taken_by_a_at_its_turns_end(
    provider: Provider, tabs: Tabs, tmp_path: Path
) -> None:
    """The pause button on B while A runs the turn: B answers at once (the page says the pause
    waits for the turn), A pauses at the turn's boundary and writes the checkpoint, and B's
    page shows the pause and its snapshot."""
    with two_servers(["--db", str(tmp_path / "shared.db")], provider) as servers:
        page = tabs.open()
        page.goto(f"{servers.b}/c/{servers.cid}")
        turn_over(page)
        with a_turn_through_a(servers) as events:
            expect(page.get_by_role("button", name="Send")).to_be_disabled()
            page.get_by_role("button", name="Pause").click()
            page.get_by_label("Why pause? (kept in the snapshot)").fill("deploy window")
            page.get_by_role("button", name="Pause now").click()
            waiting = page.get_by_role("status").filter(has_text="Pausing when this turn")
            expect(waiting).to_be_visible()
            state = servers.http.get(f"/api/conversations/{servers.cid}").json()
            assert state["pause_requested"] is True
        assert events[-1][1]["state"]["phase"] == "paused"  # A took it
        paused = page.get_by_role("status").filter(has_text="This conversation is paused")
        expect(paused).to_contain_text("deploy window")
        page.get_by_role("button", name="Snapshots (1)").click()
        rows = page.get_by_role("table").locator("tbody tr")
        expect(rows).to_have_count(1)
        expect(rows.first).to_contain_text("deploy window")
        asked = servers.fake.sent()
        assert [r.headers["x-server"] for r in asked] == ["a", "a"]  # the turn, the checkpoint
        assert asked[1].tools == ()  # the checkpoint's request
        tabs.close()


def test_a_state_read_an_update_overtook_is_read_again(tabs: Tabs, tmp_path: Path) -> None:
    """The page reads the state when its watch is in place; if another process's turn begins
    while that read is on its way, its first update may reach the page before the read's
    answer, which then describes the conversation before the turn. The page reads again and
    shows the turn running, rather than settling on the older state (it once showed "idle"
    with Send enabled until the turn ended)."""
    with two_servers(["--db", str(tmp_path / "shared.db")], "anthropic") as servers:
        page = tabs.open()
        the_state = re.compile(rf"/api/conversations/{servers.cid}$")
        early: list[tuple[Route, APIResponse]] = []

        def first_read_held(route: Route) -> None:
            if early:  # only the first read is held; any other goes to B
                route.continue_()
            else:
                early.append((route, route.fetch()))

        page.route(the_state, first_read_held)
        page.goto(f"{servers.b}/c/{servers.cid}")
        deadline = time.monotonic() + HOLD_AT_MOST
        while not early:  # the page's first read, answered by B before the turn
            assert time.monotonic() < deadline, "the page never read the state"
            page.wait_for_timeout(50)
        route, idle = early[0]
        assert idle.json()["phase"] == "idle"

        with a_turn_through_a(servers) as events:
            # B's watch told the page of the turn while its read is still unanswered
            expect(page.locator("#messages li.user .text")).to_have_text("Ask A.")
            route.fulfill(response=idle)  # the read's answer: the state before the turn
            page.unroute(the_state)  # later reads go to B
            expect(page.locator("#phase")).to_contain_text("llm requesting")
            expect(page.locator("#messages li.user .text")).to_have_text("Ask A.")
            expect(page.get_by_role("button", name="Send")).to_be_disabled()
            expect(page.locator("#input-reason")).to_contain_text("busy")
        assert events[-1][1]["state"]["phase"] == "idle"
        expect(page.locator("#messages li.assistant .text")).to_have_text(REPLY)
        expect(page.get_by_role("button", name="Send")).to_be_enabled()
        tabs.close()
