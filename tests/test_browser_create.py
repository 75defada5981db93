"""The home page's form and list as a new user met them: the provider's compaction offered only
where the server can honour it (offline it always failed), the options folded on a phone so the
list gets the screen, a list line that wraps between its facts (never leaving a lone "·"), and
a failed conversation without a summary offering no "without the summary".
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from playwright.sync_api import Page, expect

import browsing
from api import create, send
from browsing import Served, Tabs, new_conversation, served
from browsing import send as typed
from segue.server.run import ServerConfig, build_app
from segue.testing import live_server

pytestmark = pytest.mark.slow
browser, server, tabs = browsing.browser, browsing.server, browsing.tabs
PHONE = {"width": 375, "height": 740}
SCREENS = {"1280x800": {"width": 1280, "height": 800}, "375x740": PHONE}
SHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"
__all__ = ["served"]


def screenshot(page: Page, moment: str, size: str) -> None:
    """What the screen shows, into docs/screenshots with ``SEGUE_UPDATE_SCREENSHOTS=1``."""
    if os.environ.get("SEGUE_UPDATE_SCREENSHOTS") == "1":
        SHOTS.mkdir(exist_ok=True)
        page.screenshot(path=str(SHOTS / f"{moment}-{size}.png"))


@pytest.fixture
def offline(tmp_path: Path) -> Iterator[str]:
    """A server of this test's own, offline, as ``segue serve`` runs it without a key."""
    with live_server(build_app(ServerConfig(db=tmp_path / "home.db", chunk_delay=0.0))) as url:
        yield url


def test_the_providers_compaction_is_offered_only_where_it_can_be_had(
    served: Served, tabs: Tabs
) -> None:
    asked = {"behavior": "compact_in_place", "compaction": "provider"}
    with httpx2.Client(base_url=served.url, timeout=60) as http:
        honoured = http.post("/api/conversations", json=asked).status_code == 201
        assert http.get("/api/info").json()["provider_compaction"] is honoured
    if served.offline:
        assert not honoured  # the scripted model has no provider to compact
    page = tabs.open()
    page.goto(f"{served.url}/")
    page.get_by_label("Behaviour at the limit").select_option("compact_in_place")
    who = page.get_by_label("Who compacts")
    if honoured:
        expect(who).to_be_visible()
        expect(who.locator("option")).to_have_text(
            ["segue (its own summary request)", "The provider (within its own call)"]
        )
    else:
        expect(who).to_be_hidden()  # segue alone: no choice to make
        expect(page.locator("#compaction option")).to_have_count(1)
        page.get_by_role("button", name="New conversation").click()
        page.wait_for_url(lambda address: "/c/" in address)  # created: no 422


def test_on_a_phone_the_form_folds_and_the_list_gets_the_screen(server: str, tabs: Tabs) -> None:
    with httpx2.Client(base_url=server, timeout=60) as http:
        for number in range(8):
            send(http, create(http)["id"], f"Question number {number} about the tides.")
    page = tabs.open(viewport=PHONE)
    page.goto(f"{server}/")
    button = page.get_by_role("button", name="New conversation")
    expect(button).to_be_visible()
    expect(page.get_by_label("Behaviour at the limit")).to_be_hidden()
    form = page.locator("#create").bounding_box()
    assert form is not None
    assert form["height"] <= 80, form  # it once took ~470 px
    items = page.locator("#conversations li")
    expect(items.first).to_be_visible()
    shown = items.evaluate_all(
        "(all) => all.filter((e) => e.getBoundingClientRect().bottom <= innerHeight).length"
    )
    assert shown >= 6, shown  # 2.5 once
    page.get_by_text("Options", exact=True).click()  # unfolded, everything is there
    expect(page.get_by_label("Behaviour at the limit")).to_be_visible()
    page.get_by_label("Context window (tokens, optional)").fill("3000")
    button.click()
    page.wait_for_url(lambda address: "/c/" in address)
    cid = page.url.rsplit("/", 1)[1]
    assert httpx2.get(f"{server}/api/conversations/{cid}").json()["context_window"] == 3_000


def test_on_a_desktop_the_options_are_open(server: str, tabs: Tabs) -> None:
    page = tabs.open()
    page.goto(f"{server}/")
    expect(page.get_by_label("Behaviour at the limit")).to_be_visible()
    expect(page.get_by_label("Context window (tokens, optional)")).to_be_visible()


@pytest.mark.parametrize("width", [320, 375, 414])
def test_a_list_line_wraps_between_its_facts(width: int, server: str, tabs: Tabs) -> None:
    with httpx2.Client(base_url=server, timeout=60) as http:
        send(http, create(http)["id"], "Plan the schema migration for the billing tables.")
    page = tabs.open(viewport={"width": width, "height": 740})
    page.goto(f"{server}/")
    facts = page.locator("#conversations li .meta .fact")
    expect(facts.first).to_be_visible()
    lines = facts.evaluate_all(
        "(all) => all.map((e) => [e.textContent,"
        " e.getBoundingClientRect().height < 1.5 * parseFloat(getComputedStyle(e).lineHeight)])"
    )
    assert all(one for _, one in lines), lines  # each fact on one line, whole
    assert all(text.startswith("· ") for text, _ in lines[1:4]), lines  # "·" with its fact
    lone = page.locator("#conversations li .meta").evaluate_all(
        "(all) => all.filter((e) => /(^|\\n)\\s*·\\s*($|\\n)/.test(e.innerText)).length"
    )
    assert lone == 0


def test_a_failed_conversation_without_a_summary_offers_no_without_the_summary(
    server: str, tabs: Tabs
) -> None:
    """A sub-agent's conversation fails at its limit (``intentionally_unhandled``): it wrote no
    summary, so its child starts from its last exchanges or from nothing."""
    page = tabs.open()
    cid = new_conversation(page, server, behavior="intentionally_unhandled", window=3_000)
    failed = page.get_by_role("alert").filter(has_text="This conversation failed")
    for _ in range(30):
        if failed.is_visible():
            break
        typed(page, "More, please.")
    expect(failed).to_contain_text("context_exhausted")
    kinds = {m["kind"] for m in httpx2.get(f"{server}/api/conversations/{cid}/messages").json()}
    assert not kinds & {"continuation", "checkpoint", "summary"}, kinds
    expect(page.get_by_role("button", name="Start a new conversation")).to_be_visible()
    expect(page.get_by_label("without the summary")).to_be_hidden()
    expect(page.get_by_label("with its last 3 exchanges")).to_be_visible()


@pytest.mark.parametrize("size", SCREENS)
def test_the_home_page_shows_the_form_and_the_list(size: str, offline: str, tabs: Tabs) -> None:
    """The home page as a person opens it, with a few conversations (the screenshots of
    docs/screenshots/home-*.png): nothing wider than the screen, the list below the form."""
    with httpx2.Client(base_url=offline, timeout=60) as http:
        titles = ["Moving house", "Billing tables migration", "Tides, part 2", "Tides, part 1"]
        for title in reversed(titles):
            send(http, create(http, metadata={"title": title})["id"], f"About {title}.")
    page = tabs.open(viewport=SCREENS[size])
    page.goto(f"{offline}/")
    items = page.locator("#conversations li")
    expect(items.get_by_role("link")).to_have_text(titles)
    assert page.evaluate("document.documentElement.scrollWidth - innerWidth") == 0
    last = items.last.bounding_box()
    assert last is not None
    assert last["y"] + last["height"] <= SCREENS[size]["height"]  # all four in sight
    screenshot(page, "home", size)
