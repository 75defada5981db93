"""The invariants ``segue.testing.explore`` checks on every edge: the promises of
``specs/requirements.md`` that hold in every state, whatever happened before.

Each is a function of one ``Edge`` (the state before and after, the effects, the world's books)
returning ``None`` when it holds and a sentence saying what broke otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from segue.effects import ExecuteTools, RequestLlm
from segue.statemachine import HANDLED_PAIRS, ContinuationResponse, LlmResponse
from segue.statemachine.phases import (
    ToolExecuting,
)
from segue.testing._explore_world import WAITS_FOR, Check, Edge

_MEASURED_BY: Final = (LlmResponse, ContinuationResponse)
"""Events whose usage may become the conversation's occupancy."""


_REDONE_EFFECTS: Final = ("append_message", "notify_context_exhausted")
"""What a read-only conversation answers its continuation summary made again with."""


def _read_only(edge: Edge) -> str | None:
    """REQ-BED-021: a read-only conversation never requests, runs tools or changes, but for
    its continuation summary made again (REQ-SEG-063), which it records and takes as its own."""
    if edge.before.phase.kind != "context_exhausted":
        return None
    acted = [effect.kind for effect in edge.effects if effect.kind != "reject_user_message"]
    event = edge.move.event
    if event is not None and event.kind == "continuation_redone":
        if tuple(acted) != _REDONE_EFFECTS:
            return f"a read-only conversation answered its summary made again with {acted}"
        kept = {"phase": edge.before.phase, "message_count": edge.before.message_count}
        if edge.after.model_copy(update=kept) != edge.before:
            return "a read-only conversation changed more than its summary"
        if edge.after.phase.kind != "context_exhausted":
            return "a read-only conversation left its phase for its summary made again"
        return None
    if acted:
        return f"a read-only conversation answered {edge.move.label} with {acted}"
    if edge.after != edge.before:
        return f"a read-only conversation changed on {edge.move.label}"
    return None


def _tool_pairing(edge: Edge) -> str | None:
    """REQ-SEG-006, REQ-SEG-021: every tool call gets exactly one result, before the next
    request (so none is open outside ``tool_executing``)."""
    if edge.orphans:
        return f"tool results with no open tool_use: {list(edge.orphans)}"
    if edge.after.phase.kind != "tool_executing" and edge.world_after.unpaired:
        return f"tool_use without a result in {edge.after.phase.kind}: {edge.world_after.unpaired}"
    return None


def _one_request(edge: Edge) -> str | None:
    """At most one request in flight, and the phase waits for exactly what the world holds (its
    request or its retry timer, its tools, or nothing at rest): otherwise it would hang."""
    world, phase = edge.world_after, edge.after.phase
    if len(world.in_flight) > 1:
        return f"{len(world.in_flight)} requests in flight: {world.in_flight}"
    request = WAITS_FOR.get(type(phase))
    if request is not None:
        attempt = getattr(phase, "attempt", 1)
        if getattr(phase, "retry_pending", False):
            ok = not world.in_flight and (request, attempt + 1) in world.timers
        else:
            ok = world.in_flight == ((request, attempt),)
        ok = ok and not world.running
    elif isinstance(phase, ToolExecuting):
        ok = not world.in_flight and sorted(phase.pending) == sorted(world.running)
    else:
        ok = not world.in_flight and not world.running
    if not ok:
        return (
            f"{phase.kind} with in flight {world.in_flight}, timers {sorted(world.timers)}, "
            f"tools {world.running}"
        )
    return None


def _bounded(edge: Edge) -> str | None:
    """Attempts, continuations and tool rounds never pass their configured bounds."""
    after, config = edge.after, edge.after.config
    attempts = [getattr(effect, "attempt", 1) for effect in edge.effects]
    attempts.append(getattr(after.phase, "attempt", 1))
    if max(attempts) > config.max_attempts:
        return f"attempt {max(attempts)} over max_attempts {config.max_attempts}"
    if after.continuations > config.max_continuations:
        return f"{after.continuations} continuations over {config.max_continuations}"
    if after.tool_rounds > config.max_tool_rounds:
        return f"{after.tool_rounds} tool rounds over {config.max_tool_rounds}"
    return None


def _never_summed(edge: Edge) -> str | None:
    """REQ-SEG-001..003: occupancy is the last usable usage's four fields, or the previous
    figure, or unknown in a fresh session or generation; never a sum."""
    before, after, event = edge.before, edge.after, edge.move.event
    allowed: list[int | None] = [before.context_tokens]
    reported = None
    if isinstance(event, _MEASURED_BY) and event.usage is not None and event.usage.is_known:
        reported = event.usage.context_tokens
        if reported <= after.config.context_window:
            allowed.append(reported)
    if (after.session, after.generation) != (before.session, before.generation):
        allowed.append(None)
    if after.context_tokens not in allowed:
        return f"context_tokens {after.context_tokens} is none of {allowed}"
    return None


def _threshold(edge: Edge) -> str | None:
    """REQ-SEG-004, REQ-SEG-006: no tool runs for a response at or over the threshold, and no
    LLM request leaves with a projected prompt at or over it; while the provider compacts the
    conversation's requests itself (REQ-SEG-048), the same at the window."""
    config = edge.after.config
    event = edge.move.event
    limit = config.continuation_tokens
    if (
        config.compaction == "provider"
        and not edge.after.compaction_fallback
        and edge.before.continuations < config.max_continuations
    ):
        limit = config.context_window
    runs_tools = any(isinstance(effect, ExecuteTools) for effect in edge.effects)
    if runs_tools and isinstance(event, LlmResponse) and event.usage is not None:
        reported = event.usage.context_tokens if event.usage.is_known else 0
        if limit <= reported <= config.context_window:
            return f"tools run for a response at {reported}"
    requests = any(isinstance(effect, RequestLlm) for effect in edge.effects)
    if requests and edge.after.projected_tokens >= limit:
        return f"an LLM request with a projected prompt of {edge.after.projected_tokens}"
    return None


def _inert_pairs(edge: Edge) -> str | None:
    """REQ-SEG-022: an event outside ``HANDLED_PAIRS`` changes nothing and produces nothing."""
    event = edge.move.event
    if event is None or (edge.before.phase.kind, event.kind) in HANDLED_PAIRS:
        return None
    if edge.effects or edge.after != edge.before:
        return f"{event.kind} in {edge.before.phase.kind} acted: {[e.kind for e in edge.effects]}"
    return None


def _recovered(edge: Edge) -> str | None:
    """A crash reloads the committed state: the codec must give back the same conversation."""
    if edge.move.event is None and edge.after != edge.before:
        return "the state read back after a crash is not the one committed"
    return None


INVARIANTS: Final[Mapping[str, Check]] = {
    "read_only": _read_only,
    "tool_pairing": _tool_pairing,
    "one_request": _one_request,
    "bounded": _bounded,
    "never_summed": _never_summed,
    "threshold": _threshold,
    "inert_pairs": _inert_pairs,
    "recovered": _recovered,
}
"""The promises of ``specs/requirements.md`` checked on every edge, by name; totality (no
exception, for any phase and event) is checked by ``explore`` itself as ``totality``."""
