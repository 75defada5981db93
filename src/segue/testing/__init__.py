"""Test tooling for code built on segue: hypothesis strategies and a stateful test machine.

Why it ships with the package: a chat backend that stores, replays or reimplements segue
conversations should be tested against the same promises segue tests itself against (as zarr
ships ``zarr.testing.stateful`` for store implementers). ``strategies`` generates segue's values,
including reachable states; ``stateful.ConversationMachine`` drives a transition function and
checks the invariants after every step::

    from hypothesis import settings
    from segue.testing import ConversationMachine

    TestConversationMachine = ConversationMachine.TestCase  # pytest collects it
    TestConversationMachine.settings = settings(max_examples=150, deadline=None)

``FakeAnthropicServer`` is a local Anthropic Messages API for tests of code that uses the real
``anthropic`` client, ``FakeOpenAIServer`` the same for the ``openai`` client (Chat Completions
and Responses), ``conformance`` checks any ``LlmModel`` adapter against such a fake, and
``capture_logs`` collects segue's log events as an application's
logging would receive them.

The strategies and the machine require ``hypothesis``, a dev dependency of segue (``pip install
segue[dev]``): every name is imported on first use, and those raise ``ImportError`` without it.
They are lazy so that the fake Anthropic server, ``segue.testing.anthropic_server`` (standard
library only), can be imported and run as ``python -m segue.testing.anthropic_server`` where
hypothesis is not installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from segue._lazy import lazy_getattr

if TYPE_CHECKING:  # the lazy names below, for type checkers (``X as X`` marks a re-export)
    from segue.testing.anthropic_server import FakeAnthropicServer as FakeAnthropicServer
    from segue.testing.live import live_server as live_server
    from segue.testing.logs import capture_logs as capture_logs
    from segue.testing.openai_server import FakeOpenAIServer as FakeOpenAIServer
    from segue.testing.stateful import ConversationMachine as ConversationMachine
    from segue.testing.stateful import InvariantError as InvariantError
    from segue.testing.stateful import Step as Step
    from segue.testing.strategies import EVENT_KINDS as EVENT_KINDS
    from segue.testing.strategies import TOOL_CALL_IDS as TOOL_CALL_IDS
    from segue.testing.strategies import EventSequence as EventSequence
    from segue.testing.strategies import TransitionFunction as TransitionFunction
    from segue.testing.strategies import configs as configs
    from segue.testing.strategies import conversations as conversations
    from segue.testing.strategies import event_sequences as event_sequences
    from segue.testing.strategies import events as events
    from segue.testing.strategies import events_for as events_for
    from segue.testing.strategies import states as states
    from segue.testing.strategies import tool_calls as tool_calls
    from segue.testing.strategies import usages as usages

_LAZY = {
    "FakeAnthropicServer": "segue.testing.anthropic_server",
    "FakeOpenAIServer": "segue.testing.openai_server",
    "capture_logs": "segue.testing.logs",
    "live_server": "segue.testing.live",
    "ConversationMachine": "segue.testing.stateful",
    "InvariantError": "segue.testing.stateful",
    "Step": "segue.testing.stateful",
    "EVENT_KINDS": "segue.testing.strategies",
    "TOOL_CALL_IDS": "segue.testing.strategies",
    "EventSequence": "segue.testing.strategies",
    "TransitionFunction": "segue.testing.strategies",
    "configs": "segue.testing.strategies",
    "conversations": "segue.testing.strategies",
    "event_sequences": "segue.testing.strategies",
    "events": "segue.testing.strategies",
    "events_for": "segue.testing.strategies",
    "states": "segue.testing.strategies",
    "tool_calls": "segue.testing.strategies",
    "usages": "segue.testing.strategies",
}


__getattr__ = lazy_getattr("segue.testing", _LAZY, globals())


__all__ = list(_LAZY)
