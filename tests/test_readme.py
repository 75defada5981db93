"""The README's examples run as written (a README that lies is worse than none)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from segue.testing import FakeAnthropicServer
from segue.testing.anthropic_server import ErrorReply, MessageReply
from segue.testing.openai_server import FakeOpenAIServer, Reply

README = Path(__file__).resolve().parents[1] / "README.md"
README_TEXT = README.read_text(encoding="utf-8")


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)


def _run(
    code: str, tmp_path: Path, env: dict[str, str] | None = None, *, unset: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` as a user runs an example: a script of its own in ``tmp_path``, with this
    environment plus ``env`` and without ``unset``."""
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    inherited = {k: v for k, v in os.environ.items() if k != unset}
    return subprocess.run(  # noqa: S603  # our own interpreter on our own file
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        check=False,
        env={**inherited, **(env or {})},
    )


def _block(marker: str) -> str:
    return next(block for block in _python_blocks() if marker in block)


def test_embedding_example_runs_to_a_seeded_child(tmp_path: Path) -> None:
    embedding = _block("start_new_from")
    result = _run(embedding, tmp_path)
    assert result.returncode == 0, result.stderr
    # A library is quiet: the example's own two lines, and nothing on stderr.
    assert result.stderr == ""
    assert "transition" not in result.stdout, result.stdout
    assert "exhausted after" in result.stdout
    assert "summary: Continuation summary" in result.stdout
    assert re.search(r"continued in \w+ \(parent \w+\)", result.stdout)


def test_streaming_example_prints_the_reply_as_it_comes(tmp_path: Path) -> None:
    result = _run(_block("rt.stream("), tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    reply, meter = result.stdout.splitlines()
    assert reply.startswith('Answer 1 to "What is a context window?"')
    assert len(reply) == 400  # the scripted model's whole reply, streamed in pieces
    assert re.fullmatch(r"\[idle: [\d,]+ of 20,000 tokens, ok\]", meter)


def test_real_api_example_runs_against_a_compatible_server(tmp_path: Path) -> None:
    with FakeAnthropicServer(default=MessageReply(text="Because windows are finite.")) as server:
        env = {"ANTHROPIC_API_KEY": "sk-readme-test", "ANTHROPIC_BASE_URL": server.url}
        result = _run(_block("ANTHROPIC_API_KEY from the environment"), tmp_path, env)
        requests = server.message_requests()
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Because windows are finite.\n"
    assert result.stderr == ""
    assert (tmp_path / "chat.db").exists()
    assert requests[0].body["system"][0]["text"] == "Answer in one paragraph."


def test_openai_example_runs_against_a_compatible_server(tmp_path: Path) -> None:
    with FakeOpenAIServer(default=Reply(text="Because windows are finite.")) as server:
        env = {"OPENAI_API_KEY": "sk-readme-test", "OPENAI_BASE_URL": server.url}
        result = _run(_block("OpenAIModel(AsyncOpenAI()"), tmp_path, env)
        requests = server.model_requests()
    assert result.returncode == 0, result.stderr
    assert (result.stdout, result.stderr) == ("Because windows are finite.\n", "")
    assert (tmp_path / "chat.db").exists()
    assert requests[0].body["model"] == "gpt-4o"
    assert requests[0].path == "/v1/chat/completions"


def test_real_api_example_without_a_key_says_so_and_stores_nothing(tmp_path: Path) -> None:
    example = _block("ANTHROPIC_API_KEY from the environment")
    result = _run(example, tmp_path, unset="ANTHROPIC_API_KEY")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == "set ANTHROPIC_API_KEY first (nothing was stored or sent)\n"
    assert not (tmp_path / "chat.db").exists()


def test_real_api_example_reports_a_failed_conversation(tmp_path: Path) -> None:
    """A key the API refuses: the example says why and exits 1, not ``None`` and 0."""
    refused = ErrorReply(401, "authentication_error", "invalid x-api-key")
    with FakeAnthropicServer(default=refused) as server:
        env = {"ANTHROPIC_API_KEY": "sk-readme-bad", "ANTHROPIC_BASE_URL": server.url}
        result = _run(_block("ANTHROPIC_API_KEY from the environment"), tmp_path, env)
    assert result.returncode == 1, result.stdout
    assert result.stdout == ""
    assert result.stderr.startswith("the conversation failed (")
    assert "None" not in result.stderr


def test_error_reporting_example_prints_the_reply(tmp_path: Path) -> None:
    result = _run(_block("not sent: {error}"), tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.startswith('Answer 1 to "What is a context window?"')


def test_fastapi_example_serves_the_api_and_the_page_under_its_prefix(tmp_path: Path) -> None:
    served = _block("app.mount(") + (
        "\nimport httpx2\n"
        "from segue.testing import live_server\n\n"
        "with live_server(app) as url:\n"
        '    print(httpx2.get(f"{url}/segue/api/info").json()["offline"])\n'
        '    print(\'<base href="/segue/">\' in httpx2.get(f"{url}/segue/").text)\n'
        '    print(httpx2.post(f"{url}/segue/api/conversations", json={}).status_code)\n'
    )
    result = _run(served, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", "201"]
    assert (tmp_path / "chat.db").exists()


def test_test_client_example_serves_one_app_to_two_clients(tmp_path: Path) -> None:
    result = _run(_block("TestClient(app)"), tmp_path)
    assert result.returncode == 0, result.stderr
    assert (result.stdout, result.stderr) == ("two clients, one app\n", "")


def test_sub_agent_example_fails_typed_and_is_replaced(tmp_path: Path) -> None:
    result = _run(_block("SUB_AGENT ="), tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    stopped, replaced = result.stdout.splitlines()
    audited = re.fullmatch(r"the sub-agent audited (\d+) of 100 files: context_exhausted", stopped)
    assert audited is not None, stopped
    assert 0 < int(audited.group(1)) < 100  # it ran out partway: a replacement has work left
    assert re.fullmatch(r"a replacement took over with an empty window: \w+", replaced)


def test_control_example_compacts_with_the_pinned_message(tmp_path: Path) -> None:
    result = _run(_block("summary_prompt="), tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert re.fullmatch(r"generation 2; pinned: \d+ tokens\n", result.stdout)


def test_postgres_example_builds_stores_without_connecting(tmp_path: Path) -> None:
    result = _run(_block("PostgresStore.from_url"), tmp_path)
    assert result.returncode == 0, result.stderr
    assert (result.stdout, result.stderr) == ("", "")


RUN_BY_A_TEST = (
    "start_new_from",
    "rt.stream(",
    "ANTHROPIC_API_KEY from the environment",
    "logging.basicConfig",
    "transition(state",
    "AgentSdkModel",
    "not sent: {error}",
    "app.mount(",
    "SUB_AGENT =",
    "PostgresStore.from_url",
    "summary_prompt=",
    "OpenAIModel(AsyncOpenAI()",
    "TestClient(app)",
    "InMemorySpanExporter()",
    "export_conversation(newest)",
    "StreamingResponse(events()",
)
"""What names each Python block for the test that runs it."""


def test_streamed_route_example_answers_409_for_a_refused_message(tmp_path: Path) -> None:
    """The README's streamed FastAPI route: a turn streams as events; a message to a paused
    conversation is refused before any byte, as a 409 with the cause, not an empty 200."""
    result = _run(_block("StreamingResponse(events()"), tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.splitlines() == ["200 17 text events", "paused", "409 paused"]
    said = re.search(r"It prints `200 17 text events`, `paused`, then `409 paused`", README_TEXT)
    assert said is not None  # what the README says it prints


def test_tracing_example_prints_the_spans_of_a_turn(tmp_path: Path) -> None:
    result = _run(_block("InMemorySpanExporter()"), tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.strip() == "['chat claude-sonnet-4-6', 'segue.turn']"


def test_a_users_conversations_example_pages_deletes_and_moves_one(tmp_path: Path) -> None:
    result = _run(_block("export_conversation(newest)"), tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    said = "['Taxes', 'Moving house']\n['Tides'] None\nTrue idle"
    assert result.stdout.strip() == said  # what the README says it prints


def test_every_python_block_is_run_by_a_test() -> None:
    blocks = _python_blocks()
    named = [[marker for marker in RUN_BY_A_TEST if marker in block] for block in blocks]
    assert [len(markers) for markers in named] == [1] * len(blocks), named
    assert sorted(m for markers in named for m in markers) == sorted(RUN_BY_A_TEST)


def test_logging_example_is_valid_python(tmp_path: Path) -> None:
    result = _run(_block("logging.basicConfig"), tmp_path)
    assert result.returncode == 0, result.stderr


def test_core_example_prints_what_it_claims(tmp_path: Path) -> None:
    result = _run(_block("transition(state"), tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "awaiting_continuation"


def test_quickstart_commands_are_the_ones_ci_runs() -> None:
    text = README.read_text(encoding="utf-8")
    commands = re.search(r"```bash\n(.*?)```", text, re.DOTALL)
    assert commands is not None
    first, second = commands.group(1).strip().splitlines()[:2]
    assert first == 'pip install -e ".[dev]" && segue demo'
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert second in ci


def test_agent_sdk_example_runs_the_bundled_cli(tmp_path: Path) -> None:
    """The Claude Agent SDK example, against the fake server; quiet, as a library must be."""
    code = _block("AgentSdkModel") + "\nimport asyncio\n\nasyncio.run(migrate())\n"
    with FakeAnthropicServer(default=MessageReply(text="Migrated.")) as server:
        env = {
            "ANTHROPIC_API_KEY": "sk-readme-test",
            "ANTHROPIC_BASE_URL": server.url,
            "HOME": str(tmp_path),
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CODE_TMPDIR": str(tmp_path / "tmp"),
        }
        result = _run(code, tmp_path, env)
        requests = server.message_requests()
    assert result.returncode == 0, result.stderr
    assert (result.stdout, result.stderr) == ("", "")
    assert "Migrate the test suite to pytest." in str(requests[0].body["messages"])
    assert (tmp_path / "agents.db").exists()
