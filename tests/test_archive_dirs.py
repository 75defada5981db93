"""Directories segue creates for transcripts are private; ones it is given are left alone.

A compaction archive holds a whole transcript. Every directory segue makes on the way to it is
0700 (not only the last one), an existing directory keeps the mode its owner chose, and one that
others could write to (or that another user owns) is refused: the archive is not written there,
the refusal is logged, and the compaction goes on (an archive never blocks it).
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from segue import ContextExhaustionBehavior, LlmReply, MemoryStore, Runtime, ScriptedModel, Usage
from segue.agent_sdk.archive import archive_transcript
from segue.executor.archive import private_directory, write_archive
from segue.statemachine import Message
from segue.testing.logs import capture_logs


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_every_directory_segue_creates_is_private(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "archives"
    old_umask = os.umask(0o022)  # the usual umask: mkdir's mode alone would give 0755 parents
    try:
        write_archive(target, "c1", 1, [Message(kind="user", text="hi")])
    finally:
        os.umask(old_umask)
    for part in (tmp_path / "a", tmp_path / "a" / "b", target):
        assert _mode(part) == 0o700, part
    (archive,) = target.iterdir()
    assert _mode(archive) == 0o600


def test_an_existing_directory_keeps_its_mode(tmp_path: Path) -> None:
    shared = tmp_path / "archives"
    shared.mkdir()
    shared.chmod(0o755)
    write_archive(shared, "c1", 1, [Message(kind="user", text="hi")])
    assert _mode(shared) == 0o755
    (archive,) = shared.iterdir()
    assert _mode(archive) == 0o600


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o777, 0o1777])
def test_a_directory_others_can_write_to_is_refused(tmp_path: Path, mode: int) -> None:
    open_dir = tmp_path / "archives"
    open_dir.mkdir()
    open_dir.chmod(mode)
    with pytest.raises(PermissionError, match="writable by others"):
        private_directory(open_dir)
    with pytest.raises(PermissionError):
        write_archive(open_dir, "c1", 1, [Message(kind="user", text="hi")])
    assert list(open_dir.iterdir()) == []
    assert _mode(open_dir) == mode  # refused, not "fixed" behind the owner's back


def test_a_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root can give a directory to another user")  # CI runs as root
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)  # nobody
    with pytest.raises(PermissionError, match="another user"):
        private_directory(theirs)


def test_the_sdk_transcript_copy_follows_the_same_rules(tmp_path: Path) -> None:
    source = tmp_path / "session.jsonl"
    source.write_text('{"type": "user"}\n', encoding="utf-8")
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(PermissionError):
        asyncio.run(archive_transcript(open_dir, source, conversation_id="c1"))
    nested = tmp_path / "x" / "y"
    path, size = asyncio.run(archive_transcript(nested, source, conversation_id="c1"))
    assert size == source.stat().st_size
    assert (_mode(tmp_path / "x"), _mode(nested), _mode(path)) == (0o700, 0o700, 0o600)


def test_compaction_goes_on_when_the_archive_directory_is_refused(tmp_path: Path) -> None:
    open_dir = tmp_path / "archives"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    script = [
        LlmReply(text="First answer.", usage=Usage(input_tokens=1_000, output_tokens=10)),
        LlmReply(text="Second answer.", usage=Usage(input_tokens=9_500, output_tokens=10)),
        LlmReply(text="SUMMARY: what was said."),
    ]

    async def main() -> None:
        model = ScriptedModel(script, window=10_000)
        async with Runtime(store=MemoryStore(), llm=model, archive_dir=open_dir) as rt:
            conv = await rt.create_conversation(
                model="claude-sonnet-4-5", behavior=ContextExhaustionBehavior.COMPACT_IN_PLACE
            )
            await rt.send(conv.id, "Hi.")
            with capture_logs() as logs:
                state = await rt.send(conv.id, "And then?")
        assert (state.phase.kind, state.generation) == ("idle", 2)
        failures = [e for e in logs if e["event"] == "archive_failed"]
        assert [e["error_type"] for e in failures] == ["PermissionError"]

    asyncio.run(main())
    assert list(open_dir.iterdir()) == []
