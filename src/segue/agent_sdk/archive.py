"""Copies of an SDK session's transcript, taken before the SDK compacts it.

The SDK's compaction replaces what the session sends with a summary; the transcript file it
keeps (``transcript_path`` in the ``PreCompact`` hook's input) is the only full record, and the
SDK may rewrite it. The copy is private (a 0700 directory, a 0600 file created with ``O_EXCL``),
keeps the source's extension, and is named from the conversation id reduced to a safe slug plus
a hash (``segue.executor.archive.safe_slug``), a time and a random part: neither the
conversation id nor the SDK's session id can steer it into another path, and two compactions
never overwrite each other.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
import uuid
from pathlib import Path

from segue.executor.archive import private_directory, safe_slug

_EXTENSION = re.compile(r"^\.[A-Za-z0-9]{1,12}$")


def _copy(directory: Path, source: Path, conversation_id: str) -> tuple[Path, int]:
    if not source.is_file():
        msg = f"the transcript to archive is not a file: {source}"
        raise ValueError(msg)
    target_dir = private_directory(directory)
    suffix = source.suffix if _EXTENSION.match(source.suffix) else ""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    name = f"{safe_slug(conversation_id)}.sdk.{stamp}.{uuid.uuid4().hex[:8]}{suffix}"
    path = target_dir / name
    if path.resolve().parent != target_dir.resolve():
        msg = f"archive path escaped its directory: {name!r}"
        raise ValueError(msg)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as out, source.open("rb") as given:
        shutil.copyfileobj(given, out)
        size = out.tell()
    return path, size


async def archive_transcript(
    directory: Path, source: Path, *, conversation_id: str
) -> tuple[Path, int]:
    """Copy ``source`` into ``directory`` (see the module docstring); the copy's path and size.

    Raises ``OSError`` or ``ValueError`` when it cannot: the caller logs it and lets the
    compaction go on (an archive that failed never blocks it)."""
    return await asyncio.to_thread(_copy, directory, source, conversation_id)
