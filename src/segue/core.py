"""The pure core, as an application reads it: a conversation's options, state and phases, the
events it answers, the content blocks of its messages, and ``transition()``.

These are ``segue.statemachine``'s public names (no I/O, clock, randomness or logging behind
any of them); what the core asks the world to do is in ``segue.effects``.
"""

from segue.statemachine import *  # noqa: F403  # the core's public names, one home
from segue.statemachine import __all__ as _core

__all__ = [*_core]  # noqa: PLE0604  # the same names
