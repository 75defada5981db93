"""Continuation chains and cost reports: reading what a conversation and its relatives did.

A conversation continued in a new one (``Runtime.start_new_from``) and that one continued again
form a *chain*: root first, each link the one child of the one before (``child_id``). A
sub-agent also has a ``parent_id``, but its parent's child is never the sub-agent, so a chain
follows only links both ends agree on. ``lineage`` returns a chain with each link's summary, so
an application can answer "what happened before" across all of it.

``usage`` totals what every request cost, by its purpose (a turn, a continuation summary, a
checkpoint, a compaction, the provider's compaction) and by session. It reads the event log,
where every answer is logged with its per-request usage and the session it came in, whether or
not it left a message (an empty or refused summary that was asked for again was paid for too).
A compaction the provider made within a call is logged with that call's answer, its own usage
beside the answer's (REQ-SEG-051): both are counted, each under its purpose. Summing is right
here, for cost; it is never how occupancy is measured.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from segue.executor.errors import ConversationNotFoundError, SegueError
from segue.executor.store_port import LogReader, StoredConversation, StoredMessage, TransitionRecord
from segue.statemachine import (
    CONTEXT_FAILURES,
    ContextExhausted,
    ConversationState,
    Failed,
    Message,
    Usage,
    continues_in_new,
)

PURPOSES: Final = {
    "assistant": "turn",
    "continuation": "continuation",
    "checkpoint": "checkpoint",
    "summary": "compaction",
}
"""The purpose of the request that produced a message of each kind."""
ANSWERS: Final = {
    "llm_response": "turn",
    "continuation_response": "continuation",
    "continuation_redone": "continuation",  # a summary made again (REQ-SEG-063)
    "checkpoint_response": "checkpoint",
    "compaction_response": "compaction",
}
"""The purpose of the request each answer event answers."""
LIMIT_PURPOSES: Final = ("continuation", "checkpoint", "compaction")
"""The purposes of the requests sent at the limit (to ``summary_model`` when there is one)."""
PROVIDER_COMPACTION: Final = "provider_compaction"
"""The purpose of a compaction the provider made (within a call, or asked on demand), which the
conversation's own model answers (REQ-SEG-051)."""
_MAX_CHAIN: Final = 10_000
"""A chain longer than this is a loop in the store (a link the store should never hold)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """One conversation of a continuation chain."""

    id: str
    position: int
    """1 for the root, 2 for its continuation, and so on."""
    state: ConversationState
    created_at: float
    summary: str | None
    """What it ended with (its continuation summary), None while it is still going on."""

    @property
    def label(self) -> str:
        """Its place in the chain, as a title would say it: ``root``, ``2``, ``3``..."""
        return "root" if self.position == 1 else str(self.position)


async def lineage(store: LogReader, conversation_id: str) -> list[Link]:
    """The chain ``conversation_id`` belongs to, root first."""
    current = await store.load(conversation_id)
    ancestors: list[StoredConversation] = []
    while current.state.parent_id is not None and len(ancestors) < _MAX_CHAIN:
        try:
            parent = await store.load(current.state.parent_id)
        except ConversationNotFoundError:
            break  # deleted alone (``delete_conversation``): this one is the root now
        if parent.child_id != current.state.id:
            break  # a sub-agent's parent, or a parent that let go: not a continuation
        ancestors.append(parent)
        current = parent
    chain = [*reversed(ancestors), await store.load(conversation_id)]
    while chain[-1].child_id is not None and len(chain) < _MAX_CHAIN:
        chain.append(await store.load(chain[-1].child_id))
    return [
        Link(
            id=stored.state.id,
            position=position,
            state=stored.state,
            created_at=stored.created_at,
            summary=_ended_with(stored.state),
        )
        for position, stored in enumerate(chain, 1)
    ]


def _ended_with(state: ConversationState) -> str | None:
    summary = state.phase.__dict__.get("summary")
    return summary if isinstance(summary, str) else None


@dataclass(frozen=True, slots=True)
class UsageReport:
    """What a conversation's requests cost, in tokens (sums of per-request usage)."""

    by_purpose_and_session: dict[tuple[str, int], Usage] = field(default_factory=dict)
    requests: int = 0
    """Answers with a usage report (requests that failed or reported nothing are not here)."""
    models: dict[str, str] = field(default_factory=dict)
    """The model each purpose was asked of (the limit's requests go to the conversation's
    ``summary_model`` when it has one); empty when unknown."""

    @property
    def by_model(self) -> dict[str, Usage]:
        """Per model, for a conversation whose limit requests went to another model."""
        groups: dict[str, list[Usage]] = {}
        for (purpose, _session), usage in self.by_purpose_and_session.items():
            groups.setdefault(self.models.get(purpose, "unknown"), []).append(usage)
        return {model: _sum(usages) for model, usages in groups.items()}

    @property
    def by_purpose_and_model(self) -> dict[tuple[str, str], Usage]:
        """Per purpose with the model that answered it: ``("compaction", "claude-haiku-4-5")``."""
        return {
            (purpose, self.models.get(purpose, "unknown")): usage
            for purpose, usage in self.by_purpose.items()
        }

    @property
    def total(self) -> Usage:
        """Everything together."""
        return _sum(self.by_purpose_and_session.values())

    @property
    def by_purpose(self) -> dict[str, Usage]:
        """Per purpose: ``turn``, ``continuation``, ``checkpoint``, ``compaction``,
        ``provider_compaction``."""
        return self._grouped(0)

    @property
    def by_session(self) -> dict[int, Usage]:
        """Per session (a checkpoint restart or a resume starts a new one)."""
        return self._grouped(1)

    def _grouped(self, part: int) -> dict[Any, Usage]:
        groups: dict[Any, list[Usage]] = {}
        for key, usage in self.by_purpose_and_session.items():
            groups.setdefault(key[part], []).append(usage)
        return {key: _sum(usages) for key, usages in groups.items()}


def usage_from_log(records: Sequence[TransitionRecord]) -> UsageReport | None:
    """Total the usage of every answer in the event log by purpose and session; None when the
    log has answers from before sessions were logged (``usage_report`` reads the messages
    then)."""
    answers: list[tuple[str, int, Usage]] = []
    for record in records:
        purpose = ANSWERS.get(record.event_kind)
        if purpose is None:
            continue
        if record.session is None:
            return None
        event = json.loads(record.event_json)
        if event.get("block"):  # a compaction the provider made on demand (REQ-SEG-051)
            purpose = PROVIDER_COMPACTION
        for compaction in event.get("compactions") or ():  # made within the call
            if compaction.get("usage"):
                answers.append((PROVIDER_COMPACTION, record.session, Usage(**compaction["usage"])))
        reported = event.get("usage")
        if reported:
            answers.append((purpose, record.session, Usage(**reported)))
    return _report(answers)


def usage_report(messages: list[StoredMessage]) -> UsageReport:
    """Total the usage kept on ``messages`` by purpose and session (for logs written before
    sessions were logged: answers that left no message are not in it)."""
    return _report(
        (PURPOSES[m.message.kind], m.message.session, m.message.usage)
        for m in messages
        if m.message.kind in PURPOSES and m.message.usage is not None
    )


def _report(answers: Iterable[tuple[str, int, Usage]]) -> UsageReport:
    grouped: dict[tuple[str, int], list[Usage]] = {}
    requests = 0
    for purpose, session, usage in answers:
        requests += 1
        grouped.setdefault((purpose, session), []).append(usage)
    return UsageReport({key: _sum(usages) for key, usages in grouped.items()}, requests)


def _sum(usages: Any) -> Usage:
    input_tokens = output = creation = read = 0
    for usage in usages:
        input_tokens += usage.input_tokens
        output += usage.output_tokens
        creation += usage.cache_creation_input_tokens
        read += usage.cache_read_input_tokens
    return Usage(
        input_tokens=input_tokens,
        output_tokens=output,
        cache_creation_input_tokens=creation,
        cache_read_input_tokens=read,
    )


async def seed_of(
    store: LogReader, parent: StoredConversation, *, with_summary: bool, recent_turns: int = 0
) -> tuple[str | None, list[Message]]:
    """What a conversation continued in a new one passes on: the summary it ended with (None
    when it wrote none, or ``with_summary`` is False) and the child's seed messages (that
    summary, every pinned message verbatim whatever the summary says, then the last
    ``recent_turns`` exchanges as plain text)."""
    state = parent.state
    phase = state.phase
    if not continues_in_new(state):
        msg = (
            f"Conversation {state.id} is {phase.kind}: only a conversation that ended (read-only "
            "at its limit, or failed) is continued in a new one."
        )
        raise SegueError(msg)
    if recent_turns < 0:
        msg = f"recent_turns is a number of exchanges, not {recent_turns!r}"
        raise ValueError(msg)
    transcript = (
        await store.messages(state.id)
        if state.pinned_tokens or recent_turns or isinstance(phase, Failed)
        else []
    )
    summary: str | None = None
    if isinstance(phase, ContextExhausted):
        summary = phase.summary
    elif isinstance(phase, Failed) and phase.error_kind in CONTEXT_FAILURES:
        for message in reversed(transcript):
            if message.kind in ("continuation", "checkpoint", "summary") and message.text:
                summary = message.text
                break
    if not with_summary:
        summary = None
    seed = [Message(kind="summary", text=summary)] if summary else []
    # After the summary: a summary starts the view it is in (what came before it in its
    # generation is what it summarised).
    seed += [
        Message(kind="user", text=m.text, content=m.message.content, pinned=True)
        for m in transcript
        if m.message.pinned
    ]
    seed += recent_exchanges(transcript, recent_turns)
    return summary or None, seed


def recent_exchanges(transcript: Sequence[StoredMessage], turns: int) -> list[Message]:
    """The last ``turns`` exchanges of a transcript as plain text: each user message and the
    assistant's last text reply to it. Tool calls and their results are left out (their ids
    mean nothing in a new conversation; the reply says what came of them), and so are pinned
    messages (carried already) and a turn's message the model never answered is kept (it is
    what the user was asking when the conversation failed)."""
    picked: list[Message] = []
    reply: str | None = None
    for stored in reversed(transcript):
        if len(picked) >= 2 * turns:
            break
        message = stored.message
        if message.kind == "assistant" and message.text and reply is None:
            reply = message.text
        elif message.kind == "user" and not message.pinned:
            if reply is not None:
                picked.append(Message(kind="assistant", text=reply))
            picked.append(Message(kind="user", text=message.text, content=message.content))
            reply = None
    return picked[::-1]
