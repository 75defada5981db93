"""How the CLI prints, and how it opens what it inspects.

Output goes through ``rich`` but reads the same without a terminal (CI logs): the meter is a
line of text per turn, not a live widget. Every line fits the terminal's width, or 80 columns on
a pipe: a sentence wraps at words (``say``), an entry of a list is cut with an ellipsis
(``entry``), a table leaves out the columns it has no room for (``_tables``). Everything
printed that a model, a user or a store wrote passes through ``printable`` first: a reply can
hold terminal escapes (which could rewrite the screen or the window title) and bidirectional
overrides, shown here as ``\\x1b``-style text.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from math import floor
from typing import Any, Final

from rich.console import Console
from rich.table import Table
from rich.text import Text

from segue import effects as fx
from segue.executor.runtime import Runtime
from segue.statemachine import ConversationState

_UNPRINTABLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""Control characters (all but tab and newline) and the bidirectional overrides."""


def printable(text: str) -> str:
    """``text`` with control characters and bidi overrides written out as escapes."""
    return _UNPRINTABLE.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    code = ord(match[0])
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


PIPE_WIDTH: Final = 80
"""The width of what is printed without a terminal (a pipe, a CI log) and without ``COLUMNS``:
the width a terminal has by default, so that output piped into a file or a pager reads as it
would have on the screen (wider lines were once cut or wrapped mid-word there)."""


def console() -> Console:
    """Stdout, as wide as the terminal (``COLUMNS`` if set), or ``PIPE_WIDTH`` without one."""
    out = Console()
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out.width = PIPE_WIDTH
    return out


def say(out: Console, text: str, style: str = "") -> None:
    """Text without markup (it quotes ids, paths and model output), each of its lines wrapped at
    words to the console's width; a line that starts indented keeps its indent on the lines it
    wraps onto, so that what belongs to it reads as one piece. A word wider than the console
    (a long path) is folded, never left to overflow."""
    for line in printable(text).split("\n"):
        body = line.lstrip(" ")
        indent = " " * min(len(line) - len(body), out.width // 2)
        wrapped = Text(body, style=style).wrap(out, out.width - len(indent), overflow="fold")
        for piece in wrapped or [Text()]:
            piece.rstrip()
            out.print(Text(indent).append_text(piece), soft_wrap=True)


def entry(out: Console, text: str, style: str = "") -> None:
    """One entry of a list (a reply's first words, a tool's call) on one line, cut with an
    ellipsis where the console is too narrow for it."""
    body = text.lstrip(" ")
    indent = text[: len(text) - len(body)]
    shown = indent + clip(printable(body), out.width - len(indent))
    out.print(Text(shown, style=style), soft_wrap=True)


def print_json(value: Any) -> None:
    """``value`` as indented JSON on stdout (strings escaped by JSON itself)."""
    out = Console(soft_wrap=True)
    out.print(Text(json.dumps(value, indent=2, ensure_ascii=False)), soft_wrap=True)


def percent(tokens: int, window: int, decimals: int = 0) -> float:
    """``tokens`` of ``window`` in percent, floored: 79.97% is 79.9, never an 80.0 that has not
    reached the threshold."""
    scale = 10**decimals
    return floor(100 * scale * tokens / window) / scale if window else 0.0


METER_TEXT = 54
"""Characters of a meter's line besides its bar (label, figures, phase)."""


def meter(out: Console, label: str, state: ConversationState) -> None:
    """Tokens / window, percent, phase; ``~`` marks an estimate (no usage reported yet)."""
    window, config, measured = state.context_window, state.config, state.context_tokens
    tokens = measured if measured is not None else state.projected_tokens
    style = "green" if tokens < config.warning_tokens else "yellow"
    style = "red" if tokens >= config.continuation_tokens else style
    full, empty = ("█", "░") if out.encoding.lower().startswith("utf") else ("#", ".")
    bar = max(10, min(30, out.width - METER_TEXT))  # the whole line fits the terminal
    filled = min(bar, round(bar * tokens / window))
    line = Text(f"{label:<8} ").append(full * filled, style).append(empty * (bar - filled), "dim")
    line.append(f" {'' if measured is not None else '~'}{tokens:>6,} / {window:,}  ")
    line.append(f"{percent(tokens, window, 1):5.1f}%", style).append(f"  {state.phase.kind}")
    out.print(line, soft_wrap=True)


_WINDOW_SOURCES: Final = {
    "given": "given (--context-window, or by the application)",
    "server": "reported by the model's server",
    "table": "from segue's table of models",
    "assumed": "assumed: pass --context-window N if it is another",
    "offline": "the offline scripted model's",
}


def window_words(tokens: int, source: str | None) -> str:
    """A conversation's window and where it came from, in one line of at most 80 columns:
    ``window 128,000 tokens, assumed: ...`` (an assumed window said so, with the way to set
    it)."""
    came = _WINDOW_SOURCES.get(source or "", "from where not kept (an older conversation)")
    return f"window {tokens:,} tokens, {came}"


FALLBACK_WORDS: Final = "the provider could not compact; segue compacts instead"
"""What a person is told when a conversation's provider could not compact it."""


def narration(effect: fx.Effect) -> tuple[str, str] | None:  # noqa: PLR0912  # a case an effect
    """What a person watching should hear before an effect runs, and in which style."""
    match effect:
        case fx.NotifyContextWarning(context_tokens=used, context_window=window):
            shown = percent(used, window)
            text = f"WARNING: context {shown:.0f}% full ({used:,} / {window:,} tokens)"
            return f"{text}, past the warning threshold", "bold yellow"
        case fx.RequestContinuation():  # at the threshold, or asked for by hand
            return "asking for a continuation summary", "bold red"
        case fx.NotifyContextExhausted():
            return "context exhausted: the conversation is now read-only", "bold red"
        case fx.RequestCheckpoint(purpose="pause"):  # at the threshold, or a pause asked for
            return "asking for a checkpoint before pausing", "red"
        case fx.RequestCheckpoint():
            return "asking for a checkpoint to restart from", "red"
        case fx.SaveSnapshot(snapshot=snapshot):
            why = snapshot.reason or snapshot.trigger  # "after 5 turns" says more than "pause"
            return f"paused: snapshot v{snapshot.version} saved ({why})", "bold cyan"
        case fx.StartSession(session=session, reason=reason):
            return f"new session {session} ({reason})", "bold cyan"
        case fx.ArchiveTranscript(generation=generation):
            return f"archiving the transcript (generation {generation})", "cyan"
        case fx.RequestCompaction():
            return "compacting older messages", "red"
        case fx.StartGeneration(generation=generation):
            return f"new generation {generation} starts from a summary", "bold cyan"
        case fx.ScheduleRetry(delay_seconds=delay, attempt=attempt):
            return f"retrying in {delay:.1f}s (attempt {attempt})", ""
        case fx.NotifyFailed(error_kind=kind, message=message):
            return f"failed: {kind.value}: {message}", "bold red"
        case fx.NotifyCompactionFallback(reason=reason):
            return f"{FALLBACK_WORDS} ({reason})", "yellow"
    return None


def narrate(runtime: Runtime, out: Console, *, before: Callable[[], None] | None = None) -> None:
    """Say what the runtime does as it does it, each on a line of its own (``before`` ends a
    line the caller left open, a reply streaming in)."""

    def listener(_cid: str, effect: fx.Effect) -> None:
        if (said := narration(effect)) is not None:
            if before is not None:
                before()
            say(out, f"  {said[0]}", said[1])

    runtime.subscribe(listener)


def clip(text: str, limit: int) -> str:
    """``text`` on one line, at most ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def table(title: str, columns: str, rows: Iterable[Iterable[object]]) -> Table:
    """A table of plain text (never markup: cells quote model output); ids never wrap."""
    shown = Table(title=Text(printable(title)))
    for column in columns.split("|"):
        shown.add_column(column, overflow="fold", no_wrap=column in ("id", "parent", "child"))
    for row in rows:
        shown.add_row(*(Text("-" if cell is None else printable(str(cell))) for cell in row))
    return shown


async def last_text(runtime: Runtime, cid: str, kind: str = "assistant") -> str:
    """The text of the conversation's latest message of ``kind``."""
    messages = await runtime.messages(cid)
    return next((m.text for m in reversed(messages) if m.kind == kind and m.text), "")
