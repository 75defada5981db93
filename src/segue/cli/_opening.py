"""What ``segue chat`` says and refuses before its first message: the window its conversation
gets (as the core's ``initial_state`` will resolve it) and the options its model cannot honour
through this connection, refused before anything is stored.
"""

from __future__ import annotations

from rich.console import Console

from segue.cli._app import CliError
from segue.cli._output import say, window_words
from segue.executor.model_port import LlmModel
from segue.executor.models.windows import window_for
from segue.executor.requests import support_of
from segue.statemachine import ConversationState
from segue.statemachine.options import ConversationOptions


async def say_window(
    out: Console,
    llm: LlmModel,
    options: ConversationOptions,
    state: ConversationState | None,
    *,
    offline: bool,
) -> None:
    """The chat's first line: the window of ``state`` (the conversation resumed), else the one
    a conversation created with ``options`` gets, and where it came from (an assumed one said
    so; ``offline``: the scripted model's, unless given)."""
    if state is not None:
        tokens, source = state.context_window, state.config.window_source
    else:  # what creating the conversation will resolve (the core's resolved_window)
        window = await window_for(llm, options)
        tokens, source = window.tokens, window.source
    say(out, window_words(tokens, "offline" if offline and source != "given" else source))


def refuse_unsupported(llm: LlmModel, options: ConversationOptions) -> None:
    """A usage error, before anything is stored, for what the model cannot do through this
    connection (the runtime would refuse it at the first message, in a library's words)."""
    support = support_of(llm, options.model)
    if options.compaction == "provider" and not support.compaction:
        msg = (
            f"--compaction provider: {options.model}'s provider cannot compact it through this "
            "connection (offline, OpenAI's Chat Completions, or an older model): leave "
            "--compaction as segue"
        )
        raise CliError(msg, 2)
    unknown = [edit["type"] for edit in options.context_edits if edit["type"] not in support.edits]
    if unknown:
        msg = (
            f"--context-edits: {', '.join(unknown)} cannot be sent to {options.model} through "
            "this connection: leave them out"
        )
        raise CliError(msg, 2)
