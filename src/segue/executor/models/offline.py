"""The model that answers when no API key is given (``segue chat`` and ``segue serve``): the
offline scripted model, its replies sized to each conversation's window.

A reply of fixed size crosses a small window's thresholds in one step: at 3,000 tokens, a
1,200-character reply took the meter from 74% to 88%, or from 76% to 96% past the warning's
whole band (80% to 90%) without ever showing it. Here a turn moves the meter by about
``TURN_SHARE`` of the window (a turn with a tool round by a few points more, and none runs in a
window under ``TOOLS_FROM`` tokens, where a tool round alone is a tenth of it), so whatever
window a person picks, some turn ends in the warning's band before the limit.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from segue.executor.model_port import BaseLlmModel, LlmReply, LlmRequest
from segue.executor.models.scripted import ScriptedModel
from segue.statemachine.accounting import BYTES_PER_TOKEN

OFFLINE_WINDOW: Final = 24_000
"""The window of a conversation created without one."""
TURN_SHARE: Final = 0.06
"""A turn's share of its conversation's window (a short message and its reply)."""
TURN_OVERHEAD: Final = 23
"""Tokens of a turn besides the reply's text: a short user message and both messages' framing."""
SHORTEST_REPLY, LONGEST_REPLY = 30, 1_200
"""Characters a reply holds at least and at most."""
TOOLS_FROM: Final = 2_000
"""The smallest window in which the offline model calls its tool."""
_MODELS_KEPT: Final = 64


def reply_chars(window: int) -> int:
    """How long a reply is in a conversation of ``window`` tokens."""
    wanted = (int(window * TURN_SHARE) - TURN_OVERHEAD) * BYTES_PER_TOKEN
    return max(SHORTEST_REPLY, min(LONGEST_REPLY, wanted))


class OfflineModel(BaseLlmModel):
    """The scripted model for every window: one ``ScriptedModel`` per window in use, each
    refusing a prompt larger than its window as a provider would, and replying at
    ``reply_chars(window)``. ``tool_every``: call the first tool every that many turns (0:
    never); ``chunk_delay``: seconds between the pieces of a streamed reply."""

    reuses_prefix: bool = True
    """As ``ScriptedModel``: nothing is sent anywhere, so any shape of the limit's requests is
    answered (``summary_request="reuse_prefix"`` works offline)."""

    def __init__(self, *, tool_every: int = 0, chunk_delay: float = 0.0) -> None:
        self.tool_every = tool_every
        self.chunk_delay = chunk_delay
        self._models: OrderedDict[int, ScriptedModel] = OrderedDict()

    def _model(self, window: int) -> ScriptedModel:
        found = self._models.get(window)
        if found is None:
            found = self._models[window] = ScriptedModel(
                window=window,
                reply_chars=reply_chars(window),
                tool_every=self.tool_every if window >= TOOLS_FROM else 0,
                chunk_delay=self.chunk_delay,
            )
            if len(self._models) > _MODELS_KEPT:
                self._models.popitem(last=False)
        self._models.move_to_end(window)
        return found

    async def complete(self, request: LlmRequest) -> LlmReply:
        """Answer as the scripted model of the request's window."""
        return await self._model(request.context_window or OFFLINE_WINDOW).complete(request)

    async def context_window(self, model: str) -> int | None:
        """Every model's window offline (a conversation may be created with another)."""
        return OFFLINE_WINDOW


__all__ = ["OFFLINE_WINDOW", "TOOLS_FROM", "OfflineModel", "reply_chars"]
