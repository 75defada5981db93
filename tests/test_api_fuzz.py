"""The REST API fuzzed from its own OpenAPI schema with schemathesis (built on hypothesis): every
operation, with valid and invalid input, against a real server on each store (a SQLite file; a
PostgreSQL database on a throwaway cluster), a fixed seed and a bounded budget. No answer may be
a 5xx, and every answer must be one the schema documents (status, content type, body).

The path's ``conversation_id`` is, more often than chance would make it, one of the server's
own conversations (idle with messages, read-only at its limit, paused, failed), so that what
is fuzzed reaches past the 404 into every state's rules. What deletes is pointed at
conversations made to be deleted (labelled ``fuzz: disposable``): a ``DELETE`` at one of
them, a purge at that label only, so the conversations in every state stay for the rest.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance

import clusters
from api import create, send
from segue import LlmCallError, LlmReply, LlmRequest, Runtime, ScriptedModel, SqliteStore
from segue.executor.stores.postgres import PostgresStore
from segue.executor.tools import ToolRegistry
from segue.server import create_app
from segue.testing import live_server
from segue.testing.postgres import ThrowawayCluster

pytestmark = pytest.mark.slow
cluster = clusters.cluster  # one throwaway cluster for the module
DISPOSABLE = {"fuzz": "disposable"}
"""The label of the conversations the fuzzing may delete."""
EXAMPLES = 50
"""Examples per operation and per store (about 20 s of requests on each, well within 2 min)."""
FAIL = "(fail now)"
_numbers = itertools.count()


def answer(request: LlmRequest) -> LlmReply:
    """The scripted model's answers, but a turn asking to fail fails for good."""
    last = next((m.text for m in reversed(request.messages) if m.kind == "user"), "")
    if request.purpose == "turn" and FAIL in last:
        raise LlmCallError("a refusal no rule recognises", fatal=True, status_code=400)
    return LlmReply(text=f"Noted: {last[:200]}")


def conversations_in_every_state(url: str) -> list[str]:
    """Conversations the fuzzing reaches into: idle, read-only at its limit, paused, failed."""
    with httpx2.Client(base_url=url, timeout=60) as http:
        idle = create(http)["id"]
        send(http, idle, "Hello.")
        limit = create(http)["id"]
        send(http, limit, "Summarise this.")
        assert http.post(f"/api/conversations/{limit}/continue", json={}).status_code == 200
        paused = create(http)["id"]
        send(http, paused, "Start.")
        assert http.post(f"/api/conversations/{paused}/pause", json={}).status_code == 200
        failed = create(http)["id"]
        send(http, failed, f"Go. {FAIL}")
        exhausted = http.get(f"/api/conversations/{limit}").json()["phase"]
        assert exhausted == "context_exhausted", exhausted
        return [idle, limit, paused, failed]


def disposable(url: str, count: int = 20) -> list[str]:
    """Conversations the fuzzing may delete, one with a turn behind it."""
    with httpx2.Client(base_url=url, timeout=60) as http:
        ids = [create(http, metadata=DISPOSABLE)["id"] for _ in range(count)]
        send(http, ids[0], "Hello.")
        return ids


def schema_of(url: str) -> Any:
    loaded = schemathesis.openapi.from_url(f"{url}/openapi.json")
    ids = conversations_in_every_state(url)
    deletable = disposable(url)

    @loaded.hook
    def map_case(context: Any, case: schemathesis.Case[Any]) -> schemathesis.Case[Any]:
        # Every case, from the schema's examples as from generation: what deletes is pointed
        # at the disposable conversations only.
        operation = case.operation
        parameters = case.path_parameters
        # A watch stream on a real conversation never ends (it waits for the next turn): it is
        # fuzzed on ids that name none, and read whole in the stream tests.
        watching = operation.path.endswith("/events")
        if parameters and "conversation_id" in parameters and not watching:
            among = deletable if operation.method.upper() == "DELETE" else ids
            chosen = hash(str(parameters)) % (len(among) + 1)
            if chosen < len(among):
                parameters["conversation_id"] = among[chosen]
        if operation.path == "/api/purge" and isinstance(case.body, dict):
            case.body = {**case.body, "metadata": dict(DISPOSABLE)}
        return case

    return loaded


def app_on(store: SqliteStore | PostgresStore) -> Any:
    tools = ToolRegistry()

    @tools.tool(description="Look a topic up.")
    async def lookup(tool_input: dict[str, object]) -> str:
        return f"Notes on {tool_input.get('query')}."

    model = ScriptedModel(window=24_000, default=answer)
    return create_app(Runtime(store=store, llm=model, tools=tools))


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def api(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    store: SqliteStore | PostgresStore
    if request.param == "sqlite":
        store = SqliteStore(tmp_path_factory.mktemp("fuzz") / "fuzz.db")
    else:
        cluster: ThrowawayCluster = request.getfixturevalue("cluster")
        store = PostgresStore(cluster.create_database(f"fuzz_{next(_numbers)}"))
    with live_server(app_on(store)) as url:
        yield schema_of(url)


schema = schemathesis.pytest.from_fixture("api")


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    derandomize=True,  # the same examples every run: a failure found once is found again
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_answer_is_a_server_error_or_off_the_schema(case: schemathesis.Case[Any]) -> None:
    # Left out: a schema-valid request may still be refused, rightly, by the conversation's
    # state (409: continue on a paused one) or by a rule across fields no JSON Schema states
    # (a temperature with extended thinking, 422): both are documented answers.
    case.call_and_validate(timeout=60, excluded_checks=[positive_data_acceptance])


def test_the_fuzzed_paths_reach_every_state(tmp_path: Path) -> None:
    """The conversations the fuzzing is pointed at are in the states it means to reach."""
    with live_server(app_on(SqliteStore(tmp_path / "states.db"))) as url:
        ids = conversations_in_every_state(url)
        phases = [httpx2.get(f"{url}/api/conversations/{cid}").json()["phase"] for cid in ids]
    assert phases == ["idle", "context_exhausted", "paused", "failed"]
