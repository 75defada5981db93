"""The ``segue`` application object, its global options and how a command fails.

Expected failures (no API key, unknown model, locked store, read-only conversation) are one
line on stderr with exit code 2 (usage or setup) or 1 (runtime); a traceback means a bug.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import sqlite3
import sys
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import structlog
import typer
from pydantic import ValidationError

from segue._version import __version__
from segue.executor.errors import ConversationNotFoundError, SegueError
from segue.executor.stores.sqlite import StoreLockedError
from segue.statemachine import ContextExhaustionBehavior as Behavior
from segue.statemachine.options import ConversationOptions, check_window

T = TypeVar("T")

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,  # a bug report must never print an API key
    # Plain help: typer's rich panels print a type after every option, flags too (``--version
    # <bool>`` in typer 0.29), and fold long choices mid-word at 80 columns.
    rich_markup_mode=None,
)
DbOption = Annotated[
    Path, typer.Option("--db", envvar="SEGUE_DB", help="SQLite store file.", show_default=True)
]


def _behavior(given: str | Behavior) -> Behavior:
    """A behaviour by its value or its name, in any case; a usage error in the CLI's words
    otherwise (typer's own coercion would print pydantic's)."""
    try:
        return Behavior(given)
    except ValueError:
        choices = ", ".join(b.value for b in Behavior)
        raise typer.BadParameter(f"{given!r} is not a behaviour: choose {choices}") from None


BehaviorOption = Annotated[
    Behavior,
    typer.Option(
        parser=_behavior,
        metavar="BEHAVIOR",
        help="What happens when the window fills up: " + ", ".join(b.value for b in Behavior) + ".",
    ),
]
HeaderOption = Annotated[
    list[str] | None,
    typer.Option(
        "--header",
        metavar="NAME:VALUE",
        help="An HTTP header for every API request (repeatable), for a server with its own auth.",
    ),
]
BaseUrlOption = Annotated[
    str | None,
    typer.Option(
        help="API base URL (default: $ANTHROPIC_BASE_URL or $OPENAI_BASE_URL, or the real API)."
    ),
]


def whole_number(low: int, high: int | None = None) -> Callable[[str], int]:
    """A typer parser of a whole number from ``low`` to ``high``, refusing any other in the
    CLI's words (typer's own ``min`` and ``max`` print pydantic's)."""

    def parse(given: str) -> int:
        try:
            value = int(str(given).replace("_", "").replace(",", ""))
        except ValueError:
            raise typer.BadParameter(f"{given!r} is not a whole number") from None
        if value < low or (high is not None and value > high):
            bounds = f"from {low:,} to {high:,}" if high is not None else f"of {low:,} or more"
            raise typer.BadParameter(f"{value:,} is out of range: give a number {bounds}")
        return value

    return parse


def window_tokens(given: str) -> int:
    """A typer parser of ``--context-window``: a whole number the core takes as a window
    (``check_window``: ``MIN_WINDOW`` or more), refused in the words the library and the
    server's API say it."""
    value = whole_number(1)(given)
    try:
        check_window(value)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    return value


def seconds(high: float) -> Callable[[str], float]:
    """A typer parser of a number of seconds from 0 to ``high``, in the CLI's words."""

    def parse(given: str) -> float:
        try:
            value = float(given)
        except ValueError:
            raise typer.BadParameter(f"{given!r} is not a number of seconds") from None
        if not 0 <= value <= high:
            raise typer.BadParameter(f"{value:g} is out of range: give 0 to {high:g} seconds")
        return value

    return parse


def positive_seconds(high: float) -> Callable[[str], float]:
    """A typer parser of a number of seconds above 0 and at most ``high``, in the CLI's words
    (a duration that is no duration is refused, not taken as "never")."""

    def parse(given: str) -> float:
        try:
            value = float(given)
        except ValueError:
            raise typer.BadParameter(f"{given!r} is not a number of seconds") from None
        if not 0 < value <= high:  # NaN fails here too
            raise typer.BadParameter(
                f"{given} is out of range: give more than 0 and at most {high:g} seconds"
            )
        return value

    return parse


RepoOption = Annotated[
    Path | None,
    typer.Option(
        "--repo",
        file_okay=False,
        help="The git repository whose branch, commit and changed files a pause records "
        "(default: the current directory).",
    ),
]
_DEFAULTS = ConversationOptions.model_fields
MaxContinuationsOption = Annotated[
    int | None,
    typer.Option(
        parser=whole_number(0, 10_000),
        metavar="N",
        help="Checkpoint restarts or compactions one conversation may make "
        f"(default {_DEFAULTS['max_continuations'].default}).",
    ),
]
MaxAttemptsOption = Annotated[
    int | None,
    typer.Option(
        parser=whole_number(1, 20),
        metavar="N",
        help="Attempts per request before the conversation fails "
        f"(default {_DEFAULTS['max_attempts'].default}).",
    ),
]
MaxToolRoundsOption = Annotated[
    int | None,
    typer.Option(
        parser=whole_number(1, 10_000),
        metavar="N",
        help=f"Tool rounds one turn may run (default {_DEFAULTS['max_tool_rounds'].default}).",
    ),
]
RetryBaseDelayOption = Annotated[
    float | None,
    typer.Option(
        parser=seconds(600),
        metavar="SECONDS",
        help="Seconds before the first retry of a failed request, doubled for each after "
        f"(default {_DEFAULTS['retry_base_delay'].default:g}).",
    ),
]
RetryMaxDelayOption = Annotated[
    float | None,
    typer.Option(
        parser=seconds(3_600),
        metavar="SECONDS",
        help=f"The longest wait before a retry (default {_DEFAULTS['retry_max_delay'].default:g}).",
    ),
]


PauseAfterTurnsOption = Annotated[
    int | None,
    typer.Option(
        parser=whole_number(1, 1_000_000),
        metavar="N",
        help="Pause a conversation at the end of its Nth turn since it started or was last "
        "resumed (default: never).",
    ),
]
PauseAfterSecondsOption = Annotated[
    float | None,
    typer.Option(
        parser=positive_seconds(366 * 24 * 3600),
        metavar="SECONDS",
        help="Pause a conversation at the end of the first turn that ends this long after it "
        "started or was last resumed (default: never).",
    ),
]


def limits_of(
    max_continuations: int | None,
    max_attempts: int | None,
    max_tool_rounds: int | None,
    retry_base_delay: float | None,
    retry_max_delay: float | None,
    *,
    pause_after_turns: int | None = None,
    pause_after_seconds: float | None = None,
) -> dict[str, int | float]:
    """The bounds given on the command line, as ``ConversationOptions`` fields (those left
    out keep the library's defaults); the pause triggers among them (REQ-SEG-052, 053)."""
    given: dict[str, int | float | None] = {
        "max_continuations": max_continuations,
        "max_attempts": max_attempts,
        "max_tool_rounds": max_tool_rounds,
        "retry_base_delay": retry_base_delay,
        "retry_max_delay": retry_max_delay,
        "pause_after_turns": pause_after_turns,
        "pause_after_seconds": pause_after_seconds,
    }
    return {name: value for name, value in given.items() if value is not None}


def _compaction(given: str) -> str:
    """``segue`` or ``provider``, in any case; a usage error in the CLI's words otherwise."""
    chosen = given.strip().lower()
    if chosen not in ("segue", "provider"):
        raise typer.BadParameter(f"{given!r}: choose segue or provider")
    return chosen


CompactionOption = Annotated[
    str,
    typer.Option(
        parser=_compaction,
        metavar="WHO",
        help="Who compacts a compact_in_place conversation: segue (its own summary request) or "
        "provider (the provider, within its own call; Claude 4.6 and later, OpenAI's Responses "
        "API).",
    ),
]


def _summary_request(given: str) -> str:
    """``tool_less`` or ``reuse_prefix`` (a hyphen for the underscore, in any case); a usage
    error in the CLI's words otherwise."""
    chosen = given.strip().lower().replace("-", "_")
    if chosen not in ("tool_less", "reuse_prefix"):
        raise typer.BadParameter(f"{given!r}: choose tool_less or reuse_prefix")
    return chosen


SummaryRequestOption = Annotated[
    str,
    typer.Option(
        parser=_summary_request,
        metavar="SHAPE",
        help="How the limit's requests (summary, checkpoint, compaction) are sent: tool_less (no "
        "tool callable; the history billed at the plain rate) or reuse_prefix (the turn's "
        "request repeated, read from the prompt cache; a tool the model calls is refused and "
        "the summary asked again).",
    ),
]
ContextEditsOption = Annotated[
    str | None,
    typer.Option(
        metavar="JSON",
        help="The provider's context edits as its API takes them (a JSON list, or @FILE "
        "holding one), e.g. clearing old tool results on Claude.",
    ),
]


def context_edits_of(given: str | None) -> list[Any]:
    """``--context-edits``: a JSON list of edit objects, given inline or as ``@FILE``; a
    usage error saying why for anything else (each edit is checked with the options)."""
    if given is None:
        return []
    text = given
    if given.startswith("@"):
        path = Path(given[1:]).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as error:
            raise CliError(f"--context-edits: cannot read {path}: {error.strerror}", 2) from None
        except UnicodeDecodeError:
            raise CliError(f"--context-edits: {path} is not UTF-8 text", 2) from None
    try:
        edits = json.loads(text)
    except ValueError as error:
        raise CliError(f"--context-edits is not JSON ({error})", 2) from None
    if isinstance(edits, dict):
        edits = [edits]  # one edit given alone
    if not isinstance(edits, list):
        raise CliError("--context-edits takes a JSON list of edit objects", 2)
    return edits


def options_of(fields: dict[str, Any]) -> ConversationOptions:
    """The options of new conversations from the command line's ``fields``, or a usage error
    saying which option is wrong: the options' own checks (the core's), in the CLI's words
    (its flags, not pydantic's locations or the library's keywords)."""
    try:
        return ConversationOptions.model_validate(fields)
    except ValidationError as error:
        said = "; ".join(
            f"--{'-'.join(str(p) for p in problem['loc'][:1]).replace('_', '-')}: "
            f"{_in_flags(problem['msg'])}"
            if problem["loc"]
            else _in_flags(problem["msg"])
            for problem in error.errors()
        )
        raise CliError(said, 2) from None


_KEYWORD = re.compile(r'\b([a-z][a-z_]*)="([^"]*)"')
"""An option as the library's messages name it (``behavior="compact_in_place"``)."""


def _in_flags(message: str) -> str:
    """A message of the options' checks as the CLI says it: ``behavior="compact_in_place"``
    as ``--behavior compact_in_place``, without pydantic's ``Value error, ``."""
    text = str(message).removeprefix("Value error, ")
    return _KEYWORD.sub(lambda m: f"--{m[1].replace('_', '-')} {m[2]}", text)


JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]


class CliError(Exception):
    """An expected failure: printed as one line, exit ``code`` (2 setup/usage, 1 runtime)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.message, self.code = message, code


def fail(message: str, code: int) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine; expected failures become one line and an exit code."""
    try:
        return asyncio.run(coroutine)
    except CliError as error:
        fail(error.message, error.code)
    except ConversationNotFoundError as error:
        fail(str(error), 2)
    except StoreLockedError as error:
        fail(f"{error} (is another segue process using it?)", 1)
    except sqlite3.OperationalError as error:  # raised while opening, before the store wraps it
        if "locked" in str(error) or "busy" in str(error):
            fail("database is locked: another process holds its write lock (segue?)", 1)
        fail(f"database error: {error}", 1)
    except sqlite3.DatabaseError as error:
        fail(f"cannot use the database: {error}", 2)
    except SegueError as error:
        fail(str(error), 1)
    except KeyboardInterrupt:
        fail("interrupted", 130)


def headers_of(given: list[str] | None) -> dict[str, str]:
    """``NAME:VALUE`` options as a header dict (a usage error for anything else)."""
    headers: dict[str, str] = {}
    for item in given or ():
        name, colon, value = item.partition(":")
        if not colon or not name.strip() or any(c in item for c in "\r\n"):
            fail(f"--header takes NAME:VALUE, not {item!r}", 2)
        headers[name.strip()] = value.strip()
    return headers


@contextlib.contextmanager
def _logging(verbosity: int) -> Iterator[None]:
    """With ``-v`` segue's events go to stderr as key=value lines (``-vv``: debug too); without,
    the CLI stays as quiet as the library. The ``segue`` logger is put back as it was
    afterwards, so a program (or test session) calling the CLI keeps its own setup."""
    if verbosity <= 0:
        yield
        return
    logger = logging.getLogger("segue")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processor=structlog.dev.ConsoleRenderer(colors=False),
            foreign_pre_chain=[
                structlog.stdlib.add_log_level,
                structlog.stdlib.ExtraAdder(),
                _without_duplicate,
            ],
        )
    )
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbosity > 1 else logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


def _without_duplicate(_logger: Any, _name: str, event: Any) -> Any:
    """``segue_event`` holds the fields a second time (for handlers that want one dict)."""
    event.pop("segue_event", None)
    return event


def _version(value: bool) -> None:
    if value:
        typer.echo(f"segue {__version__}")
        raise typer.Exit


@app.callback()
def _root(
    ctx: typer.Context,
    verbose: Annotated[
        int, typer.Option("--verbose", "-v", count=True, help="Log to stderr (-vv: debug).")
    ] = 0,
    version: Annotated[  # handled by its callback
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Carry LLM conversations across the context-window limit."""
    ctx.with_resource(_logging(verbose))
