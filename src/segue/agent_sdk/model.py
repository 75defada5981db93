"""``AgentSdkModel``: a ``Runtime`` drives Claude Agent SDK sessions like any model.

The SDK runs the Claude Code agent loop: its own tools, its own session files, its own
compaction. segue keeps deciding what happens at the limit. How a request maps onto the SDK:

- **A turn is one query** in the conversation's SDK session, resumed by the session id segue
  keeps in the conversation's state (``provider_session``, REQ-SEG-032): the prompt is what the
  session has not seen yet (the new user message). A conversation without one (its first turn,
  or the first of a new session after a checkpoint restart) starts a new SDK session whose
  prompt is the whole view (the continuation prompt with the checkpoint, a child's seed).
- **Occupancy comes from the SDK's per-response usage** (see ``_reading``), checked as each
  response arrives: at the conversation's continuation threshold the query is interrupted
  (``client.interrupt()``) and answered with ``stop_reason="pause_turn"``, so segue's behaviour
  takes over mid-task (REQ-SEG-034) instead of after an autonomous query ran on.
- **The tool-less requests** (a continuation summary, a checkpoint) ask the same SDK session
  with no tools and one turn. **Compaction** is the SDK's own ``/compact``; a ``PreCompact``
  hook archives the session's transcript file first (``archive``), and the compaction comes back
  as a ``ProviderCompaction``. Where the behaviour is not ``COMPACT_IN_PLACE`` the SDK's own
  auto-compaction is turned off, so it never compacts a conversation whose policy is another.
- **Tools the SDK ran** are recorded in the reply's content as ``agent_tool_use`` and
  ``agent_tool_result`` blocks; segue's own tools are not offered to the SDK.

A query's failure becomes ``LlmCallError``: an API error (retryable when the status is), a
prompt too long (``context_overflow``), a CLI that cannot start (``fatal``). The CLI's own
retries are the CLI's (its ``CLAUDE_CODE_MAX_RETRIES``); segue retries what reaches it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Final

from claude_agent_sdk import (
    ClaudeAgentOptions,
    ClaudeSDKClient,
    ClaudeSDKError,
    CLIConnectionError,
    CLINotFoundError,
    HookMatcher,
)

from segue.agent_sdk._reading import QueryReader
from segue.agent_sdk.archive import archive_transcript
from segue.executor._log import get_logger
from segue.executor.errors import LlmCallError
from segue.executor.model_port import BaseLlmModel, LlmReply, LlmRequest
from segue.executor.models.call_errors import RETRYABLE_STATUS, redact, secrets_of
from segue.executor.models.calls import guarded
from segue.executor.models.windows import Window, table_window
from segue.statemachine import ContextExhaustionBehavior, Message

_log = get_logger("segue.agent_sdk")
_cli_log = logging.getLogger("segue.agent_sdk.cli")

CONTINUE_PROMPT: Final = "Continue the task from where you left off."
"""Sent when segue asks the session to go on with nothing new from the user (the first request
of a generation that resumes mid-task)."""
_OVERFLOW_REASONS: Final = frozenset({"prompt_too_long", "blocking_limit"})
_INTERRUPTED: Final = frozenset({"aborted_streaming", "aborted_tools"})
_MISSING_SESSION: Final = "No conversation found"
"""How the CLI says the session to resume does not exist."""
_SECRET_ENDS: Final = ("_API_KEY", "_AUTH_TOKEN", "_OAUTH_TOKEN")
"""Environment variables whose values are credentials (``ANTHROPIC_API_KEY``...)."""
_SEEN_BY_SESSION: Final = frozenset({"assistant", "summary"})
"""Message kinds the SDK session holds already (it wrote them): a resumed session is sent only
what comes after the last of them."""


class AgentSdkModel(BaseLlmModel):
    """An ``LlmModel`` whose requests are Claude Agent SDK queries (see the module docstring).

    ``options`` are the SDK's own (working directory, permission mode, allowed tools, ``env``
    with the API key or base URL, ``CLAUDE_CONFIG_DIR``...); per request the adapter sets the
    model, the session to resume, the system prompt (if the options set none), partial
    messages, and the hooks it needs, keeping any hooks given. ``archive_dir`` is where the
    ``PreCompact`` hook copies a session's transcript before the SDK compacts it (default:
    ``~/.segue/sdk-archives``). ``context_window`` is the window new conversations get when
    they are not given one: the window the CLI works with for the model (200,000 for
    ``claude-sonnet-4-6`` in the CLI, where segue's table says 1,000,000 for the API with its
    long-context option), so that segue's thresholds are fractions of the CLI's window.
    """

    def __init__(
        self,
        options: ClaudeAgentOptions | None = None,
        *,
        archive_dir: Path | str | None = None,
        context_window: int | None = None,
    ) -> None:
        if context_window is not None and context_window <= 0:
            msg = f"context_window must be a positive number of tokens, not {context_window}"
            raise ValueError(msg)
        self.options = options or ClaudeAgentOptions()
        self._window = context_window
        self.archive_dir = (
            Path(archive_dir)
            if archive_dir is not None
            else Path.home() / ".segue" / "sdk-archives"
        )

    async def context_window(self, model: str) -> int | None:
        """The window given to the constructor, else None: segue's table of models (the SDK has
        no model endpoint to ask)."""
        return self._window

    async def window(self, model: str) -> Window:
        """The window given to the constructor (``given``), else segue's table's (Claude's
        windows, the smallest of them for a model it does not know)."""
        if self._window is not None:
            return Window(self._window, "given")
        return table_window(model, "anthropic")

    async def complete(self, request: LlmRequest) -> LlmReply:
        """Run one query for ``request`` (see the module docstring); every failure is raised as
        ``LlmCallError``, with the credentials the CLI is given scrubbed from the whole
        exception chain (its errors carry its stderr)."""
        secrets = self._secrets()
        return await guarded(
            request,
            lambda: self._answer(request),
            to_error=lambda exc: _call_error(exc, secrets),
            secrets=secrets,
            log=_log,
        )

    def _secrets(self) -> tuple[str, ...]:
        """The credentials the CLI runs with: its own ``env``'s and those it inherits."""
        env = {**os.environ, **self.options.env}
        return secrets_of(*(value for name, value in env.items() if name.endswith(_SECRET_ENDS)))

    async def _answer(self, request: LlmRequest) -> LlmReply:
        """A session the SDK no longer has (its files were removed, ``HOME`` changed) is not the
        end of the conversation: the query runs again in a new session, sent segue's own view
        of the history instead."""
        try:
            return await self._query(request)
        except _SessionMissing:
            _log.warning(
                "sdk_session_missing",
                conversation_id=request.conversation_id,
                session_id=request.provider_session,
            )
            return await self._query(dataclasses.replace(request, provider_session=None))

    async def _query(self, request: LlmRequest) -> LlmReply:
        turn = request.purpose == "turn"
        reader = QueryReader(
            stop_at=request.stop_at_tokens if turn else None,
            on_text=request.on_text if turn else None,
            on_tool=request.on_tool if turn else None,
        )
        options = self._options(request)
        prompt = _prompt(request)
        try:
            async with ClaudeSDKClient(options=options) as client:
                await client.query(prompt)
                async for message in client.receive_response():
                    if reader.take(message):
                        _log.info(
                            "sdk_query_stopped_at_threshold",
                            conversation_id=request.conversation_id,
                            context_tokens=reader.occupancy,
                            threshold=request.stop_at_tokens,
                        )
                        await client.interrupt()
        except ClaudeSDKError as error:
            if request.provider_session and _MISSING_SESSION in str(error):
                raise _SessionMissing from error
            raise
        _log_query(request, reader)
        return _reply(request, reader)

    # ------------------------------------------------------------------ options

    def _options(self, request: LlmRequest) -> ClaudeAgentOptions:
        base = self.options
        env = dict(base.env)
        if request.behavior is not ContextExhaustionBehavior.COMPACT_IN_PLACE:
            env.setdefault("DISABLE_AUTO_COMPACT", "1")  # segue's policy decides, not the SDK's
        if request.context_window is not None:
            # The CLI refuses locally some way below the window (about 88% of 200k); segue's
            # threshold and the summary requests after it are above that. The provider still
            # refuses a prompt that does not fit, which segue hears as an overflow.
            env.setdefault("CLAUDE_CODE_BLOCKING_LIMIT_OVERRIDE", str(request.context_window))
        hooks: dict[Any, list[HookMatcher]] = {k: list(v) for k, v in (base.hooks or {}).items()}
        hooks.setdefault("PreCompact", []).append(
            HookMatcher(hooks=[self._archive_hook(request.conversation_id)])
        )
        changes: dict[str, Any] = {
            "model": request.model,
            "resume": request.provider_session,
            "include_partial_messages": True,
            "hooks": hooks,
            "env": env,
        }
        if base.stderr is None:
            changes["stderr"] = _cli_log.debug  # the CLI's stderr, never the host's own
        if request.system is not None and base.system_prompt is None:
            changes["system_prompt"] = request.system
        if request.purpose in ("continuation", "checkpoint"):
            changes.update(tools=[], max_turns=1)
        return dataclasses.replace(base, **changes)

    def _archive_hook(self, conversation_id: str) -> Any:
        directory = self.archive_dir

        async def archive(input_data: Any, tool_use_id: str | None, context: Any) -> dict[str, Any]:
            """Copy the transcript the SDK is about to compact; never block the compaction."""
            source = input_data.get("transcript_path") if isinstance(input_data, dict) else None
            trigger = input_data.get("trigger") if isinstance(input_data, dict) else None
            try:
                path, size = await archive_transcript(
                    directory, Path(str(source)), conversation_id=conversation_id
                )
            except (OSError, ValueError, TypeError) as error:
                _log.error(
                    "sdk_transcript_not_archived",
                    conversation_id=conversation_id,
                    trigger=trigger,
                    error_type=type(error).__name__,
                )
                return {}
            _log.info(
                "sdk_transcript_archived",
                conversation_id=conversation_id,
                trigger=trigger,
                path=str(path),
                size_bytes=size,
            )
            return {}

        return archive


# --------------------------------------------------------------------------- the prompt


def _prompt(request: LlmRequest) -> str | AsyncIterator[dict[str, Any]]:
    """What the query sends: ``/compact``; an instruction; or the messages the session lacks."""
    if request.purpose == "compaction" and request.provider_session is not None:
        return "/compact"
    resumed = request.provider_session is not None
    if request.purpose != "turn":
        if resumed:
            return request.instruction or CONTINUE_PROMPT
        # No SDK session holds the history: it goes with the instruction, as text.
        history = _render(request.messages)
        return "\n\n".join(part for part in (history, request.instruction or "") if part)
    messages = _unseen(request.messages) if resumed else list(request.messages)
    if request.instruction:
        messages.append(Message(kind="user", text=request.instruction))
    if not messages:
        return CONTINUE_PROMPT
    if not any(message.content for message in messages):
        return _render(messages) or CONTINUE_PROMPT
    return _one_user_message(messages)


def _unseen(messages: Sequence[Message]) -> list[Message]:
    """The messages after the last one the SDK session wrote itself."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].kind in _SEEN_BY_SESSION:
            return list(messages[index + 1 :])
    return list(messages)


def _render(messages: Sequence[Message]) -> str:
    """Messages as one prompt's text; earlier answers are marked as such."""
    parts = []
    for message in messages:
        if not message.text.strip():
            continue
        if message.kind == "assistant":
            parts.append(f"[Your earlier answer]\n{message.text}")
        elif message.kind == "tool_result":
            parts.append(f"[Tool result]\n{message.text}")
        else:
            parts.append(message.text)
    return "\n\n".join(parts)


async def _one_user_message(messages: Sequence[Message]) -> AsyncIterator[dict[str, Any]]:
    """The messages as one user message of content blocks (images and documents kept)."""
    blocks: list[dict[str, Any]] = []
    for message in messages:
        if message.content:
            blocks += [
                block.model_dump(mode="json", exclude_none=True) for block in message.content
            ]
        elif message.text.strip():
            blocks.append({"type": "text", "text": message.text})
    yield {
        "type": "user",
        "message": {"role": "user", "content": blocks},
        "parent_tool_use_id": None,
    }


# --------------------------------------------------------------------------- the answer


class _SessionMissing(Exception):  # noqa: N818  # a signal inside this module, not an error
    """The session to resume does not exist any more."""


def _reply(request: LlmRequest, reader: QueryReader) -> LlmReply:
    result = reader.result
    reason = getattr(result, "terminal_reason", None)
    if reader.overflow or reason in _OVERFLOW_REASONS:
        raise LlmCallError(
            f"the Claude Agent SDK session is too long for the window ({reason or 'refused'})",
            context_overflow=True,
        )
    stopped = reader.reached and reason in _INTERRUPTED
    if result is not None and result.is_error and not stopped and not reader.texts:
        if request.provider_session and _MISSING_SESSION in (result.result or ""):
            raise _SessionMissing
        status = result.api_error_status
        said = result.result or "; ".join(reader.notices) or ", ".join(result.errors or ())
        detail = (said or result.subtype)[:500]
        raise LlmCallError(
            f"the Claude Agent SDK query failed ({reason or result.subtype}): {detail}",
            retryable=status in RETRYABLE_STATUS,
            status_code=status,
        )
    if result is None and not reader.reached:
        msg = "the Claude Agent SDK query ended without a result"
        raise LlmCallError(msg, retryable=True)
    text = reader.text
    if request.purpose == "compaction":
        if not reader.compactions:
            # The CLI says why in a message of its own ("Error during compaction: ..."), which
            # is never taken for a summary.
            why = "; ".join(reader.notices) or text or "no compaction happened"
            msg = f"the Claude Agent SDK did not compact the session: {why[:300]}"
            raise LlmCallError(msg, retryable=True)
        text = reader.compactions[-1].summary
    return LlmReply(
        text=text,
        usage=reader.usage,
        stop_reason="pause_turn" if stopped else "end_turn",
        content=tuple(reader.content) if request.purpose == "turn" else (),
        session_ref=reader.session_id,
        compactions=tuple(reader.compactions),
    )


def _log_query(request: LlmRequest, reader: QueryReader) -> None:
    """One line per query: segue's occupancy beside the SDK's own aggregate, which sums every
    API call of the query and is what a reader of ``ResultMessage.usage`` would misread as the
    context (the seed system's "719% full")."""
    result = reader.result
    _log.info(
        "sdk_query",
        conversation_id=request.conversation_id,
        purpose=request.purpose,
        session_id=reader.session_id,
        context_tokens=reader.occupancy,
        sdk_aggregate_tokens=reader.aggregate,
        api_calls=reader.responses,
        stopped_at_threshold=reader.reached,
        compactions=[
            {"trigger": c.trigger, "measured": measured, "sdk_pre_tokens": c.pre_tokens}
            for c, measured in zip(reader.compactions, reader.measured_before, strict=True)
        ],
        terminal_reason=getattr(result, "terminal_reason", None),
    )


def _call_error(error: Exception, secrets: Sequence[str]) -> LlmCallError:
    """Any failure of a query as segue's: no CLI is a setup problem (fatal); a lost connection
    to it may be transient (retryable); a CLI that exited with an error is neither, nor is
    anything else the SDK raised."""
    said = redact(f"{type(error).__name__}: {error}", secrets)
    if not isinstance(error, ClaudeSDKError):
        return LlmCallError(f"unexpected {said[:600]} from the Claude Agent SDK")
    return LlmCallError(
        f"Claude Agent SDK: {said}"[:600],
        retryable=isinstance(error, CLIConnectionError) and not isinstance(error, CLINotFoundError),
        fatal=isinstance(error, CLINotFoundError),
    )
