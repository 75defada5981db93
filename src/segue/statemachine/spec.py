"""The transition table of ``transition()`` as data: load ``transitions.toml``, draw it.

Why it exists: the table in ``specs/transitions.toml`` is the one description of the machine
that tests, diagrams and docs read, so it has to be loaded into typed values that cannot drift
from the kinds the code knows. Loading checks every name (phase, event, effect, behaviour and
guard kinds) against the core's own vocabulary and fails with the row id when one is wrong.

The core is pure, with one exception here: ``load_table()`` reads the packaged data file
(``importlib.resources``), and only when called, never at import. ``parse_table()`` does the
same from a string and performs no I/O at all.

``python -m segue.statemachine.spec`` prints the Mermaid diagram (``specs/diagram.mmd``).
"""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final, get_args

from segue.statemachine.effects import Effect
from segue.statemachine.events import EVENT_TYPES
from segue.statemachine.models import ContextExhaustionBehavior
from segue.statemachine.phases import PHASE_TYPES

TABLE_RESOURCE: Final = "transitions.toml"
"""The table's name inside the ``segue.statemachine`` package (a link to specs/)."""

ANY_BEHAVIOR: Final = "*"
UNHANDLED: Final = "unhandled"
"""The guard of rows that declare a no-op: pairs without a handler, listed for documentation."""


def _kinds(types: Iterable[type[Any]]) -> tuple[str, ...]:
    return tuple(str(cls.model_fields["kind"].default) for cls in types)


PHASE_KINDS: Final = _kinds(PHASE_TYPES)
"""Every phase kind, in the core's order (which is also the diagram's)."""
EVENT_KINDS: Final = _kinds(EVENT_TYPES)
EFFECT_KINDS: Final = _kinds(get_args(get_args(Effect)[0]))
BEHAVIORS: Final = (ANY_BEHAVIOR, *(behavior.value for behavior in ContextExhaustionBehavior))
_FIELDS: Final = (
    "id",
    "phase",
    "event",
    "guard",
    "behavior",
    "target",
    "effects",
    "requirements",
)


class SpecError(ValueError):
    """The table is malformed: the message names the row and the field."""


@dataclass(frozen=True, slots=True)
class Row:
    """One case of the machine: in ``phase``, on ``event``, when ``guard`` holds for
    ``behavior`` (``"*"``: any), go to ``target`` with effects of these kinds, in order."""

    id: str
    phase: str
    event: str
    guard: str
    behavior: str
    target: str
    effects: tuple[str, ...]
    requirements: tuple[str, ...]

    @property
    def pair(self) -> tuple[str, str]:
        """``(phase, event)``: the key of the handler that implements this row."""
        return (self.phase, self.event)

    @property
    def is_noop(self) -> bool:
        """Whether the row declares a pair that changes nothing."""
        return self.guard == UNHANDLED

    def applies_to(self, behavior: str) -> bool:
        """Whether the row is about conversations with ``behavior`` (a behaviour value)."""
        return self.behavior in (ANY_BEHAVIOR, behavior)


@dataclass(frozen=True, slots=True)
class Table:
    """The rows, in file order, and the guard vocabulary (name -> one-line meaning)."""

    rows: tuple[Row, ...]
    guards: Mapping[str, str]


def _text(raw: Mapping[str, Any], field: str, where: str, allowed: Iterable[str] = ()) -> str:
    value = raw.get(field)
    if not isinstance(value, str) or not value:
        msg = f"{where}: {field} must be a non-empty string, got {value!r}"
        raise SpecError(msg)
    choices = tuple(allowed)
    if choices and value not in choices:
        msg = f"{where}: {field} {value!r} is not one of {', '.join(choices)}"
        raise SpecError(msg)
    return value


def _texts(
    raw: Mapping[str, Any], field: str, where: str, allowed: Iterable[str] = ()
) -> tuple[str, ...]:
    value = raw.get(field)
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        msg = f"{where}: {field} must be a list of strings, got {value!r}"
        raise SpecError(msg)
    choices = tuple(allowed)
    unknown = [item for item in value if choices and item not in choices]
    if unknown:
        msg = f"{where}: {field} has unknown kinds {unknown}"
        raise SpecError(msg)
    return tuple(value)


def _row(raw: Any, index: int, guards: Mapping[str, str]) -> Row:
    where = f"transition #{index + 1}"
    if not isinstance(raw, dict):
        msg = f"{where}: expected a table, got {raw!r}"
        raise SpecError(msg)
    where = f"transition {raw.get('id', f'#{index + 1}')}"
    extra = sorted(set(raw) - set(_FIELDS))
    if extra:
        msg = f"{where}: unknown fields {extra}"
        raise SpecError(msg)
    return Row(
        id=_text(raw, "id", where),
        phase=_text(raw, "phase", where, PHASE_KINDS),
        event=_text(raw, "event", where, EVENT_KINDS),
        guard=_text(raw, "guard", where, guards),
        behavior=_text(raw, "behavior", where, BEHAVIORS),
        target=_text(raw, "target", where, PHASE_KINDS),
        effects=_texts(raw, "effects", where, EFFECT_KINDS),
        requirements=_texts(raw, "requirements", where),
    )


def parse_table(text: str) -> Table:
    """The table in ``text`` (TOML), checked against the core's kinds. Raises ``SpecError``."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise SpecError(f"not valid TOML: {error}") from error
    raw_guards = data.get("guards")
    if not isinstance(raw_guards, dict) or not all(
        isinstance(meaning, str) and meaning for meaning in raw_guards.values()
    ):
        msg = "[guards] must map each guard name to a one-line meaning"
        raise SpecError(msg)
    guards: dict[str, str] = dict(raw_guards)
    raw_rows = data.get("transition")
    if not isinstance(raw_rows, list) or not raw_rows:
        msg = "the table needs [[transition]] rows"
        raise SpecError(msg)
    rows = tuple(_row(raw, index, guards) for index, raw in enumerate(raw_rows))
    ids = [row.id for row in rows]
    duplicated = sorted({row_id for row_id in ids if ids.count(row_id) > 1})
    if duplicated:
        msg = f"duplicate row ids {duplicated}"
        raise SpecError(msg)
    return Table(rows=rows, guards=guards)


def load_table() -> Table:
    """The packaged table (``segue/statemachine/transitions.toml``, linked to specs/)."""
    resource = resources.files("segue.statemachine") / TABLE_RESOURCE
    return parse_table(resource.read_text(encoding="utf-8"))


def load_rows() -> tuple[Row, ...]:
    """The rows of the packaged table, in file order."""
    return load_table().rows


def mermaid(rows: Iterable[Row]) -> str:
    """A Mermaid ``stateDiagram-v2`` of ``rows``: one edge per (phase, target), labelled with
    the kinds of the events that take it. No-op declarations draw nothing.

    Edges are sorted by the core's phase order (source, then target) and labels by the core's
    event order, so the output depends on which transitions exist, not on how rows are ordered.
    """
    labels: dict[tuple[str, str], set[str]] = {}
    for row in rows:
        if not row.is_noop:
            labels.setdefault((row.phase, row.target), set()).add(row.event)
    phase_order = {kind: index for index, kind in enumerate(PHASE_KINDS)}
    event_order = {kind: index for index, kind in enumerate(EVENT_KINDS)}
    lines = ["stateDiagram-v2", "    [*] --> idle"]
    for source, target in sorted(labels, key=lambda e: (phase_order[e[0]], phase_order[e[1]])):
        events = sorted(labels[(source, target)], key=event_order.__getitem__)
        lines.append(f"    {source} --> {target}: {', '.join(events)}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(mermaid(load_rows()))
