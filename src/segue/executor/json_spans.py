"""Where the parts of a JSON object's text lie, found without parsing it: an import validates a
large document a message at a time (see ``documents``), so no tree of the whole is ever built.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Any, Final

_TOKEN: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},]')
"""What the scan of a document's text stops at: strings (whose brackets are text), brackets
and commas."""


def spans_of(  # noqa: PLR0912  # one scan, a case per token and depth
    text: bytes | bytearray,
    lists: Collection[bytes],
) -> tuple[dict[bytes, tuple[int, int]], dict[bytes, list[tuple[int, int]]]] | None:
    """Where each top-level value of ``text`` lies, and each item of the lists under the keys
    ``lists`` (quoted, as in the text); None unless ``text`` is one JSON object with only whitespace
    around it."""
    values: dict[bytes, tuple[int, int]] = {}
    items: dict[bytes, list[tuple[int, int]]] = {}
    depth, key, start, wanting_key = 0, b"", 0, False
    listed: list[tuple[int, int]] | None = None
    item_start = 0
    for token in _TOKEN.finditer(text):
        first = text[token.start()]
        if first == 0x22:  # a string
            if depth == 1 and wanting_key:
                key, wanting_key = token.group(), False
                start = text.index(b":", token.end()) + 1
        elif first in b"[{":
            if depth == 0 and (first != 0x7B or text[: token.start()].strip()):
                return None
            if (
                depth == 1
                and first == 0x5B
                and key in lists
                and not text[start : token.start()].strip()
            ):
                listed = items[key] = []
                item_start = token.end()
            depth += 1
            wanting_key = wanting_key or depth == 1
        elif first in b"]}":
            if depth == 2 and listed is not None and first == 0x5D:
                if text[item_start : token.start()].strip():
                    listed.append((item_start, token.start()))
                listed = None
            if depth == 1:
                if key:
                    values[key] = (start, token.start())
                if text[token.end() :].strip():
                    return None
            depth -= 1
        elif depth == 1:  # a comma between values
            values[key] = (start, token.start())
            wanting_key = True
        elif depth == 2 and listed is not None:  # a comma between items
            listed.append((item_start, token.start()))
            item_start = token.end()
    return (values, items) if depth == 0 and values else None


def too_deep(problems: Sequence[Any]) -> bool:
    return any("recursion limit" in str(problem.get("msg", "")) for problem in problems)
