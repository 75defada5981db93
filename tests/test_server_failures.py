"""A conversation that failed for a reason the adapter did not recognise goes on in a new one
through the API (``POST .../children``), carrying its last exchanges as plain text or nothing,
as its user chooses; the old one keeps its failure's reason. And the state's view says how
many continuations a conversation made, and the bounds it runs within.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from api import create, error, send
from segue import LlmCallError, LlmReply, LlmRequest, Runtime, ScriptedModel, SqliteStore
from segue.server import create_app
from segue.testing import live_server

pytestmark = pytest.mark.slow
UNRECOGNISED = "the provider answered 400: a new kind of refusal nobody knew of"
FAIL = "(fail now)"


def answer(request: LlmRequest) -> LlmReply:
    """Every request answered, but a turn whose message asks to fail, which fails with an
    error no rule recognises (the adapter's ``LlmCallError``, neither retryable nor an
    overflow)."""
    last = next((m.text for m in reversed(request.messages) if m.kind == "user"), "")
    if request.purpose == "turn" and FAIL in last:
        raise LlmCallError(UNRECOGNISED, fatal=True, status_code=400)
    return LlmReply(text=f"Noted: {last}")


@pytest.fixture
def http(tmp_path: Path) -> Iterator[httpx2.Client]:
    model = ScriptedModel(window=24_000, default=answer)
    runtime = Runtime(store=SqliteStore(tmp_path / "failed.db"), llm=model)
    with live_server(create_app(runtime)) as url, httpx2.Client(base_url=url, timeout=60) as c:
        yield c


def failed_conversation(http: httpx2.Client) -> str:
    cid: str = create(http)["id"]
    send(http, cid, "Remember the number 41.")
    send(http, cid, f"What was it? {FAIL}")
    return cid


def test_a_failed_conversation_goes_on_with_its_last_turns_or_nothing(
    http: httpx2.Client,
) -> None:
    cid = failed_conversation(http)
    failed = http.get(f"/api/conversations/{cid}").json()
    assert (failed["phase"], failed["error_kind"]) == ("failed", "llm_error")
    assert UNRECOGNISED in failed["error_message"]

    child = http.post(
        f"/api/conversations/{cid}/children", json={"seed_with_summary": False, "recent_turns": 3}
    )
    assert child.status_code == 200, child.text
    carried = http.get(f"/api/conversations/{child.json()['id']}/messages").json()
    assert [(m["kind"], m["text"]) for m in carried] == [
        ("user", "Remember the number 41."),
        ("assistant", "Noted: Remember the number 41."),
        ("user", f"What was it? {FAIL}"),  # what the user was asking when it failed
    ]
    assert child.json()["parent_id"] == cid
    assert child.json()["title"] == "Remember the number 41."

    after = http.get(f"/api/conversations/{cid}").json()
    assert after["child_id"] == child.json()["id"]
    assert (after["phase"], after["error_message"]) == ("failed", failed["error_message"])
    again = http.post(f"/api/conversations/{cid}/children", json={"recent_turns": 0})
    assert again.json()["id"] == child.json()["id"]  # its one child, however asked

    other = failed_conversation(http)
    empty = http.post(f"/api/conversations/{other}/children", json={"seed_with_summary": False})
    assert http.get(f"/api/conversations/{empty.json()['id']}/messages").json() == []


def test_recent_turns_are_bounded(http: httpx2.Client) -> None:
    cid = failed_conversation(http)
    for wrong in (-1, 101, "all"):
        refused = http.post(f"/api/conversations/{cid}/children", json={"recent_turns": wrong})
        assert "recent_turns" in error(refused, 422, "invalid_request")


def test_the_state_shows_its_continuations_and_bounds(http: httpx2.Client) -> None:
    body = {
        "behavior": "compact_in_place",
        "max_continuations": 3,
        "max_attempts": 2,
        "max_tool_rounds": 7,
        "retry_base_delay": 0.5,
        "retry_max_delay": 4.0,
    }
    made = create(http, **body)
    assert {name: made[name] for name in body} == body
    assert made["continuations"] == 0
    send(http, made["id"], "Hello.")  # answered by the script's default, not the failure
    compacted = http.post(f"/api/conversations/{made['id']}/continue", json={})
    assert compacted.json()["continuations"] == 1
