"""The create form's choice of how the limit's requests are sent (REQ-SEG-055), in real
Chromium: chosen on the page, kept on the conversation, and seen on the limit's request as each
provider's fake API received it (the turn's tools still callable, the instruction last)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

import backends
import browsing
from backends import PROVIDERS, Backend
from browsing import Tabs, send, state, turn_over
from segue.testing import live_server
from segue.testing.conformance import Said

pytestmark = pytest.mark.slow
browser, tabs = browsing.browser, browsing.tabs


@pytest.fixture(params=PROVIDERS)
def near_the_limit(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Backend]]:
    """The server with a key and the demo's tools; every answer fills 83% of a 3,000-token
    window (past the warning, short of the threshold)."""
    with backends.backend(request.param) as fake:
        fake.default(Said(text="Noted.", prompt=2_500, output=5))
        with live_server(fake.app(tmp_path / "reuse.db", tools=True)) as url:
            yield url, fake


def test_the_create_forms_summary_request_reaches_the_limits_request(
    near_the_limit: tuple[str, Backend], tabs: Tabs
) -> None:
    url, fake = near_the_limit
    page = tabs.open()
    page.goto(f"{url}/")
    page.get_by_label("Context window (tokens, optional)").fill("3000")
    page.get_by_text("At the limit (advanced)").click()
    choice = page.get_by_label("How the summary is asked")
    expect(choice).to_have_value("tool_less")  # the server's own
    choice.select_option("reuse_prefix")
    page.get_by_role("button", name="New conversation").click()
    page.wait_for_url(re.compile(r"/c/[0-9a-f]{32}$"))
    turn_over(page)
    parent = page.url.rsplit("/", 1)[1]
    assert state(url, parent)["summary_request"] == "reuse_prefix"
    send(page, "Plan the schema change.")
    expect(page.locator("#warning")).to_be_visible()
    page.get_by_role("button", name="Continue in a new conversation").click()
    page.wait_for_url(lambda address: not address.endswith(parent))
    turn_over(page)
    turn, limit = fake.sent()
    assert turn.callable_tools
    assert (limit.tools, limit.callable_tools, limit.system) == (turn.tools, True, turn.system)
    assert limit.turns[: len(turn.turns) - 1] == turn.turns[:-1]
    assert "continuation summary" in limit.turns[-1].text
