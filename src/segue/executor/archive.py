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
import stat
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from segue.statemachine import Message

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def archive_directory(configured: Path | None) -> Path:
    """Where archives go: the runtime's ``archive_dir``, else ``~/.segue/archives``."""
    return configured if configured is not None else Path.home() / ".segue" / "archives"


def safe_slug(conversation_id: str, *, limit: int = 48) -> str:
    """A filename-safe stand-in for ``conversation_id``: slug plus a hash, unique per id."""
    digest = hashlib.sha256(conversation_id.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    slug = _UNSAFE.sub("_", conversation_id).strip("_")[:limit] or "conversation"
    return f"{slug}-{digest}"


def private_directory(directory: Path) -> Path:
    """``directory``, with every missing part of its path created 0700.

    A directory that exists is the application's: it keeps the mode its owner gave it (a
    0755 archive directory stays 0755; the files in it are 0600 either way), but one that
    someone else owns, or that group or others may write to, is refused with ``PermissionError``:
    another user could replace or read what is written there.
    """
    missing: list[Path] = []
    probe = directory
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for part in reversed(missing):
        try:
            part.mkdir(mode=0o700)
        except FileExistsError:
            continue  # made meanwhile by someone else: checked below like any existing one
        os.chmod(part, 0o700)  # the umask may have taken bits mkdir was given
    _check_private(directory)
    return directory


def _check_private(directory: Path) -> None:
    info = directory.stat()
    if not stat.S_ISDIR(info.st_mode):
        msg = f"the archive directory is not a directory: {directory}"
        raise NotADirectoryError(msg)
    if info.st_uid != os.geteuid():
        msg = f"the archive directory belongs to another user (uid {info.st_uid}): {directory}"
        raise PermissionError(msg)
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        msg = (
            f"the archive directory is writable by others (mode {stat.S_IMODE(info.st_mode):o}); "
            f"segue writes transcripts only where nobody else can: {directory}"
        )
        raise PermissionError(msg)


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


def remove_files(directory: Path, conversation_id: str) -> int:
    """Delete the conversation's archives and saved tool outputs from ``directory``; how many.

    Its files are found by name (every one starts with its ``safe_slug`` and a dot, which no
    other id's files share: the slug ends with a hash of the id), never by reading them; a
    directory that does not exist holds none."""
    prefix = f"{safe_slug(conversation_id)}."
    try:
        names = [entry.name for entry in os.scandir(directory) if entry.name.startswith(prefix)]
    except FileNotFoundError:
        return 0
    for name in names:
        (directory / name).unlink(missing_ok=True)
    return len(names)


def write_tool_output(
    directory: Path, conversation_id: str, tool_call_id: str, output: str
) -> Path:
    """Save a tool's whole output, before it is capped for the model, to a new private file in
    ``directory``; the file's path, which the cap's note names (REQ-SEG-043)."""
    directory = private_directory(directory)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    call = _UNSAFE.sub("_", tool_call_id).strip("_")[:40] or "call"
    name = f"{safe_slug(conversation_id)}.tool.{call}.{stamp}.{uuid.uuid4().hex[:8]}.txt"
    path = (directory / name).resolve()
    if path.parent != directory.resolve():
        msg = f"tool output path escaped its directory: {name!r}"
        raise ValueError(msg)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(output)
    return path
