"""The page, driven in real headless Chromium by Playwright, against the real server (uvicorn on
a free port, a real SQLite store, the offline scripted model): what a person sees and does near
the limit. The meter moving through 80% and 90%, the warning and the manual trigger, the reply
streaming in and tools running, the exhausted banner with the input disabled and the seeded
child opened from it, pause and resume with the snapshot list, a failed sub-agent's typed error,
a reload in the middle of a reply losing nothing, the keyboard, and a reply full of HTML staying
text.

The browser is Debian's ``chromium`` (Playwright's own download cannot work offline); when it is
missing and this runs as root on a Debian-like system, it is installed with apt-get, else the
test fails saying how to install it. ``SEGUE_UPDATE_SCREENSHOT=1`` also writes the screenshot
to ``docs/screenshot.png`` for the README.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from segue.server.run import ServerConfig, build_app
from segue.testing import live_server

pytestmark = pytest.mark.slow

ARGS = [
    "--no-sandbox",  # root in a container has no user namespaces for the sandbox
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "screenshot.png"
TIMEOUT = 20_000  # ms for anything the page waits on


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
        launched = playwright.chromium.launch(executable_path=chromium(), args=ARGS)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server as ``segue serve`` runs it without a key, its replies streaming quickly."""
    db = tmp_path_factory.mktemp("browser") / "page.db"
    with live_server(build_app(ServerConfig(db=db, chunk_delay=0.002))) as url:
        yield url


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1100, "height": 900})
    context.set_default_timeout(TIMEOUT)
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    context.close()
    assert errors == []  # no uncaught error in the page's script


def new_conversation(page: Page, url: str, *, behavior: str | None = None, window: int) -> str:
    """Create a conversation with the home page's form; its id (the page opens it)."""
    page.goto(f"{url}/")
    expect(page.locator("#offline")).to_be_visible()  # no key: the page says so
    if behavior is not None:
        page.get_by_label("Behaviour at the limit").select_option(behavior)
    page.get_by_label("Context window (tokens, optional)").fill(str(window))
    page.get_by_role("button", name="New conversation").click()
    page.wait_for_url(re.compile(r"/c/[0-9a-f]{32}$"))
    return page.url.rsplit("/", 1)[1]


def send(page: Page, text: str) -> None:
    """Type and send a message, then wait until the turn is over (the input is usable again
    or the conversation can no longer take input)."""
    page.get_by_label("Your message").fill(text)
    page.get_by_role("button", name="Send").click()
    turn_over(page)


def turn_over(page: Page) -> None:
    """Wait until no turn runs (the message list is no longer ``aria-busy``)."""
    expect(page.get_by_role("list", name="Messages")).to_have_attribute("aria-busy", "false")


def meter(page: Page) -> tuple[int, str]:
    """The meter's value and level class."""
    element = page.get_by_role("meter", name="Context window used")
    value = int(element.get_attribute("aria-valuenow") or "0")
    classes = element.get_attribute("class") or ""
    found = re.search(r"level-(ok|warning|critical)", classes)
    assert found is not None
    return value, found[1]


def stored(url: str, cid: str) -> list[dict[str, object]]:
    messages: list[dict[str, object]] = httpx2.get(f"{url}/api/conversations/{cid}/messages").json()
    return messages


# --------------------------------------------------------------------------- near the limit


def test_the_meter_the_warning_the_limit_and_the_seeded_child(page: Page, server: str) -> None:
    parent = new_conversation(page, server, window=3_000)
    readings: list[tuple[int, str]] = []
    for turn in range(1, 30):
        send(page, f"Tell me more, part {turn}.")
        readings.append(meter(page))
        if page.get_by_role("status").filter(has_text="context limit").is_visible():
            break
        if readings[-1][1] == "warning":
            warning = page.locator("#warning")
            expect(warning).to_be_visible()
            expect(warning).to_contain_text("% full")
            expect(
                page.get_by_role("button", name="Continue in a new conversation")
            ).to_be_enabled()
    values = [value for value, _ in readings]
    assert values == sorted(values), readings  # it only fills up
    levels = [level for _, level in readings]
    assert "warning" in levels, readings
    assert levels[-1] == "critical", readings
    assert values[-1] >= 90
    assert all((v >= 80) == (lv != "ok") for v, lv in readings), readings
    expect(page.get_by_text(re.compile(r"^\d+%$"))).to_have_text(f"{values[-1]}%")

    banner = page.get_by_role("status").filter(has_text="context limit")
    expect(banner).to_contain_text("Continuation summary")
    expect(page.locator("#warning")).to_be_hidden()
    message_box = page.get_by_label("Your message")
    expect(message_box).to_be_disabled()
    expect(page.locator("#input-reason")).to_contain_text("read-only")
    expect(page.get_by_role("button", name="Send")).to_be_disabled()
    if os.environ.get("SEGUE_UPDATE_SCREENSHOT") == "1":
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(SCREENSHOT), full_page=False)

    page.get_by_role("button", name="Start a new conversation").click()
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
    forward = page.get_by_role("link", name="Continued in a new conversation")
    expect(forward).to_have_attribute("href", f"/c/{child}")


def test_the_manual_trigger_and_a_child_without_the_summary(page: Page, server: str) -> None:
    parent = new_conversation(page, server, window=3_000)
    for turn in range(1, 30):
        send(page, f"Part {turn}.")
        if meter(page)[1] == "warning":
            break
    else:
        pytest.fail("the warning never came")
    page.get_by_role("button", name="Continue in a new conversation").click()
    expect(page.get_by_role("status").filter(has_text="context limit")).to_be_visible()
    page.get_by_label("Start without the summary").check()
    page.get_by_role("button", name="Start a new conversation").click()
    page.wait_for_url(lambda address: not address.endswith(parent))
    expect(
        page.get_by_role("link", name="Continued from the previous conversation")
    ).to_be_visible()
    expect(page.locator("#messages li")).to_have_count(0)  # not seeded


def test_a_failed_sub_agent_shows_its_typed_error(page: Page, server: str) -> None:
    new_conversation(page, server, behavior="intentionally_unhandled", window=3_000)
    for turn in range(1, 30):
        send(page, f"Work item {turn}.")
        if page.locator("#failed").is_visible():
            break
    failed = page.get_by_role("alert").filter(has_text="This conversation failed")
    expect(failed).to_contain_text("context_exhausted")


# --------------------------------------------------------------------------- a turn


def test_the_reply_streams_in_and_tools_show_as_they_run(page: Page, server: str) -> None:
    cid = new_conversation(page, server, window=200_000)
    page.get_by_label("Your message").fill("Stream this, please.")
    page.get_by_role("button", name="Send").click()
    streaming = page.locator("#messages li.streaming .text").last
    expect(streaming).not_to_have_text("")
    assert len(streaming.inner_text()) < 1_200  # seen while it is written
    turn_over(page)
    page.evaluate(  # remember every tool line the page shows while turns run
        """() => { window.toolLines = [];
        new MutationObserver(() => document.querySelectorAll('#messages li.tool').forEach(
          (li) => window.toolLines.push(li.textContent))).observe(
          document.getElementById('messages'),
          {childList: true, subtree: true, characterData: true}); }"""
    )
    for turn in range(3):  # the scripted model calls its tool every third turn
        send(page, f"And more {turn}.")
    lines = page.evaluate("window.toolLines")
    assert any(line.startswith("Running lookup(") for line in lines), lines
    assert any(line.startswith("lookup finished: Notes on") for line in lines), lines
    expect(
        page.locator("#messages li.assistant").filter(has_text="Called lookup(")
    ).not_to_have_count(0)
    replies = [m["text"] for m in stored(server, cid) if m["kind"] == "assistant" and m["text"]]
    shown = page.locator("#messages li.assistant .text").all_inner_texts()
    assert [text for text in shown if text] == replies


def test_a_reload_in_the_middle_of_a_reply_loses_nothing(browser: Browser, tmp_path: Path) -> None:
    slow = build_app(ServerConfig(db=tmp_path / "slow.db", chunk_delay=0.04))
    with live_server(slow) as url:
        context = browser.new_context()
        context.set_default_timeout(TIMEOUT)
        page = context.new_page()
        cid = new_conversation(page, url, window=200_000)
        page.get_by_label("Your message").fill("A long answer, please.")
        page.get_by_role("button", name="Send").click()
        expect(page.locator("#messages li.streaming .text").last).not_to_have_text("")
        page.reload()
        expect(page.locator("#input-reason")).to_contain_text("busy")  # the turn goes on
        expect(page.get_by_label("Your message")).to_be_enabled()  # until it is over
        reply = [m["text"] for m in stored(url, cid) if m["kind"] == "assistant"]
        assert len(reply) == 1
        assert len(str(reply[0])) == 1_200
        expect(page.locator("#messages li.user")).to_have_count(1)
        expect(page.locator("#messages li.assistant .text")).to_have_text(str(reply[0]))
        context.close()


def test_pause_resume_and_the_snapshot_list(page: Page, server: str) -> None:
    cid = new_conversation(page, server, window=200_000)
    send(page, "Start the job.")
    page.get_by_role("button", name="Pause").click()
    expect(page.get_by_role("status").filter(has_text="paused")).to_contain_text(
        "paused from the page"
    )
    expect(page.get_by_label("Your message")).to_be_disabled()
    expect(page.locator("#input-reason")).to_contain_text("Resume it")
    rows = page.get_by_role("table").locator("tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("paused from the page")
    expect(rows.first.locator("td").nth(3)).to_have_text("1")  # the session
    page.get_by_role("button", name="Resume").click()
    expect(page.get_by_label("Your message")).to_be_enabled()
    expect(page.locator("#paused")).to_be_hidden()
    assert httpx2.get(f"{server}/api/conversations/{cid}").json()["session"] == 2


def test_the_keyboard_alone_sends_and_html_stays_text(page: Page, server: str) -> None:
    new_conversation(page, server, window=200_000)
    for _ in range(20):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.id") == "text":
            break
    else:
        pytest.fail("Tab never reached the message box")
    hostile = '<img src=x onerror="window.pwned=1"><b id="bold">bold</b>'
    page.keyboard.type(hostile)
    page.keyboard.press("Control+Enter")
    page.wait_for_function("() => document.querySelectorAll('#messages li.assistant').length > 0")
    page.wait_for_function("() => !document.querySelector('.streaming')")
    expect(page.locator("#messages li.user .text")).to_have_text(hostile)
    assert page.evaluate("window.pwned") is None
    assert page.locator("#bold").count() == 0
    assert page.locator("#messages img").count() == 0
    for role, name in [
        ("button", "Send"),
        ("button", "Pause"),
        ("button", "Resume"),
        ("button", "Cancel the turn"),
        ("meter", "Context window used"),
        ("textbox", "Your message"),
    ]:
        expect(page.get_by_role(role, name=name)).to_have_count(1)  # type: ignore[arg-type]
