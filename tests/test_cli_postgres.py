"""The CLI against PostgreSQL: every command that reads a store takes ``--database-url`` (and
``SEGUE_DATABASE_URL``), as ``segue serve`` does, so a deployment on PostgreSQL is inspected,
paused, resumed and chatted with from the command line; a database without segue's tables is
refused, not given them; the password never shows.
"""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest

import clusters
from cli_run import invoke, one_error_line, plain_output
from segue import PostgresStore, Runtime
from segue.cli.demo import DEMO_MODEL
from segue.executor.models.offline import OfflineModel
from segue.testing.postgres import ThrowawayCluster

pytestmark = pytest.mark.slow
cluster = clusters.cluster  # one throwaway cluster for the module
_numbers = itertools.count()


@pytest.fixture
def url(cluster: ThrowawayCluster, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh database's conninfo, with the output as a CI log gets it and no key set."""
    plain_output(monkeypatch, "ANTHROPIC_API_KEY", "OPENAI_API_KEY", "SEGUE_DATABASE_URL")
    return cluster.create_database(f"cli_{next(_numbers)}")


def conversation_in(url: str, text: str) -> str:
    """A conversation answered once by the offline model, stored at ``url``; its id."""

    async def make() -> str:
        async with Runtime(store=PostgresStore(url), llm=OfflineModel()) as runtime:
            cid = (await runtime.create_conversation(model=DEMO_MODEL)).id
            await runtime.send(cid, text)
            return cid

    return asyncio.run(make())


def test_list_show_and_status_read_postgresql(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cid = conversation_in(url, "Plan the schema change.")
    listed = invoke("list", "--database-url", url)
    assert listed.exit_code == 0, listed.output
    assert cid[:8] in listed.stdout
    assert "Plan the schema change." in listed.stdout
    assert "dbname=cli_" in listed.stdout  # the store it read, named in the title
    shown = json.loads(invoke("show", cid[:8], "--database-url", url, "--json").stdout)
    assert shown["conversation"]["title"] == "Plan the schema change."
    assert [m["kind"] for m in shown["messages"]] == ["user", "assistant"]
    monkeypatch.setenv("SEGUE_DATABASE_URL", url)  # as segue serve reads it
    status = invoke("status", cid)
    assert status.exit_code == 0, status.output
    assert "continuations: 0 of at most 10" in status.stdout


def test_pause_resume_and_chat_write_to_postgresql(url: str) -> None:
    cid = conversation_in(url, "Start the migration.")
    paused = invoke("pause", cid, "--reason", "deploy window", "--database-url", url)
    assert paused.exit_code == 0, paused.output
    assert f"paused {cid}: snapshot v1 saved" in paused.stdout
    resumed = invoke("resume", cid, "--database-url", url)
    assert resumed.exit_code == 0, resumed.output
    assert f"resumed {cid} in session 2" in resumed.stdout
    chatted = invoke("chat", "--database-url", url, stdin="A new question.\n")
    assert chatted.exit_code == 0, chatted.output
    assert "offline: ANTHROPIC_API_KEY is not set" in chatted.stdout
    listed = json.loads(invoke("list", "--database-url", url, "--json").stdout)
    assert [c["title"] for c in listed] == ["A new question.", "Start the migration."]


def test_a_database_without_segues_tables_is_refused_and_left_alone(
    url: str, cluster: ThrowawayCluster
) -> None:
    for command in (["list"], ["status", "abc"], ["pause", "abc"]):
        refused = invoke(*command, "--database-url", url)
        assert refused.exit_code == 2
        assert "holds no segue store" in one_error_line(refused)
    import psycopg

    with psycopg.connect(url) as conn:
        tables = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
        assert tables.fetchone() == (0,)


def test_the_password_of_a_url_never_shows(url: str) -> None:
    unreachable = "postgresql://segue:hunter2@127.0.0.1:9/chat"
    refused = invoke("list", "--database-url", unreachable)
    assert refused.exit_code == 2
    line = one_error_line(refused)
    assert "hunter2" not in refused.output
    assert "segue:***@127.0.0.1:9" in line
