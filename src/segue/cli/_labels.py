"""What the commands that find and remove conversations read from the command line: metadata
pairs (``--metadata user=u-17``), durations (``--older-than 30d``), and the question asked
before anything is deleted (``--yes`` skips it).
"""

from __future__ import annotations

import re
import textwrap
from typing import Annotated, Final

import typer

from segue.cli._app import CliError
from segue.cli._output import printable
from segue.executor.bounds import checked_metadata
from segue.executor.errors import InvalidMetadataError

MetadataOption = Annotated[
    list[str] | None,
    typer.Option(
        "--metadata",
        metavar="KEY=VALUE",
        help="Only conversations labelled so (repeatable: every pair must hold).",
    ),
]
YesOption = Annotated[bool, typer.Option("--yes", "-y", help="Delete without asking first.")]

_UNITS: Final = {"s": 1, "m": 60, "h": 3_600, "d": 86_400, "w": 7 * 86_400}
_DURATION: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
_UNIT_WORDS: Final = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week"}


def metadata_of(given: list[str] | None) -> dict[str, str] | None:
    """``KEY=VALUE`` options as metadata (None when there are none); a usage error in the
    CLI's words for anything a store could not keep."""
    if not given:
        return None
    pairs: dict[str, str] = {}
    for item in given:
        key, equals, value = item.partition("=")
        if not equals or not key:
            msg = f"--metadata takes KEY=VALUE, not {printable(item)!r}"
            raise CliError(msg, 2)
        if key in pairs:
            raise CliError(f"--metadata {printable(key)!r} is given twice", 2)
        pairs[key] = value
    for text in (*pairs, *pairs.values()):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # bytes the terminal's encoding could not read
            raise CliError(f"--metadata {printable(text)!r} is not valid text", 2) from None
    try:
        return checked_metadata(pairs)
    except InvalidMetadataError as error:
        raise CliError(f"--metadata: {printable(str(error))}", 2) from None


def duration(given: str) -> float:
    """A typer parser of ``30d``, ``12h``, ``45m``, ``90s`` or ``2w`` as seconds."""
    found = _DURATION.match(given)
    if found is None:
        msg = f"{given!r} is not a duration: give a number and a unit, as 30d, 12h, 45m, 90s, 2w"
        raise typer.BadParameter(msg)
    return float(found[1]) * _UNITS[found[2].lower()]


def checked_duration(given: str) -> str:
    """A typer callback: ``given`` if it is a ``duration``, else a usage error."""
    duration(given)
    return given


def said_duration(given: str) -> str:
    """A duration as a person reads it: ``30d`` is ``30 days``."""
    found = _DURATION.match(given)
    if found is None:
        return given
    number, unit = found[1], _UNIT_WORDS[found[2].lower()]
    return f"{number} {unit}{'' if number == '1' else 's'}"


def labels(metadata: dict[str, str] | None) -> str:
    """Metadata as the command line gave it: ``user=u-17, team=tides``."""
    return ", ".join(f"{key}={value}" for key, value in (metadata or {}).items())


def ask(question: str, width: int) -> bool:
    """Whether the person at the terminal says yes to ``question`` (no by default; no too
    when nobody can answer, input having ended), asked in lines of ``width`` at most."""
    shown = textwrap.fill(question, width=max(20, width - len(" [y/N]: ")))
    try:
        return typer.confirm(shown, default=False)
    except typer.Abort:  # end of input: nobody said yes
        typer.echo()
        return False


__all__ = [
    "MetadataOption",
    "YesOption",
    "ask",
    "checked_duration",
    "duration",
    "labels",
    "metadata_of",
    "said_duration",
]
