"""segue's command line: the offline demo, a chat with Claude, the server, and an inspector.

Every command is a thin shell over the public ``Runtime``, so what the demo shows is what an
embedding application gets. Each command lives in its own module and registers itself on
``app`` when imported here.
"""

from segue.cli import chat, control, demo, diagram, inspection, serve  # noqa: F401  # registers
from segue.cli._app import app


def main() -> None:
    """The ``segue`` console script."""
    app()


__all__ = ["app", "main"]
