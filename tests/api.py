"""Talking to segue's server in tests as a client does: JSON in, the API's errors and the
Server-Sent Events of a turn out."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
from fastapi import FastAPI

from gated import HOLD_AT_MOST, Gated
from segue import Runtime, SqliteStore
from segue.server import create_app

Event = tuple[str, dict[str, Any]]


def sse(response: httpx2.Response) -> list[Event]:
    """The events of a text/event-stream body: (event name, data as JSON)."""
    events: list[Event] = []
    for block in response.text.replace("\r\n", "\n").split("\n\n"):
        name, data = "message", []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
        if data:
            events.append((name, json.loads("\n".join(data))))
    return events


def create(http: httpx2.Client, **body: Any) -> dict[str, Any]:
    response = http.post("/api/conversations", json=body)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


def send(http: httpx2.Client, conversation_id: str, text: str) -> list[Event]:
    response = http.post(f"/api/conversations/{conversation_id}/messages", json={"text": text})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return sse(response)


@contextlib.contextmanager
def held_turn(http: httpx2.Client, cid: str, model: Gated) -> Iterator[list[Event]]:
    """A turn sent from another thread. Inside the block ``model`` has its request and holds
    it; leaving the block lets it answer and waits for the turn to end, whose events are
    then in the list."""
    events: list[Event] = []
    sending = threading.Thread(target=lambda: events.extend(send(http, cid, "A long answer.")))
    sending.start()
    try:
        assert model.asked.wait(HOLD_AT_MOST), "the model was never asked"
        yield events
    finally:
        model.gate.set()
        sending.join(timeout=HOLD_AT_MOST)


def gated_app(db: Path) -> tuple[FastAPI, Gated]:
    """The server over a SQLite file at ``db``, its model holding its first answer."""
    model = Gated()
    return create_app(Runtime(store=SqliteStore(db), llm=model)), model


def error(response: httpx2.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) - {"field"} == {"error", "message"}  # an import's names the field
    assert body["error"] == code
    message: str = body["message"]
    return message
