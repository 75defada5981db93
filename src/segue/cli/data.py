"""``segue delete``, ``export``, ``import`` and ``purge``: what a chat backend does with its
conversations, from the command line (``docs/data.md``), on the same store as ``segue serve``.

Each opens the store through a runtime that is never entered: it drives no turn and recovers
nobody's pending work. Deleting asks first unless ``--yes``; a conversation whose turn runs
(here or in another process) is never deleted. An export is written whole or not at all, to a
private file (0600); an import stores the whole conversation or nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from segue.cli._app import CliError, DbOption, app, run
from segue.cli._labels import (
    MetadataOption,
    YesOption,
    ask,
    checked_duration,
    duration,
    labels,
    metadata_of,
    said_duration,
)
from segue.cli._output import console, printable, say
from segue.cli._stores import (
    DatabaseUrlOption,
    StoreAt,
    existing_store,
    resolve,
    writable_store,
)
from segue.cli.inspection import IdArgument, plural
from segue.executor.errors import (
    ConversationBusyError,
    ConversationExistsError,
    InvalidDocumentError,
)
from segue.executor.models.scripted import ScriptedModel
from segue.executor.runtime import Runtime
from segue.executor.store_port import Store
from segue.views import ID_PATTERN, shown_title, title_of


@contextlib.asynccontextmanager
async def _runtime(where: StoreAt, *, create: bool = False) -> AsyncIterator[Runtime]:
    """A runtime over the store at ``where`` (made if new with ``create``), not entered: it
    performs no work, so no model answers (the scripted one stands in, never asked)."""
    store: Store = writable_store(where) if create else existing_store(where, read_only=False)
    runtime = Runtime(store=store, llm=ScriptedModel())
    try:
        yield runtime
    finally:
        await runtime.close()
        await store.close()


async def _title(runtime: Runtime, conversation_id: str) -> str:
    stored = await runtime.conversation(conversation_id)
    first = title_of(await runtime.messages(conversation_id))
    return shown_title(stored.metadata, first) or "(no message yet)"


def _busy(conversation_id: str) -> CliError:
    return CliError(
        f"conversation {conversation_id} is answering a turn (in this store's segue serve or "
        "segue chat): nothing was deleted; delete it once the turn ends, or cancel the turn "
        "there first",
        1,
    )


# --------------------------------------------------------------------------- delete


async def _delete(given: str, where: StoreAt, *, chain: bool, yes: bool) -> int:
    out = console()
    async with _runtime(where) as runtime:
        cid = await resolve(runtime.store, given)
        title = await _title(runtime, cid)
        links = [link.id for link in await runtime.lineage(cid)] if chain else [cid]
        what = f"conversation {cid} ({title!r})"
        if len(links) > 1:
            what += f" and the {len(links) - 1} others of its continuation chain"
        if not yes and not ask(
            f"delete {printable(what)}? Its messages cannot be read again.", out.width
        ):
            say(out, "nothing was deleted")
            return 1
        try:
            deleted = await runtime.delete_conversation(cid, chain=chain)
        except ConversationBusyError as error:
            raise _busy(error.conversation_id) from None
    say(out, f"deleted {plural(len(deleted), 'conversation')}: {', '.join(deleted)}")
    return 0


@app.command()
def delete(
    conversation_id: IdArgument,
    chain: Annotated[
        bool, typer.Option("--chain", help="Delete its whole continuation chain too.")
    ] = False,
    yes: YesOption = False,
    db: DbOption = Path("segue.db"),
    database_url: DatabaseUrlOption = None,
) -> None:
    """Delete a conversation: its messages, log, snapshots and files (asks first). One whose
    turn runs is refused."""
    raise typer.Exit(run(_delete(conversation_id, StoreAt(db, database_url), chain=chain, yes=yes)))


# --------------------------------------------------------------------------- export


def write_private(path: Path, content: bytes, *, replace: bool) -> None:
    """Write ``content`` to ``path`` readable by its owner only (0600), whole or not at all:
    a file of its own in the same directory first, moved over ``path`` once written."""
    if path.exists() and not replace:
        msg = f"{path} exists: choose another file, or pass --force to replace it"
        raise CliError(msg, 2)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as error:
        raise CliError(f"cannot write {path}: {error.strerror}", 2) from None
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, path)
    except OSError as error:
        partial.unlink(missing_ok=True)
        raise CliError(f"cannot write {path}: {error.strerror}", 1) from None


async def _export(given: str, where: StoreAt, *, to: Path | None, replace: bool) -> None:
    async with _runtime(where) as runtime:
        cid = await resolve(runtime.store, given)
        try:
            document = await runtime.export_conversation(cid)
        except ConversationBusyError:
            msg = f"conversation {cid} is answering a turn: export it once the turn ends"
            raise CliError(msg, 1) from None
    content = (json.dumps(document, ensure_ascii=False) + "\n").encode("utf-8")
    if to is None:
        sys.stdout.buffer.write(content)
        sys.stdout.flush()
        return
    write_private(to, content, replace=replace)
    messages = plural(len(document["messages"]), "message")
    say(console(), f"exported conversation {cid} ({messages}) to {to}")


@app.command()
def export(
    conversation_id: IdArgument,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", dir_okay=False, help="Write to this file (0600), not stdout."
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace the file if it exists.")] = False,
    db: DbOption = Path("segue.db"),
    database_url: DatabaseUrlOption = None,
) -> None:
    """Export a conversation as one JSON document (its state, messages, log, snapshots and
    metadata), for `segue import` here or elsewhere."""
    run(_export(conversation_id, StoreAt(db, database_url), to=output, replace=force))


# --------------------------------------------------------------------------- import


def _named(source: Path) -> str:
    return "stdin" if str(source) == "-" else str(source)


def _document(source: Path) -> Any:
    """The JSON ``source`` holds (``-``: stdin), or a usage error saying why not."""
    try:
        raw = sys.stdin.buffer.read() if str(source) == "-" else source.read_bytes()
    except OSError as error:
        raise CliError(f"cannot read {source}: {error.strerror}", 2) from None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise CliError(f"{_named(source)} is not JSON ({printable(str(error))})", 2) from None


async def _import(source: Path, where: StoreAt, *, new_id: str | None) -> None:
    if new_id is not None and (ID_PATTERN.fullmatch(new_id) is None):
        msg = f"--id {printable(new_id)!r} is not an id: letters, digits, '.', '_' and '-'"
        raise CliError(msg, 2)
    document = _document(source)
    async with _runtime(where, create=True) as runtime:
        try:
            state = await runtime.import_conversation(document, conversation_id=new_id)
        except InvalidDocumentError as error:
            said = printable(str(error)).removeprefix("cannot import this document: ")
            raise CliError(f"{_named(source)} is not a segue export: {said}", 2) from None
        except ConversationExistsError:
            taken = new_id or str(document.get("conversation", {}).get("id"))
            msg = (
                f"conversation {taken} is already in {where}: import it under another id "
                f"(--id NEW), or delete that one first (segue delete {taken})"
            )
            raise CliError(msg, 1) from None
        stored = await runtime.conversation(state.id)
        title = await _title(runtime, state.id)
    out = console()
    say(out, f"imported conversation {state.id} ({title!r}), {state.phase.kind}, into {where}")
    if stored.pending:
        say(out, f"  it has work pending: segue chat --conversation {state.id} finishes it")


@app.command("import")
def import_(
    file: Annotated[Path, typer.Argument(help="An export (`segue export`), or - for stdin.")],
    new_id: Annotated[
        str | None, typer.Option("--id", help="Store it under this id instead of its own.")
    ] = None,
    db: DbOption = Path("segue.db"),
    database_url: DatabaseUrlOption = None,
) -> None:
    """Import a conversation from an export: it goes on where it was."""
    run(_import(file, StoreAt(db, database_url), new_id=new_id))


# --------------------------------------------------------------------------- purge


async def _purge(
    asked: str, where: StoreAt, *, metadata: list[str] | None, yes: bool, vacuum: bool = False
) -> int:
    out = console()
    older_than = duration(asked)
    labelled = metadata_of(metadata)
    idle_for = said_duration(asked)
    among = f" labelled {labels(labelled)}" if labelled else ""
    async with _runtime(where) as runtime:
        before = time.time() - older_than
        found = await runtime.store.inactive(before=before, metadata=labelled)
        if not found:
            say(out, f"nothing to purge: no conversation{among} went unwritten for {idle_for}")
            if vacuum:
                await _vacuum(runtime, out)
            return 0
        which = f"{plural(len(found), 'conversation')}{among} nobody wrote to for {idle_for}"
        if not yes and not ask(
            f"delete {printable(which)}? Their messages cannot be read again.", out.width
        ):
            say(out, "nothing was deleted")
            return 1
        deleted = await runtime.purge(older_than=older_than, metadata=labelled)
        left = len(found) - deleted
        said = f"deleted {plural(deleted, 'conversation')}"
        if left > 0:
            said += f"; {left} answering a turn (or written to, or deleted, meanwhile) left alone"
        say(out, said)
        if vacuum:
            await _vacuum(runtime, out)
    return 0


async def _vacuum(runtime: Runtime, out: Console) -> None:
    """``--vacuum``: the store's files rewritten without deleted text, and said so."""
    if await runtime.vacuum():
        say(out, "vacuumed: the tables were rewritten without the deleted rows (VACUUM FULL)")
    else:
        say(out, "nothing to vacuum: this store overwrites deleted text as it deletes")


@app.command()
def purge(
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than",
            metavar="DURATION",
            callback=checked_duration,  # refused as it is parsed, before the store opens
            help="Delete what nobody wrote to for this long: 30d, 12h, 45m, 90s, 2w.",
        ),
    ],
    metadata: MetadataOption = None,
    vacuum: Annotated[
        bool,
        typer.Option(
            "--vacuum",
            help="Then rewrite the store's files without the deleted text (PostgreSQL: "
            "VACUUM FULL, which locks each table while it runs).",
        ),
    ] = False,
    yes: YesOption = False,
    db: DbOption = Path("segue.db"),
    database_url: DatabaseUrlOption = None,
) -> None:
    """Delete the conversations nobody wrote to for a while (retention; asks first)."""
    where = StoreAt(db, database_url)
    raise typer.Exit(run(_purge(older_than, where, metadata=metadata, yes=yes, vacuum=vacuum)))
