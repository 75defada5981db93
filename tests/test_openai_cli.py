"""``segue chat`` and ``segue serve`` with ``--provider openai``, run for real against the fake
OpenAI server: the key from ``OPENAI_API_KEY``, the server from ``--base-url`` or
``OPENAI_BASE_URL``, the model's window from segue's table (gpt-4o: 128,000)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from typer.testing import Result

import cli_run
from cli_run import invoke, one_error_line, plain_output
from segue.testing.openai_server import ErrorReply, FakeOpenAIServer, Reply, Usage
from serving import free_port, segue_serve

KEY = "sk-openai-cli-test-NEVER-PRINTED-0123456789"


@pytest.fixture(autouse=True)
def _plain_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    plain_output(monkeypatch, "OPENAI_BASE_URL", "ANTHROPIC_API_KEY")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    reply = Reply(text="Hello from the fake OpenAI API.", usage=Usage(1_000, 5, cached_tokens=600))
    with FakeOpenAIServer(default=reply) as fake:
        yield fake


def chat(server: FakeOpenAIServer, db: Path, stdin: str) -> Result:
    """``segue chat --provider openai`` against the fake, typing ``stdin``."""
    return cli_run.chat(server, db, stdin, "--provider", "openai")


def test_chat_with_the_openai_provider_prints_each_reply_and_the_meter(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    result = chat(server, tmp_path / "chat.db", "hello there\nand again\n")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("Hello from the fake OpenAI API.") == 2
    assert "gpt-4o" in result.stdout  # the provider's default model
    # 1,000 prompt tokens (600 of them cached, counted once) + 5: on gpt-4o's 128,000.
    assert len(re.findall(r"1,005 / 128,000\s+0\.7%\s+idle", result.stdout)) == 2  # floored
    sent = [r.body for r in server.model_requests()]
    assert [r.path for r in server.model_requests()] == ["/v1/chat/completions"] * 2
    assert "hello there" in json.dumps(sent[0]["messages"])
    assert sent[1]["model"] == "gpt-4o"
    for request in server.model_requests():  # the key from the environment was sent
        assert request.headers["authorization"] == f"Bearer {KEY}"
    assert KEY not in result.output


def test_the_model_name_tells_the_provider_and_openai_base_url_is_read(
    server: FakeOpenAIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    result = invoke(
        "chat", "--model", "gpt-4o-mini", "--db", str(tmp_path / "chat.db"), stdin="hi\n"
    )
    assert result.exit_code == 0, result.output
    assert "Hello from the fake OpenAI API." in result.stdout
    assert server.model_requests()[0].body["model"] == "gpt-4o-mini"


def test_a_refused_key_is_one_line_that_names_the_variable_never_the_key(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    def refuse(_body: object) -> ErrorReply:
        return ErrorReply(401, f"Incorrect API key provided: {KEY}.", code="invalid_api_key")

    server.default = refuse  # the model is known (GET /v1/models/gpt-4o), the key refused
    result = chat(server, tmp_path / "chat.db", "hello\n")
    assert result.exit_code == 1
    line = one_error_line(result)
    assert "authentication failed" in line
    assert "OPENAI_API_KEY" in line
    assert KEY not in result.output


def test_an_unknown_provider_is_a_setup_error(tmp_path: Path) -> None:
    result = invoke("chat", "--provider", "mistral", "--db", str(tmp_path / "c.db"), stdin="")
    assert result.exit_code == 2
    assert "unknown provider 'mistral'" in one_error_line(result)


@pytest.mark.slow
def test_serve_with_the_openai_provider_answers_through_the_openai_client(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    segue = shutil.which("segue")
    assert segue is not None, "the console script is not installed (pip install -e .)"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "COLUMNS")}
    command = [
        segue,
        "serve",
        "--provider",
        "openai",
        "--base-url",
        server.url,
        "--db",
        str(tmp_path / "serve.db"),
        "--port",
        str(port),
    ]
    child = subprocess.Popen(  # noqa: S603  # the installed console script, no shell
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert child.poll() is None, child.communicate()
                assert time.monotonic() < deadline, "segue serve did not start"
                time.sleep(0.05)
        with httpx2.Client(base_url=url, timeout=30) as http:
            info = http.get("/api/info").json()
            assert (info["offline"], info["model"]) == (False, "gpt-4o")
            created = http.post("/api/conversations", json={})
            assert created.status_code in (200, 201), created.text
            conversation = created.json()
            assert conversation["model"] == "gpt-4o"
            assert conversation["context_window"] == 128_000
            turn = http.post(
                f"/api/conversations/{conversation['id']}/messages", json={"text": "Hello?"}
            )
            assert turn.status_code == 200, turn.text
            assert "Hello from the fake OpenAI API." in turn.text
        assert [r.path for r in server.model_requests()] == ["/v1/chat/completions"]
    finally:
        child.terminate()
        out, err = child.communicate(timeout=30)
    assert b"gpt-4o (OpenAI API)" in out, out + err
    assert KEY.encode() not in out + err


@pytest.mark.slow
def test_serve_with_the_openai_provider_and_no_key_is_offline(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No ``OPENAI_API_KEY``: the offline scripted model answers, as without Anthropic's key."""
    monkeypatch.delenv("OPENAI_API_KEY")
    with (
        segue_serve("--provider", "openai", "--db", str(tmp_path / "offline.db")) as url,
        httpx2.Client(base_url=url, timeout=30) as http,
    ):
        info = http.get("/api/info").json()
        assert (info["offline"], info["model"]) == (True, "gpt-4o")
        cid = http.post("/api/conversations", json={}).json()["id"]
        turn = http.post(f"/api/conversations/{cid}/messages", json={"text": "Hello?"})
        assert turn.status_code == 200, turn.text
        assert "event: done" in turn.text


@pytest.mark.slow
@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_chat_and_serve_without_a_key_are_offline_alike(
    provider: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without the provider's key, both go offline with the same line, which says the server
    at ``--base-url`` is not the one answering."""
    for variable in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    gateway = "http://127.0.0.1:9/v1"
    chatted = invoke(
        "chat",
        "--provider",
        provider,
        "--base-url",
        gateway,
        "--db",
        str(tmp_path / "c.db"),
        stdin="hello\n",
    )
    assert chatted.exit_code == 0, chatted.output
    said: list[str] = []
    with segue_serve(
        "--provider", provider, "--base-url", gateway, "--db", str(tmp_path / "s.db"), said=said
    ) as url:
        assert httpx2.get(f"{url}/api/info").json()["offline"] is True
    offline = re.compile(r"^offline:.*?\)$", re.MULTILINE | re.DOTALL)
    found = [offline.search(output) for output in (chatted.stdout, said[0])]
    lines = [" ".join(one[0].split()) if one else "" for one in found]  # wrapped at 80 columns
    variable = "ANTHROPIC_API_KEY" if provider == "anthropic" else "OPENAI_API_KEY"
    assert lines[0] == lines[1]
    assert lines[0].startswith(f"offline: {variable} is not set, so the scripted model answers")
    assert f"not the server at {gateway}" in lines[0]
