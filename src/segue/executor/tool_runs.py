"""Performing the effects that run code and write files: the tools a turn asked for (their
output capped, the whole of it kept as a private file when the runtime has an
``archive_dir``), and the archive a compaction writes of what it summarises.

``Performer`` hands these effects here; what they give back is the events the drive commits.
Neither writes to the store: a file that cannot be written is logged and never blocks the
conversation.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from segue.effects import ArchiveTranscript, ExecuteTools
from segue.executor._log import get_logger
from segue.executor.archive import archive_directory, write_archive, write_tool_output
from segue.executor.errors import ConversationNotFoundError
from segue.executor.setup import Setup
from segue.executor.store_port import LogReader, StoredConversation
from segue.statemachine import (
    Event,
    ToolCall,
    ToolExecuting,
    ToolResult,
    estimate_content,
    estimate_tokens,
)
from segue.statemachine.accounting import cap_text

current_conversation_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "segue_current_conversation_id", default=None
)
"""The conversation whose tools are running (read by the sub-agent tool to set a parent)."""

_log = get_logger("segue.runtime")  # its events are the runtime's, under one name


async def run_tools(setup: Setup, stored: StoredConversation, effect: ExecuteTools) -> list[Event]:
    """The results of the calls the conversation still waits for, run at once. Listeners hear
    of the tools from the commits that start them and record their results (``updates_of``),
    as a reader of the store does."""
    phase = stored.state.phase
    cid = stored.state.id
    waiting = set(phase.pending) if isinstance(phase, ToolExecuting) else set()
    calls = [call for call in effect.tool_calls if call.id in waiting]
    tools = setup.tools
    telemetry = setup.telemetry
    cap = stored.state.config.tool_output_cap

    async def run(call: ToolCall) -> ToolResult:
        span = telemetry.tool_begins(cid, call)
        result = await capped(setup, cid, await tools.run(call), cap)
        telemetry.tool_ends(span, result)
        return result

    token = current_conversation_id.set(cid)
    try:
        return list(await asyncio.gather(*(run(call) for call in calls)))
    finally:
        current_conversation_id.reset(token)


async def capped(setup: Setup, conversation_id: str, result: ToolResult, cap: int) -> ToolResult:
    """``result`` within the conversation's cap on tool output (REQ-SEG-043): its head and
    tail, and a note of what was cut. With an ``archive_dir`` the whole output is first
    saved as a private file, and the note names it. The core would cap an oversize result
    itself (without the file); capping here also keeps the event log small."""
    content = result.content
    text = result.output
    if (estimate_content(text, content) if content else estimate_tokens(text)) <= cap:
        return result
    saved_as: str | None = None
    directory = setup.archive_dir
    if directory is not None:
        saved_as = await saved(
            setup.store,
            "tool_output_not_saved",
            write_tool_output,
            directory,
            conversation_id,
            result.tool_call_id,
            text,
        )
    blocks = tuple(
        block.model_copy(update={"text": cap_text(block.text, cap, saved_as=saved_as)})
        if block.type == "text"
        else block
        for block in content
    )
    _log.info(
        "tool_output_capped",
        conversation_id=conversation_id,
        cap_tokens=cap,
        output_bytes=len(text.encode("utf-8")),
        saved=saved_as is not None,
    )
    return result.model_copy(
        update={"output": cap_text(text, cap, saved_as=saved_as), "content": blocks}
    )


async def archive(setup: Setup, stored: StoredConversation, effect: ArchiveTranscript) -> None:
    """Archive what this compaction is about to summarise: the transcript from the first
    message of ``effect.generation`` (its summary; the transcript's start for the first)
    to the last message now. Each compaction's archive takes over where the one before
    left off, so together they hold the whole transcript up to the last compaction, and
    each costs what its own generation holds, not the conversation's age."""
    directory = archive_directory(setup.archive_dir)
    cid = stored.state.id
    store = setup.store
    start = await store.generation_start(cid, None, effect.generation)
    read = await store.messages(cid, after_seq=start - 1, before_seq=stored.last_seq + 1)
    # Only the generation's own: the provider's compaction (REQ-SEG-048) appends the next
    # generation's summary and reply in the step that asks for this archive.
    transcript = list(
        itertools.takewhile(
            lambda message: message.generation == effect.generation,
            (m.message for m in read),
        )
    )
    path = await saved(
        store, "archive_failed", write_archive, directory, cid, effect.generation, transcript
    )
    if path is not None:
        _log.info("archived", conversation_id=cid, path=path)


async def saved(
    store: LogReader,
    failure: str,
    write: Callable[..., Path],
    directory: Path,
    cid: str,
    *args: Any,
) -> str | None:
    """Where ``write`` (an archive or a tool's output) put its private file, or None when it
    could not (logged as ``failure``): a file that cannot be written never blocks the
    conversation. A file written for a conversation that is gone by then (deleted by another
    process while its tool ran) is removed at once: a deletion removes the files it finds, and
    this one it could not have found (``retention``)."""
    writing = asyncio.ensure_future(asyncio.to_thread(write, directory, cid, *args))
    try:
        path = await asyncio.shield(writing)
    except (OSError, ValueError) as error:
        _log.error(failure, conversation_id=cid, error_type=type(error).__name__)
        return None
    except asyncio.CancelledError:
        # The work was cancelled (a cancel, or another process's deletion seen meanwhile) and
        # nothing will name the file: the thread goes on writing it, and it is removed then.
        writing.add_done_callback(_remove_written)
        raise
    try:
        await store.load(cid)
    except ConversationNotFoundError:
        await asyncio.to_thread(path.unlink, missing_ok=True)
        _log.info("file_of_deleted_conversation_removed", conversation_id=cid)
        return None
    except asyncio.CancelledError:
        path.unlink(missing_ok=True)
        raise
    return str(path)


def _remove_written(writing: asyncio.Future[Path]) -> None:
    """The file a cancelled write made, removed once the write ends."""
    if not writing.cancelled() and writing.exception() is None:
        writing.result().unlink(missing_ok=True)
