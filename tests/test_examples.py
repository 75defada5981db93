"""The examples run as a user runs them, and say what the README says they show."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from scripts import run_script

ROOT = Path(__file__).resolve().parent.parent


def test_the_subagent_example_recovers_from_a_typed_failure() -> None:
    result = run_script("examples/subagents.py", timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # the library is quiet
    lines = result.stdout.splitlines()
    assert lines[0] == "The coordinator started 6 sub-agents:"
    first, *narrower = lines[1:7]
    assert "pages 1-900" in first
    assert "failed with context_exhausted" in first
    assert all("answered" in line for line in narrower)
    assert "The coordinator is idle; its answer:" in lines
    assert "- Pages 801-900: safety warnings on p.801, p.898." in lines


def test_the_multi_user_backend_keeps_users_apart_with_nothing_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per-user lists, a streamed turn, deletion and export, on segue's public API alone."""
    monkeypatch.setenv("CHAT_DB", str(tmp_path / "chat.db"))
    spec = importlib.util.spec_from_file_location("multi_user", ROOT / "examples/multi_user.py")
    assert spec is not None
    assert spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    alice, bob = {"X-User": "alice"}, {"X-User": "bob"}
    with TestClient(example.app) as client:
        tides = client.post("/conversations?title=Tides", headers=alice).json()["id"]
        client.post("/conversations?title=Moons", headers=alice)
        client.post("/conversations?title=Bread", headers=bob)
        listed = client.get("/conversations", headers=alice).json()
        assert [c["title"] for c in listed["conversations"]] == ["Moons", "Tides"]
        assert [
            c["title"] for c in client.get("/conversations", headers=bob).json()["conversations"]
        ] == ["Bread"]
        streamed = client.post(f"/conversations/{tides}/messages?text=Why+tides%3F", headers=alice)
        assert streamed.status_code == 200
        assert "event: text" in streamed.text
        assert streamed.text.rstrip().splitlines()[-2] == "event: done"
        assert client.get(f"/conversations/{tides}/export", headers=bob).status_code == 404
        asked = client.post(f"/conversations/{tides}/messages?text=Mine%3F", headers=bob)
        assert asked.status_code == 404
        assert client.delete(f"/conversations/{tides}", headers=bob).status_code == 404
        document = client.get(f"/conversations/{tides}/export", headers=alice).json()
        assert "Why tides?" in json.dumps(document)
        assert client.delete(f"/conversations/{tides}", headers=alice).status_code == 204
        assert client.get(f"/conversations/{tides}/export", headers=alice).status_code == 404
        left = client.get("/conversations", headers=alice).json()["conversations"]
        assert [c["title"] for c in left] == ["Moons"]


def test_the_provider_context_example_compacts_and_clears_offline() -> None:
    """Claude's own compaction and context editing, on the fake Messages API: a compaction in
    the call that answered (no summary request of segue's), and tool uses cleared with the
    meter following."""
    result = run_script("examples/provider_context.py", timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # the library is quiet
    compacted, after, cleared, meter = result.stdout.splitlines()
    assert re.fullmatch(r"turn \d: Claude compacted the context \(generation 2\)", compacted)
    measured = re.fullmatch(
        r"after it: ([\d,]+) of 100,000 tokens, idle; the compaction wrote ([\d,]+) tokens, "
        r"in the call that answered",
        after,
    )
    assert measured is not None, after
    assert int(measured.group(1).replace(",", "")) < 60_000  # below the threshold it passed
    assert int(measured.group(2).replace(",", "")) > 0
    edited = re.fullmatch(r"Claude cleared (\d+) old tool use\(s\), ([\d,]+) input tokens", cleared)
    assert edited is not None, cleared
    assert int(edited.group(1)) > 0
    reads = re.fullmatch(
        r"the meter reads ([\d,]+) tokens: the cleared ones are not counted", meter
    )
    assert reads is not None, meter
    assert int(reads.group(1).replace(",", "")) < 10_000  # uncleared: four logs of ~4,500 tokens
