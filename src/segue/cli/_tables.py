"""Tables that fit the terminal: a column a narrow screen has no room for is left out whole
(the least needed first), and the rest keep their width; never a column squeezed to nothing.

At 80 columns ``segue list`` once showed its model, behaviour, phase and token columns as empty
slivers: Rich shrinks columns to fit, down to nothing. Here each column says how much it is
needed and whether its text may wrap (a message, a title); columns are dropped, least needed
first, until the rest fit with their words whole, and only a wrapping column gives up width.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from rich import box
from rich.table import Table
from rich.text import Text

from segue.cli._output import printable

WRAPPED_AT_LEAST: Final = 16
"""The narrowest a wrapping column gets (a few words a line)."""
WRAPPED_COMFORTABLY: Final = 40
"""The width a wrapping column is given before a column of less need is left out for it."""
ESSENTIAL: Final = 7
"""Columns needed at least this much are left out only when even a squeezed table is too
wide (the rest go first, for the wrapping columns' comfort)."""
_EDGE, _BORDER = 3, 2
"""Characters each column costs besides its text (padding and separator), and the table's
outer edges."""


@dataclass(frozen=True, slots=True)
class Column:
    """A table's column: ``need`` ranks it (the lowest is left out first on a narrow screen),
    ``wraps``: its text may take several lines (a column that does not wrap keeps its cells
    on one line, whole)."""

    name: str
    need: int = 5
    wraps: bool = False


def _cell(value: object) -> str:
    return "-" if value is None else printable(str(value))


def _widths(column: Column, cells: Sequence[str]) -> tuple[int, int]:
    """The width ``column`` is comfortable at, and the least it can take: its widest line
    (a column that does not wrap keeps it), or for a wrapping column, a few words."""
    widest = max([len(column.name), *(len(cell) for cell in cells)])
    if not column.wraps:
        return widest, widest
    at_least = max(WRAPPED_AT_LEAST, len(column.name))
    return min(widest, max(WRAPPED_COMFORTABLY, at_least)), min(widest, at_least)


def fitted(
    title: str, columns: Sequence[Column], rows: Iterable[Sequence[object]], width: int
) -> Table:
    """A table of plain text (never markup: cells quote model output) within ``width``
    characters: the columns that fit, least needed left out first."""
    cells = [[_cell(value) for value in row] for row in rows]
    sizes = [_widths(column, [row[i] for row in cells]) for i, column in enumerate(columns)]
    kept = list(range(len(columns)))

    def too_wide(which: int) -> bool:
        return sum(sizes[i][which] + _EDGE for i in kept) + _BORDER > width

    def drop(at_most: int) -> None:
        """Leave out the least needed column below ``at_most`` (of equals, the rightmost)."""
        candidates = [i for i in reversed(kept) if columns[i].need < at_most]
        if candidates:
            kept.remove(min(candidates, key=lambda i: columns[i].need))

    while too_wide(0) and any(columns[i].need < ESSENTIAL for i in kept):
        drop(ESSENTIAL)
    while too_wide(1) and len(kept) > 1:
        drop(max(columns[i].need for i in kept) + 1)
    shown = Table(title=Text(printable(title)), box=box.SIMPLE_HEAD)
    for i in kept:
        column = columns[i]
        shown.add_column(
            column.name,
            no_wrap=not column.wraps,
            overflow="fold",
            min_width=sizes[i][1],
        )
    for row in cells:
        shown.add_row(*(Text(row[i]) for i in kept))
    return shown


__all__ = ["Column", "fitted"]
