"""Transcript archives written before compaction: private files with names ids cannot steer.

Compaction discards history from what the model sees; the archive keeps it for people. A
conversation id comes from callers and may hold anything (``../../etc``, NUL, 10 kB of text), so
it never becomes a path as given: it is reduced to a safe slug plus a hash of the original.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from segue.statemachine import Message

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def safe_slug(conversation_id: str, *, limit: int = 48) -> str:
    """A filename-safe stand-in for ``conversation_id``: slug plus a hash, unique per id."""
    digest = hashlib.sha256(conversation_id.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    slug = _UNSAFE.sub("_", conversation_id).strip("_")[:limit] or "conversation"
    return f"{slug}-{digest}"


def private_directory(directory: Path) -> Path:
    """``directory``, created if missing (its missing parents too) and made 0700."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    return directory


def write_archive(
    directory: Path, conversation_id: str, generation: int, transcript: Sequence[Message]
) -> Path:
    """Write ``transcript`` as JSON lines to a new private file in ``directory`` (created 0700).

    The file is created with ``O_EXCL`` and mode 0600 and its resolved path is checked to lie in
    the directory; a unique suffix means two compactions never overwrite each other.
    """
    directory = private_directory(directory)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    name = f"{safe_slug(conversation_id)}.gen{generation}.{stamp}.{uuid.uuid4().hex[:8]}.jsonl"
    path = (directory / name).resolve()
    if path.parent != directory.resolve():
        msg = f"archive path escaped its directory: {name!r}"
        raise ValueError(msg)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        header = {"conversation_id": conversation_id, "generation": generation}
        handle.write(json.dumps(header) + "\n")
        for message in transcript:
            handle.write(message.model_dump_json() + "\n")
    return path
