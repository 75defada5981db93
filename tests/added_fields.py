"""Fields the stored values gained since the release whose JSON and databases the tests pin.

Each has a default, so what the release wrote reads back with it (its default); what is written
now holds it too, after the fields the release wrote. The tests that pin the release's JSON
compare with these fields taken out, and check that they come last.
"""

from __future__ import annotations

from typing import Any, Final

ADDED_TO_CONFIG: Final[dict[str, Any]] = {
    "window_source": None,
    "compaction": "segue",
    "context_edits": [],
    "summary_request": "tool_less",
    "pause_after_turns": None,
    "pause_after_seconds": None,
}
"""``ConversationConfig``'s added fields and the default a config of the release reads back with:
where the window came from; the provider's compaction and context editing (REQ-SEG-048 to 050);
how the limit's requests are sent (REQ-SEG-055); the pause triggers (REQ-SEG-052, 053)."""
ADDED_TO_STATE: Final[dict[str, Any]] = {
    "compaction_fallback": False,
    "turns_since_resume": 0,
    "active_since": None,
}
"""``ConversationState``'s added fields and their defaults (the pause triggers' count and clock,
REQ-SEG-052 to 054)."""


ADDED_TO_MESSAGE: Final[dict[str, Any]] = {"copy_of": None, "summarises": None, "carried": 0}
"""``Message``'s added fields and their defaults: a copy's original, and a summary made again's
generation and kept tail (REQ-SEG-063, 064)."""


def _is_state(value: dict[str, Any]) -> bool:
    return "config" in value and "phase" in value


def _is_message(value: dict[str, Any]) -> bool:
    return "kept_messages" in value and "pinned" in value


def release_shape(value: Any, *, check_defaults: bool = False) -> Any:
    """``value`` (parsed JSON of a state, or of anything holding one) as the release wrote it:
    every added field taken out of each state and its config, each first checked to hold its
    default when ``check_defaults`` (what a value of the release reads back with)."""
    if isinstance(value, list):
        return [release_shape(v, check_defaults=check_defaults) for v in value]
    if not isinstance(value, dict):
        return value
    shaped = {k: release_shape(v, check_defaults=check_defaults) for k, v in value.items()}
    if _is_state(value):
        config = dict(shaped["config"])
        for added, part in ((ADDED_TO_CONFIG, config), (ADDED_TO_STATE, shaped)):
            for name, default in added.items():
                found = part.pop(name)
                assert not check_defaults or found == default, (name, found)
        shaped["config"] = config
    if _is_message(value):
        for name, default in ADDED_TO_MESSAGE.items():
            found = shaped.pop(name)
            assert not check_defaults or found == default, (name, found)
    return shaped


def added_last(value: Any) -> bool:
    """Whether, in every state and config, the added fields come after the release's own."""
    if isinstance(value, list):
        return all(added_last(v) for v in value)
    if not isinstance(value, dict):
        return True
    if _is_state(value):
        for names, part in ((ADDED_TO_STATE, value), (ADDED_TO_CONFIG, value["config"])):
            keys = list(part)
            own = [k for k in keys if k not in names]
            if keys[: len(own)] != own:
                return False
    if _is_message(value):
        keys = list(value)
        own = [k for k in keys if k not in ADDED_TO_MESSAGE]
        if keys[: len(own)] != own:
            return False
    return all(added_last(v) for v in value.values())
