"""Fields the stored values gained since the release whose JSON and databases the tests pin.

Each has a default, so what the release wrote reads back with it (its default); what is written
now holds it too, after the fields the release wrote. The tests that pin the release's JSON
compare with these fields taken out, and check that they come last and nowhere else.
"""

from __future__ import annotations

from typing import Any, Final

ADDED: Final = frozenset({"window_source"})
"""``ConversationConfig.window_source``: where the window came from."""


def without_added(value: Any) -> Any:
    """``value`` (parsed JSON) with every added field taken out, wherever it is nested."""
    if isinstance(value, dict):
        return {k: without_added(v) for k, v in value.items() if k not in ADDED}
    if isinstance(value, list):
        return [without_added(v) for v in value]
    return value


def added_last(value: Any) -> bool:
    """Whether every added field comes after the fields the release wrote, in every object."""
    if isinstance(value, dict):
        keys = list(value)
        seen_added = False
        for key in keys:
            if key in ADDED:
                seen_added = True
            elif seen_added:
                return False
        return all(added_last(v) for v in value.values())
    if isinstance(value, list):
        return all(added_last(v) for v in value)
    return True
