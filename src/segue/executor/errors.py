"""The executor's errors: ``segue.errors``, the one tree every segue error belongs to.

Kept under this name because the executor's modules (and code written before ``segue.errors``
existed) import from here; the classes are the same objects.
"""

from segue.errors import *  # noqa: F403  # the one tree, under the executor's old name
from segue.errors import __all__ as _tree

__all__ = [*_tree]  # noqa: PLE0604  # the same names
