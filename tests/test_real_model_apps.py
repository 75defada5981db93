"""The real-model tier, as a person meets it: ``segue chat --base-url`` and ``segue serve
--base-url`` against llama.cpp's ``llama-server``, and the page driven in Chromium to the limit
with the real model (``SEGUE_UPDATE_SCREENSHOTS=1`` writes ``docs/screenshots/real-model-*``).

A local server takes any key; segue's OpenAI provider reads one from ``OPENAI_API_KEY`` (without
it, the scripted model answers offline), so the tests set a placeholder.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from playwright.sync_api import Browser, expect

import browsing
from cli_run import invoke, plain_output
from real_model import MODEL, REPLY_TOKENS, note
from segue.server.run import ServerConfig, build_app
from segue.testing import live_server
from segue.testing.llama_server import LlamaServer
from serving import segue_serve

pytestmark = pytest.mark.real_model
browser = browsing.browser
__all__ = ["browser"]  # a fixture

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "docs" / "screenshots"
PAGE_WINDOW = 1024
"""The window the page's form gives (the API takes 1,000 or more): a limit in ten turns."""


@pytest.fixture(autouse=True)
def _local_key(monkeypatch: pytest.MonkeyPatch) -> None:
    plain_output(monkeypatch, "OPENAI_BASE_URL", "ANTHROPIC_API_KEY")
    monkeypatch.setenv("OPENAI_API_KEY", "local")


def test_segue_chat_talks_to_the_local_server_and_shows_its_window(
    llama: LlamaServer, tmp_path: Path
) -> None:
    result = invoke(
        "chat",
        "--provider",
        "openai",
        "--base-url",
        llama.base_url,
        "--model",
        MODEL,
        "--db",
        str(tmp_path / "chat.db"),
        stdin="Say hello in three words.\n",
    )
    assert result.exit_code == 0, result.output
    assert "window 2,048 tokens, reported by the model's server" in result.stdout
    meter = re.search(r"([\d,]+) / 2,048\s+[\d.]+%\s+idle", result.stdout)
    assert meter is not None, result.stdout
    assert int(meter[1].replace(",", "")) == llama.slot_tokens() + 1  # the server's count


def test_segue_serve_answers_with_the_local_model(llama: LlamaServer, tmp_path: Path) -> None:
    with (
        segue_serve(
            "--provider",
            "openai",
            "--base-url",
            llama.base_url,
            "--model",
            MODEL,
            "--db",
            str(tmp_path / "serve.db"),
            env={"OPENAI_API_KEY": "local"},
        ) as url,
        httpx2.Client(base_url=url, timeout=300) as http,
    ):
        info = http.get("/api/info").json()
        assert info["offline"] is False
        assert info["model"] == MODEL
        created = http.post("/api/conversations", json={"max_output_tokens": REPLY_TOKENS})
        assert created.status_code == 201, created.text
        view = created.json()
        assert view["context_window"] == 2048
        turn = http.post(f"/api/conversations/{view['id']}/messages", json={"text": "Say hello."})
        assert turn.status_code == 200, turn.text
        assert "event: done" in turn.text
        after = http.get(f"/api/conversations/{view['id']}").json()
        assert after["phase"] == "idle"
        assert after["context_tokens"] == llama.slot_tokens() + 1


@pytest.fixture
def page_server(llama: LlamaServer, tmp_path: Path) -> Iterator[str]:
    """``segue serve``'s app over the real model, in this process, its conversations' replies
    and summaries kept short (``limits``: what new conversations get unless asked otherwise)."""
    config = ServerConfig(
        db=tmp_path / "page.db",
        provider="openai",
        api_key="local",
        base_url=llama.base_url,
        model=MODEL,
        limits={"max_output_tokens": REPLY_TOKENS, "retry_base_delay": 0.2},
    )
    with live_server(build_app(config)) as url:
        yield url


def test_the_page_reaches_the_limit_with_the_real_model(page_server: str, browser: Browser) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        page = context.new_page()
        page.set_default_timeout(300_000)
        expect.set_options(timeout=300_000)
        cid = browsing.new_conversation(page, page_server, window=PAGE_WINDOW, offline=False)
        for number in range(30):
            browsing.send(page, note(number))
            if browsing.state(page_server, cid)["phase"] != "idle":
                break
        found = browsing.state(page_server, cid)
        assert found["phase"] == "context_exhausted", found
        expect(page.get_by_role("button", name="Start a new conversation")).to_be_visible()
        if os.environ.get("SEGUE_UPDATE_SCREENSHOTS") == "1":
            page.screenshot(path=str(SHOTS / "real-model-limit-1280x800.png"))
    finally:
        expect.set_options(timeout=5_000)
        context.close()
