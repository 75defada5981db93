"""Checkpoints: the text an agent writes before a fresh start, and what is built from it.

All pure functions over strings, so the core can use them inside ``transition()`` and tests can
pin their behaviour on awkward inputs (code fences, missing tags, empty answers).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Final, Literal

from pydantic import Field, StrictInt

from segue.statemachine._values import Frozen
from segue.statemachine.models import Usage

CHECKPOINT_PROMPT = """CONTEXT LIMIT APPROACHING - CHECKPOINT REQUIRED

Your context window is nearly full. Your work will continue at once in a fresh session that sees
only what you write now. Output a checkpoint and nothing else:

<checkpoint>
## Goal
[1-2 sentences: the original task]

## Completed Work
[Each file changed or result obtained, and what changed]

## Remaining Tasks
[Ordered list of what still needs to be done]

## Do Not Redo
[Completed items that must not be repeated]

## Key Decisions
[Choices and constraints the next session must respect]
</checkpoint>

After the checkpoint, STOP."""

CONTINUE_PREVIOUS_WORK = (
    "CONTINUING FROM A PREVIOUS SESSION\n\n"
    "The previous session hit its context limit and could not write a checkpoint. "
    "Inspect the current state of the work, then continue the previous work. "
    "Do not repeat work that is already done."
)
"""The minimal seed when no checkpoint could be obtained."""

CHECKPOINT_SECTIONS: tuple[str, ...] = (
    "Goal",
    "Completed Work",
    "Remaining Tasks",
    "Do Not Redo",
    "Key Decisions",
)

_FENCE = re.compile(r"^\s*```[\w+-]*[ \t]*\n(?P<body>.*?)\n?\s*```\s*$", re.DOTALL)
_BLOCK = re.compile(r"<checkpoint>(?P<body>.*?)</checkpoint>", re.DOTALL | re.IGNORECASE)
_OPEN_ONLY = re.compile(r"<checkpoint>(?P<body>.*)$", re.DOTALL | re.IGNORECASE)
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(?P<title>.+?)\s*#*\s*$", re.MULTILINE)


def _strip_fence(text: str) -> str:
    match = _FENCE.match(text)
    return match.group("body") if match else text


def extract_checkpoint(text: str) -> str:
    """The checkpoint an agent wrote, ready to seed a new session.

    Code fences around the answer or inside the block are removed; the content between the last
    complete ``<checkpoint>`` tags wins (agents sometimes quote the template first); an unclosed
    block runs to the end of the text; without tags the whole answer is the checkpoint. Returns
    ``""`` only when the answer has no text at all.
    """
    unfenced = _strip_fence(text.strip())
    blocks = _BLOCK.findall(unfenced)
    if blocks:
        body = str(blocks[-1])
    else:
        opened = _OPEN_ONLY.search(unfenced)
        body = opened.group("body") if opened else unfenced
    return _strip_fence(body.strip()).strip()


def checkpoint_sections(checkpoint: str) -> dict[str, str]:
    """The markdown sections of a checkpoint by heading (``{"Goal": "...", ...}``).

    Headings are kept as written; text before the first heading is dropped. A checkpoint with no
    headings gives ``{}``; callers keep the raw text either way.
    """
    matches = list(_HEADING.finditer(checkpoint))
    sections: dict[str, str] = {}
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(checkpoint)
        sections[match.group("title").strip()] = checkpoint[match.end() : end].strip()
    return sections


def continuation_prompt(checkpoint: str) -> str:
    """The first user message of a session that continues from ``checkpoint``."""
    if not checkpoint.strip():
        return CONTINUE_PREVIOUS_WORK
    return (
        "CONTINUING FROM A PREVIOUS SESSION\n\n"
        "The previous session hit its context limit. This is the state it left:\n\n"
        f"<checkpoint>\n{checkpoint}\n</checkpoint>\n\n"
        "Continue from the remaining tasks. Do not repeat completed work."
    )


class GitState(Frozen):
    """The repository an agent works in, as the runtime saw it when it paused."""

    branch: str
    commit: str
    has_uncommitted_changes: bool = False
    files_modified: tuple[str, ...] = ()


class SessionSnapshot(Frozen):
    """What a paused conversation needs to be resumed, versioned so old snapshots stay readable.

    Version 2 added what the session did (its calls, their cost, the errors met, the decisions
    made), when the snapshot was saved, and the application's own context; a version-1 snapshot
    loads with those empty.
    """

    schema_version: Literal[1, 2] = 2
    conversation_id: str
    version: Annotated[StrictInt, Field(ge=1)]
    """1 for the first pause of a conversation, 2 for the next, and so on."""
    session: Annotated[StrictInt, Field(ge=1)]
    trigger: Literal["pause", "exhaustion"] = "pause"
    """``exhaustion``: taken because the context reached its threshold (``CHECKPOINT_PAUSE``)."""
    reason: str = ""
    checkpoint: str
    sections: dict[str, str] = Field(default_factory=dict)
    context_tokens: int | None = None
    context_window: int
    message_count: int = 0
    continuations: int = 0
    git: GitState | None = None
    created_at: float | None = None
    """Unix time the runtime saved it (the core has no clock, so it leaves this unset)."""
    llm_calls: Annotated[StrictInt, Field(ge=0)] = 0
    """LLM requests answered or failed since the session began (retries included)."""
    tool_calls: Annotated[StrictInt, Field(ge=0)] = 0
    """Tool results recorded since the session began (tools that ran, or failed running)."""
    usage: Usage | None = None
    """The session's token cost: every answer's usage summed (right for cost, never occupancy)."""
    errors: tuple[str, ...] = ()
    """The last errors the session met, oldest first (each shortened)."""
    decisions: tuple[str, ...] = ()
    """Decisions made: the checkpoint's Key Decisions, then those the transcript states."""
    context: dict[str, Any] | None = None
    """Application context the host supplied when it was saved (task, git or test state...)."""
    session_seconds: Annotated[float, Field(ge=0)] | None = None
    """How long the paused session ran: from its start to when the snapshot was saved, by the
    runtime's clock (None when unknown)."""


MAX_ERRORS: Final = 10
"""Errors a session keeps for its snapshot (the latest)."""
ERROR_CHARS: Final = 300
MAX_DECISIONS: Final = 20
DECISION_CHARS: Final = 300
_LABELLED = re.compile(
    r"^\s*(?:[-*]\s*)?(?:\*\*)?decisions?(?:\*\*)?\s*[:\-]\s*(?:\*\*)?\s*(?P<text>.+)$",
    re.IGNORECASE,
)
_STATED = re.compile(
    r"\b(?:we|i)(?:\s+(?:decided|chose|are going with|am going with|went with)"
    r"|(?:'ll|\s+will)\s+use)\b.+",
    re.IGNORECASE,
)
"""A line that states a decision: "Decision: ...", or "we decided ...", "I'll use X instead"."""
_BULLET = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")


def shortened(text: str, limit: int) -> str:
    """One line of at most ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def extract_decisions(checkpoint: str, texts: Sequence[str] = ()) -> tuple[str, ...]:
    """The decisions a session made: each item of the checkpoint's "Key Decisions" section, then
    every line of ``texts`` (the transcript) that states one ("Decision: ...", "We decided ...",
    "I'll use X instead of Y"), in order, without duplicates, at most ``MAX_DECISIONS``."""
    found: list[str] = []
    section = checkpoint_sections(checkpoint).get("Key Decisions", "")
    for line in section.splitlines():
        item = _BULLET.sub("", line).strip()
        if item and item.lower() not in ("(none)", "none", "-"):
            found.append(item)
    for text in texts:
        for line in text.splitlines():
            labelled = _LABELLED.match(line)
            stated = labelled or _STATED.search(line)
            if stated is not None:
                found.append((stated.group("text") if labelled else stated.group(0)).strip())
    unique: dict[str, str] = {}
    for item in found:
        short = shortened(item, DECISION_CHARS)
        unique.setdefault(short.lower().rstrip("."), short)
    return tuple(unique.values())[:MAX_DECISIONS]


def compile_resume_context(
    snapshot: SessionSnapshot, *, current_context: Mapping[str, Any] | None = None
) -> str:
    """The system-prompt block of a resumed session, built from a snapshot.

    Known checkpoint sections come first in their canonical order, so the resumed agent reads the
    goal before the details; unknown sections follow as written. Then what the session decided
    and met, and the application context saved with it. ``current_context`` is that context as
    it is now: a git HEAD that moved since the pause is stated, so the agent does not trust a
    stale picture of the repository.
    """
    lines = [
        "## Session Resume Context",
        "",
        f"You are resuming conversation {snapshot.conversation_id} "
        f"(session {snapshot.session + 1}; snapshot v{snapshot.version}).",
    ]
    if snapshot.trigger == "exhaustion":
        lines.append("The previous session paused because its context window was nearly full.")
    if snapshot.reason:
        lines.append(f"The previous session paused because: {snapshot.reason}")
    sections = snapshot.sections
    if sections:
        ordered = [name for name in CHECKPOINT_SECTIONS if name in sections]
        ordered += [name for name in sections if name not in CHECKPOINT_SECTIONS]
        for name in ordered:
            lines += ["", f"### {name}", sections[name] or "(none)"]
    else:
        lines += ["", "### Checkpoint", snapshot.checkpoint or "(no checkpoint was written)"]
    stated = set(sections.get("Key Decisions", "").lower().split())
    extra = [d for d in snapshot.decisions if not set(d.lower().split()) <= stated]
    if extra:
        lines += ["", "### Decisions Made", *(f"- {decision}" for decision in extra)]
    if snapshot.errors:
        lines += ["", "### Errors Met", *(f"- {error}" for error in snapshot.errors)]
    if snapshot.git is not None:
        git = snapshot.git
        lines += [
            "",
            "### Git State",
            f"- Branch: {git.branch} at {git.commit}",
            f"- Files modified: {len(git.files_modified)}",
            f"- Uncommitted changes: {'yes' if git.has_uncommitted_changes else 'no'}",
        ]
    if snapshot.context:
        shown = json.dumps(snapshot.context, sort_keys=True, ensure_ascii=False, default=str)
        lines += ["", "### Application Context (at the pause)", shown]
    moved = _head_moved(snapshot.context, current_context)
    if moved:
        lines += ["", moved]
    lines += ["", "Continue from the remaining tasks. Do not repeat completed work."]
    return "\n".join(lines)


def _head_moved(before: Mapping[str, Any] | None, now: Mapping[str, Any] | None) -> str | None:
    """A sentence when the context's ``git.head`` changed between the pause and now."""
    then = _head(before)
    current = _head(now)
    if then is None or current is None or then == current:
        return None
    return (
        f"NOTE: the git HEAD moved since the pause, from {then} to {current}: check what "
        "changed before relying on the state above."
    )


def _head(context: Mapping[str, Any] | None) -> str | None:
    git = context.get("git") if context else None
    head = git.get("head") if isinstance(git, Mapping) else None
    return head if isinstance(head, str) and head else None
