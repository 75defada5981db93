"""The instructions of the requests segue sends on its own: at the limit, and after a turn's
last tool round.

The limit's requests (the continuation summary, a restart's checkpoint, a pause at the limit,
the compaction summary) ask in segue's words unless the conversation has its own
(``summary_prompt``, REQ-SEG-040); a manual trigger's focus is added to either (REQ-SEG-041).
The second ask after an empty or refused answer keeps segue's other wording: the first one did
not work. Adapters get the result as ``LlmRequest.instruction`` and only append it.
"""

from __future__ import annotations

from segue.effects import RequestCheckpoint, RequestContinuation
from segue.statemachine import AwaitingCheckpoint, ConversationState

CONTINUATION_INSTRUCTION = (
    "The conversation context is nearly full, so this conversation will end here. Write a "
    "concise continuation summary that can seed a new conversation: the user's goal, what was "
    "done and decided, open questions, and the next steps. Plain text, no tool calls."
)
COMPACTION_INSTRUCTION = (
    "Summarise the conversation so far for your own future reference: the goal, facts learned, "
    "decisions, work completed and what remains. The most recent messages are kept verbatim "
    "after your summary, so focus on everything before them. Plain text, no tool calls."
)

FINAL_ANSWER_INSTRUCTION = (
    "You have used every tool call this turn allows, so no tool can be called now. Answer the "
    "user with what you have found so far, and say what is left to do, if anything."
)
"""Sent with the grace request of a turn that used its tool rounds (tools declared, none
callable)."""

ALTERNATE_CONTINUATION_INSTRUCTION = (
    "Please write a short factual record of this conversation for the user's own notes: what "
    "they asked for, what was answered or done, and what is still open. Plain text only."
)
"""Asked once more when the first continuation answer was empty or a refusal."""
ALTERNATE_COMPACTION_INSTRUCTION = (
    "Please write neutral notes on the conversation so far, for continuing it: the topics, the "
    "facts established, the work done and what remains. Plain text only."
)
"""Asked once more when the first compaction answer was empty or a refusal."""

FOCUS_NOTE = "\n\nThe user asked for this to focus above all on: {focus}"
"""Added to the limit's instruction when a manual trigger came with a focus (REQ-SEG-041)."""


def limit_instruction(default: str, state: ConversationState, focus: str | None) -> str:
    """The instruction of a request at the limit: the conversation's ``summary_prompt`` in
    place of segue's ``default`` (REQ-SEG-040), and the user's focus after it (REQ-SEG-041)."""
    base = state.config.summary_prompt or default
    return base + FOCUS_NOTE.format(focus=focus) if focus else base


def at_the_limit(state: ConversationState, effect: RequestContinuation | RequestCheckpoint) -> bool:
    """Whether the request is the one the behaviour sends at the limit (a continuation, a
    restart's checkpoint, a pause at the limit), not an orchestrator's pause checkpoint."""
    if isinstance(effect, RequestContinuation) or effect.purpose == "restart":
        return True
    phase = state.phase
    return isinstance(phase, AwaitingCheckpoint) and phase.exhausted
