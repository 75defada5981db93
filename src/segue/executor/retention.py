"""Deleting a conversation, wherever it is kept: the store's rows and the files beside them.

``Runtime.delete_conversation`` and ``purge`` decide what goes and when (a turn that runs is
refused or cancelled first); this module does the deleting. One store transaction deletes every
conversation asked for (a chain all at once: a crash leaves all of it, and asking again deletes
all of it), and removes their files while it holds them locked, before it commits: a crash
before the commit leaves the conversations in the store (their deletion can be asked again),
never a store without them and their text still on disk under a name nobody can find again.

A file can still be written after that: a tool of another process that was running when the
conversation went saves its whole output once it returns. So the files are removed once more
after the commit, and a writer looks for its conversation after writing and removes its own
file when the conversation is gone (``perform``): whichever comes last removes it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Final

from segue.executor._log import get_logger
from segue.executor.archive import archive_directory, remove_files
from segue.executor.setup import Setup
from segue.executor.turn_holder import turn_of

_log = get_logger("segue.runtime")
_POLL: Final = 0.05
"""Seconds between two reads of a cancelled turn's claims."""


async def erase(
    setup: Setup,
    ids: Sequence[str],
    *,
    idle_before: float | None = None,
    metadata: Mapping[str, str] | None = None,
) -> list[str]:
    """Delete the conversations ``ids`` (the first must exist: ``ConversationNotFoundError``)
    with their archives and tool outputs, in one transaction; the ids deleted. With
    ``idle_before``/``metadata`` (a purge), only if the first is still last written before
    ``idle_before`` with that metadata, checked with it locked: ``[]`` otherwise."""
    directory = archive_directory(setup.archive_dir)

    def files(conversation_id: str) -> None:
        removed = remove_files(directory, conversation_id)
        if removed:
            _log.info("conversation_files_deleted", conversation_id=conversation_id, files=removed)

    deleted = await setup.store.delete(
        ids[0], also=ids[1:], idle_before=idle_before, metadata=metadata, files=files
    )
    for conversation_id in deleted:  # a late writer's file (see the module docstring)
        await asyncio.to_thread(files, conversation_id)
    return deleted


async def wait_for_claims(setup: Setup, conversation_id: str, *, owner: str, within: float) -> None:
    """Wait until no other runtime holds a live claim on the conversation's work (a cancelled
    turn letting go), at most ``within`` seconds (its lease: by then the claim has lapsed, or
    its holder renewed it and still runs: the caller finds it busy)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        stored = await setup.store.load(conversation_id)
        if turn_of(stored, owner=owner).where != "elsewhere":
            return
        await asyncio.sleep(_POLL)
