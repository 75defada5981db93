"""Deleting a conversation, wherever it is kept: the store's rows and the files beside them.

``Runtime.delete_conversation`` and ``purge`` decide what goes and when (a turn that runs is
refused or cancelled first); this module does the deleting. Files go before rows: a crash in
between leaves the conversation in the store (its deletion can be asked again), never a
store without the conversation and its text still on disk under a name nobody can find again.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

from segue.executor._log import get_logger
from segue.executor.archive import archive_directory, remove_files
from segue.executor.claims import live_holder
from segue.executor.setup import Setup

_log = get_logger("segue.runtime")
_POLL: Final = 0.05
"""Seconds between two reads of a cancelled turn's claims."""


async def erase(setup: Setup, conversation_id: str) -> None:
    """Delete the conversation's archives and tool outputs, then its rows (one transaction);
    ``ConversationNotFoundError`` if the store has no such conversation (its files are
    removed all the same)."""
    directory = archive_directory(setup.archive_dir)
    removed = await asyncio.to_thread(remove_files, directory, conversation_id)
    if removed:
        _log.info("conversation_files_deleted", conversation_id=conversation_id, files=removed)
    await setup.store.delete(conversation_id)


async def wait_for_claims(setup: Setup, conversation_id: str, *, owner: str, within: float) -> None:
    """Wait until no other runtime holds a live claim on the conversation's work (a cancelled
    turn letting go), at most ``within`` seconds (its lease: by then the claim has lapsed, or
    its holder renewed it and still runs: the caller finds it busy)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        holder = live_holder((await setup.store.load(conversation_id)).pending)
        if holder is None or holder == owner:
            return
        await asyncio.sleep(_POLL)
