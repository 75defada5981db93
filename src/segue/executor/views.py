"""What the model sees: the current session's and generation's part of the transcript.

The transcript is append-only and keeps everything; fresh starts are views over it. A checkpoint
restart or a resume starts a new *session* (the model sees only that session's messages); a
compaction starts a new *generation* within a session (the model sees the summary, the verbatim
tail the summary names, then what came after).
"""

from __future__ import annotations

from collections.abc import Sequence

from segue.statemachine import Message

DEFAULT_KEEP_RECENT = 6
"""Messages kept verbatim by compaction: enough for the last exchange and its tool calls."""


def current_view(transcript: Sequence[Message], session: int, generation: int) -> list[Message]:
    """The messages the model must be sent for ``session``/``generation``, in order."""
    in_session = [m for m in transcript if m.session == session]
    summary_at = None
    for index in range(len(in_session) - 1, -1, -1):
        message = in_session[index]
        if message.kind == "summary" and message.generation == generation:
            summary_at = index
            break
    if summary_at is None:
        return [m for m in in_session if m.generation == generation]
    summary = in_session[summary_at]
    before = [
        m for m in in_session[:summary_at] if m.generation == generation - 1 and m.kind != "summary"
    ]
    kept = before[len(before) - summary.kept_messages :] if summary.kept_messages else []
    after = [m for m in in_session[summary_at + 1 :] if m.generation == generation]
    return [summary, *kept, *after]


def split_for_compaction(
    view: Sequence[Message], generation: int, keep_recent: int = DEFAULT_KEEP_RECENT
) -> tuple[list[Message], list[Message]]:
    """Split a view into (to summarise, to keep verbatim).

    The tail is taken from the current generation only (so ``current_view`` can find it again
    from the summary's ``kept_messages``), never starts with a ``tool_result`` (that would cut a
    tool call from its result) and never includes a summary (summaries are summarised again).
    """
    own = [i for i, m in enumerate(view) if m.generation == generation and m.kind != "summary"]
    start = max(0, len(own) - keep_recent)
    while start > 0 and view[own[start]].kind == "tool_result":
        start -= 1
    if start < len(own) and view[own[start]].kind == "tool_result":
        start = len(own)  # only tool results left: keep nothing rather than orphan them
    kept = set(own[start:])
    head = [m for i, m in enumerate(view) if i not in kept]
    tail = [view[i] for i in sorted(kept)]
    return head, tail
