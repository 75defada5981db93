"""Driving segue's page in real headless Chromium with Playwright: the browser, a server as
``segue serve`` runs it (offline, or with each provider's real client at its fake API), a page
that fails its test on any uncaught script error, and the steps a person takes (create a
conversation, send, wait for the turn to end, read the meter).

Every wait is for a condition the page shows (Playwright's ``expect``), never a fixed time, so
the tests hold on a loaded machine. The browser is Debian's ``chromium`` (Playwright's own
download cannot work offline); when it is missing and this runs as root on a Debian-like
system, it is installed with apt-get, else the test fails saying how to install it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import httpx2
import pytest
from playwright.sync_api import (
    Browser,
    BrowserContext,
    Locator,
    Page,
    Route,
    expect,
    sync_playwright,
)

import backends
from backends import PROVIDERS, chat
from segue.server.run import ServerConfig, build_app
from segue.testing import live_server

ARGS = [
    "--no-sandbox",  # root in a container has no user namespaces for the sandbox
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-background-timer-throttling",  # a second tab in the background keeps up
    "--disable-renderer-backgrounding",
]
TIMEOUT = 30_000  # ms for anything the page waits on (a loaded 2-core machine)
DESKTOP = {"width": 1100, "height": 900}


def chromium() -> str:
    """The path of a Chromium to drive: Debian's package, installed here if it can be."""
    for candidate in (
        "/usr/bin/chromium",
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
    ):
        if candidate and Path(candidate).is_file():
            return candidate
    apt = shutil.which("apt-get")
    if apt and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for step in ([apt, "update", "-qq"], [apt, "install", "-y", "-qq", "chromium"]):
            subprocess.run(step, check=False, env=env, capture_output=True, timeout=900)  # noqa: S603
        if Path("/usr/bin/chromium").is_file():
            return "/usr/bin/chromium"
    pytest.fail("the browser tests need Chromium: apt-get install -y chromium (see the README)")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        expect.set_options(timeout=TIMEOUT)
        launched = playwright.chromium.launch(executable_path=chromium(), args=ARGS)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server as ``segue serve`` runs it without a key, its replies streaming quickly."""
    db = tmp_path_factory.mktemp("browser") / "page.db"
    with live_server(build_app(ServerConfig(db=db, chunk_delay=0.002))) as url:
        yield url


class Served(NamedTuple):
    """A server for a test, and what answers behind it."""

    url: str
    backend: str
    """``scripted`` (no key), or the provider whose real client is at its fake API."""

    @property
    def offline(self) -> bool:
        return self.backend == "scripted"


@pytest.fixture(params=["scripted", *PROVIDERS])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    """The module's offline server, then a server per provider with a key, its model the
    provider's real client at its fake API, answering as a chat model that calls the demo's
    tool every third question and streams each reply in 30 pieces over about 0.3 s (the page
    shows a reply while it is written). Ask for it before ``page`` or ``tabs``, so the pages
    are closed before the server stops."""
    if request.param == "scripted":
        yield Served(str(request.getfixturevalue("server")), "scripted")
        return
    with backends.backend(request.param) as fake:
        fake.respond(partial(chat, tool_every=3, pieces=30, chunk_delay=0.01))
        with live_server(fake.app(tmp_path / "page.db", tools=True)) as url:
            yield Served(url, request.param)


class Tabs:
    """Browser contexts opened by a test, each page failing the test on an uncaught error."""

    def __init__(self, browser: Browser) -> None:
        self.browser = browser
        self.contexts: list[BrowserContext] = []
        self.errors: list[str] = []

    def open(self, **options: Any) -> Page:
        context = self.browser.new_context(**{"viewport": DESKTOP, **options})
        context.set_default_timeout(TIMEOUT)
        self.contexts.append(context)
        return self.tab(context)

    def tab(self, context: BrowserContext) -> Page:
        """Another page in ``context`` (the same browser profile: a second tab)."""
        opened = context.new_page()
        opened.on("pageerror", lambda error: self.errors.append(str(error)))
        return opened

    def close(self) -> None:
        """Close every page: a test serving its own app calls it before the server stops, as
        a shown page holds an event stream open, which a stopping server would wait for."""
        for context in self.contexts:
            context.close()
        self.contexts.clear()


@pytest.fixture
def tabs(browser: Browser) -> Iterator[Tabs]:
    opened = Tabs(browser)
    yield opened
    opened.close()
    assert opened.errors == []  # no uncaught error in the page's script


@pytest.fixture
def page(tabs: Tabs) -> Page:
    return tabs.open()


def unfold_options(page: Page) -> None:
    """Open the create form's options, folded on a phone (a desktop shows them open)."""
    options = page.locator("#create-options")
    expect(options).to_be_visible()
    if options.get_attribute("open") is None:
        page.get_by_text("Options", exact=True).click()
    expect(page.get_by_label("Behaviour at the limit")).to_be_visible()


def new_conversation(
    page: Page, url: str, *, behavior: str | None = None, window: int, offline: bool = True
) -> str:
    """Create a conversation with the home page's form; its id (the page opens it)."""
    page.goto(f"{url}/")
    banner = expect(page.locator("#offline"))
    if offline:
        banner.to_be_visible()  # no key: the page says so
    else:
        banner.to_be_hidden()
    unfold_options(page)
    if behavior is not None:
        page.get_by_label("Behaviour at the limit").select_option(behavior)
    page.get_by_label("Context window (tokens, optional)").fill(str(window))
    page.get_by_role("button", name="New conversation").click()
    page.wait_for_url(re.compile(r"/c/[0-9a-f]{32}$"))
    turn_over(page)
    return page.url.rsplit("/", 1)[1]


def send(page: Page, text: str) -> None:
    """Type and send a message, then wait until the turn is over."""
    page.get_by_label("Your message").fill(text)
    page.get_by_role("button", name="Send").click()
    turn_over(page)


def turn_over(page: Page) -> None:
    """Wait until no turn runs and the page has read the state (not ``aria-busy``)."""
    expect(page.get_by_role("list", name="Messages")).to_have_attribute("aria-busy", "false")


def meter(page: Page) -> tuple[float, str]:
    """The meter's value and level class."""
    element = page.get_by_role("meter", name="Context window used")
    value = float(element.get_attribute("aria-valuenow") or "0")
    classes = element.get_attribute("class") or ""
    found = re.search(r"level-(ok|warning|critical)", classes)
    assert found is not None
    return value, found[1]


def stored(url: str, cid: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = httpx2.get(f"{url}/api/conversations/{cid}/messages").json()
    return messages


def state(url: str, cid: str) -> dict[str, Any]:
    found: dict[str, Any] = httpx2.get(f"{url}/api/conversations/{cid}").json()
    return found


def in_view(page: Page, selector: str) -> bool:
    """Whether the element is wholly inside the window as it is scrolled now."""
    box = page.locator(selector).bounding_box()
    size = page.viewport_size
    assert size is not None
    return (
        box is not None
        and box["y"] >= 0
        and box["x"] >= 0
        and box["y"] + box["height"] <= size["height"]
        and box["x"] + box["width"] <= size["width"]
    )


def hold(page: Page, pattern: re.Pattern[str]) -> list[Route]:
    """Hold the page's requests to ``pattern`` (they wait, unanswered) until ``release``."""
    held: list[Route] = []

    def keep(route: Route) -> None:
        held.append(route)

    page.route(pattern, keep)
    return held


def release(page: Page, pattern: re.Pattern[str], held: list[Route]) -> None:
    """Let the held requests (and any later ones) through to the server."""
    for route in held:
        route.continue_()
    page.unroute(pattern)


ROOM = """() => {
  const box = document.getElementById('messages').getBoundingClientRect();
  const last = document.querySelector('#messages > li:last-child');
  const list = document.getElementById('messages');
  return {
    room: Math.min(box.bottom, innerHeight) - Math.max(box.top, 0),
    height: innerHeight,
    scrolled: scrollY,
    gap: list.scrollHeight - list.scrollTop - list.clientHeight,
    newest: last === null ? null : last.getBoundingClientRect().bottom - box.bottom,
  };
}"""
"""The messages' box on the screen: its visible height, the window's, how far the document is
scrolled, how far the list is from its end, and where the newest message ends below the box."""


def messages_room(page: Page) -> dict[str, float]:
    """What ``ROOM`` measures, now."""
    measured: dict[str, float] = page.evaluate(ROOM)
    return measured


def newest_in_view(page: Page) -> dict[str, float]:
    """Wait until the newest message's end is in view in the messages' box (the list at its
    end), as the page keeps it; what ``ROOM`` measures then."""
    deadline = time.monotonic() + TIMEOUT / 1000
    while True:
        measured = messages_room(page)
        if measured["gap"] <= 2 and (measured["newest"] is None or measured["newest"] <= 2):
            return measured
        assert time.monotonic() < deadline, f"the newest message is out of view: {measured}"
        page.wait_for_timeout(50)


def shown_in_the_messages(page: Page, item: Locator) -> bool:
    """Whether ``item`` begins inside the messages' visible box."""
    box = page.locator("#messages").bounding_box()
    found = item.bounding_box()
    assert box is not None
    return found is not None and box["y"] - 1 <= found["y"] < box["y"] + box["height"]
