"""Test tooling for code built on segue: hypothesis strategies and a stateful test machine.

Why it ships with the package: a chat backend that stores, replays or reimplements segue
conversations should be tested against the same promises segue tests itself against (as zarr
ships ``zarr.testing.stateful`` for store implementers). ``strategies`` generates segue's values,
including reachable states; ``stateful.ConversationMachine`` drives a transition function and
checks the invariants after every step::

    from segue.testing import ConversationMachine

    TestConversationMachine = ConversationMachine.TestCase  # pytest collects it

Requires ``hypothesis``, a dev dependency of segue (``pip install segue[dev]``); importing this
package without it raises ``ImportError``. The fake Anthropic server in
``segue.testing.anthropic_server`` is separate and needs only the standard library.
"""

from segue.testing.stateful import ConversationMachine, InvariantError, Step
from segue.testing.strategies import (
    EVENT_KINDS,
    TOOL_CALL_IDS,
    EventSequence,
    TransitionFunction,
    configs,
    conversations,
    event_sequences,
    events,
    events_for,
    states,
    tool_calls,
    usages,
)

__all__ = [
    "EVENT_KINDS",
    "TOOL_CALL_IDS",
    "ConversationMachine",
    "EventSequence",
    "InvariantError",
    "Step",
    "TransitionFunction",
    "configs",
    "conversations",
    "event_sequences",
    "events",
    "events_for",
    "states",
    "tool_calls",
    "usages",
]
