"""segue's command line: the offline demo, a chat with Claude, the server, an inspector, and
the keeping of conversations (delete, export, import, purge).

Every command is a thin shell over the public ``Runtime``, so what the demo shows is what an
embedding application gets. Each command lives in its own module and registers itself on
``app`` when imported here.
"""

from segue.cli import (  # noqa: F401  # each registers its commands
    chat,
    control,
    data,
    demo,
    diagram,
    evals,
    inspection,
    serve,
)
from segue.cli._app import app


def main() -> None:
    """The ``segue`` console script."""
    app()


__all__ = ["app", "main"]
