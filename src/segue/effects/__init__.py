"""Effects: what the core asks the world to do, as immutable data (public import path).

The classes are defined in ``segue.statemachine.effects`` because they are part of the core's
vocabulary (``transition()`` builds them); this package is where users import them from.
"""

from segue.statemachine.effects import *  # noqa: F403  # re-export the whole vocabulary
from segue.statemachine.effects import __all__ as __all__
