"""The default usage of a fake's scripted reply: left to the fake server, which counts it from
what it was sent (``prompt_cache``). Only the standard library, so the wire shapes that name it
(``openai_replies``) stay importable without segue's core."""

from __future__ import annotations

from typing import Final


class Measured:
    """A scripted reply's usage left to the fake: counted from what it was sent."""

    def __repr__(self) -> str:
        return "MEASURED"


MEASURED: Final = Measured()

__all__ = ["MEASURED", "Measured"]
