"""``segue diagram``: the state diagram, generated from the transition table."""

from __future__ import annotations

import typer

from segue.cli._app import app
from segue.statemachine.spec import load_rows, mermaid


@app.command()
def diagram() -> None:
    """Print the state diagram (Mermaid), generated from the transition table."""
    typer.echo(mermaid(load_rows()).rstrip("\n"))
