"""Effects: what the core asks the world to do, as immutable data (see
``segue.statemachine.effects``, their home inside the core that builds them).

This is their public name: the executor and an application import them from here. A module of
re-exports one layer above the core, so the core never imports it and no import order matters.
"""

from segue.statemachine.effects import *  # noqa: F403  # the same classes, one name for users
from segue.statemachine.effects import __all__ as _effects

__all__ = [*_effects]  # noqa: PLE0604  # the same names
