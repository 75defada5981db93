"""What ``segue serve`` is told reaches its conversations: the bounds new conversations get
(a request's own win), the git state a pause records (the repository it runs in, or
``repo``), and the offline model's replies sized so that a small window shows its warning
before its limit.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import httpx2
import pytest

from api import create, send
from repos import dirty_repository, needs_git
from segue import ContextExhaustionBehavior
from segue.server.run import ServerConfig, build_app
from segue.testing import live_server

pytestmark = pytest.mark.slow


def test_the_servers_bounds_apply_unless_the_request_sets_its_own(tmp_path: Path) -> None:
    limits = {"max_attempts": 2, "max_continuations": 1, "retry_base_delay": 0.25}
    config = ServerConfig(db=tmp_path / "limits.db", chunk_delay=0.0, limits=limits)
    with live_server(build_app(config)) as url, httpx2.Client(base_url=url) as http:
        assert http.get("/api/info").json()["limits"] == limits
        plain = create(http)
        assert {name: plain[name] for name in limits} == limits
        assert plain["max_tool_rounds"] == 50  # the library's default where nothing was said
        own = create(http, max_attempts=5)
        assert (own["max_attempts"], own["max_continuations"]) == (5, 1)


def test_a_request_giving_the_librarys_default_gets_it_not_the_servers(tmp_path: Path) -> None:
    """The create route tells a field left out (the server's setting) from one given the
    library's default (the client's), from the request's value alone."""
    config = ServerConfig(
        db=tmp_path / "given.db",
        chunk_delay=0.0,
        behavior=ContextExhaustionBehavior.CHECKPOINT_RESTART,
        limits={"max_attempts": 2},
    )
    with live_server(build_app(config)) as url, httpx2.Client(base_url=url) as http:
        left_out = create(http)
        assert (left_out["behavior"], left_out["max_attempts"]) == ("checkpoint_restart", 2)
        default = ContextExhaustionBehavior.THRESHOLD_BASED_CONTINUATION.value
        given = create(http, behavior=default, max_attempts=4)
        assert (given["behavior"], given["max_attempts"]) == (default, 4)
        # A null model or behaviour is left out, as clients of earlier servers send them.
        nulls = create(http, model=None, behavior=None)
        assert (nulls["behavior"], nulls["model"]) == ("checkpoint_restart", left_out["model"])


@needs_git
@pytest.mark.parametrize("where", ["repo", "cwd"])
def test_a_pause_records_the_git_state_of_the_repository(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "project"
    branch, head = dirty_repository(repo)
    if where == "cwd":
        monkeypatch.chdir(repo)
    config = ServerConfig(
        db=tmp_path / "git.db", chunk_delay=0.0, repo=repo if where == "repo" else None
    )
    with live_server(build_app(config)) as url, httpx2.Client(base_url=url, timeout=60) as http:
        cid = create(http)["id"]
        send(http, cid, "Start the migration.")
        paused = http.post(f"/api/conversations/{cid}/pause", json={"reason": "lunch"}).json()
        version = paused["snapshot_version"]
        whole = http.get(f"/api/conversations/{cid}/snapshots/{version}").json()
    assert whole["context"] == {"git": {"branch": branch, "head": head, "dirty": ["notes.txt"]}}


@pytest.mark.parametrize("window", [1_000, 3_000, 5_000, 24_000])
def test_offline_a_small_window_warns_before_its_limit(window: int, tmp_path: Path) -> None:
    config = ServerConfig(db=tmp_path / "small.db", chunk_delay=0.0, context_window=window)
    with live_server(build_app(config)) as url, httpx2.Client(base_url=url, timeout=60) as http:
        cid = create(http)["id"]
        seen: list[int] = []  # what each turn left (the first from nothing: the tools, too)
        for turn in range(200):
            state = send(http, cid, f"Tell me more, part {turn}.")[-1][1]["state"]
            if state["phase"] == "context_exhausted":
                break
            seen.append(state["context_tokens"])
        else:
            pytest.fail("the limit never came")
    band = state["continuation_tokens"] - state["warning_tokens"]
    # Every turn moves the meter by less than the warning's band, so some turn ends in it
    # (the page shows the warning and its button) whatever the messages say.
    assert max(b - a for a, b in itertools.pairwise(seen)) < band
    assert seen[-1] >= state["warning_tokens"]
