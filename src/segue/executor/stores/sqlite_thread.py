"""``SqliteStore``'s thread: where reads, and writes that could block the event loop, run.

Why a hand-over of its own: ``run_in_executor`` adds locks and callbacks both ways, which cost
as much as a step's SQL. Jobs go in through a ``queue.SimpleQueue``; the thread takes every job
waiting when it wakes, runs consecutive writes of one group in one transaction (the group's
function, ``Runner``'s), and tells each event loop the outcomes of the lot in one
``call_soon_threadsafe``. ``Runner`` (``sqlite_runner``) decides what runs here.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

Outcome = tuple[Any, BaseException | None]
"""What a job gave: its result, or the error it raised."""
Step = Callable[[sqlite3.Connection], Any]
"""A write that runs inside a transaction the runner opens (and may share)."""
Told = dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any, Any]]]
"""Finished jobs' futures and outcomes, by the event loop that awaits them."""


class Job(NamedTuple):
    """Work for the thread and whom to tell. Without ``group``, ``work`` runs alone (``work()``:
    a read, a checkpoint); with it, ``work`` is a write ``Step`` that ``group`` runs with the
    steps of the same group queued next to it."""

    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    work: Callable[..., Any]
    group: Callable[[Sequence[Step]], list[Outcome]] | None = None


def settle(outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    """Hand each job's outcome to its caller (in the caller's loop, one call for them all)."""
    for future, result, error in outcomes:
        if future.cancelled():
            continue  # the caller gave up waiting; the work itself has run (or failed) regardless
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)


def _attempt(work: Callable[[], Any]) -> Outcome:
    try:
        return work(), None
    except BaseException as caught:  # noqa: BLE001  # delivered to the awaiting caller
        return None, caught


def _take_waiting(jobs: queue.SimpleQueue[Job | None], first: Job) -> tuple[list[Job], bool]:
    """``first`` and every job queued behind it; True if the store was closed meanwhile."""
    batch = [first]
    while True:
        try:
            job = jobs.get_nowait()
        except queue.Empty:
            return batch, False
        if job is None:
            return batch, True
        batch.append(job)


def _run_batch(batch: list[Job]) -> Told:
    """Run ``batch`` in order, consecutive write steps of one group together; the outcomes,
    by the loop to tell them to."""
    told: Told = {}
    index = 0
    while index < len(batch):
        job = batch[index]
        group = job.group
        if group is None:
            done = [job]
            outcomes = [_attempt(job.work)]
        else:
            end = index + 1
            while end < len(batch) and batch[end].group == group:
                end += 1
            done = batch[index:end]
            outcomes = group([j.work for j in done])
        for finished, (result, error) in zip(done, outcomes, strict=True):
            told.setdefault(finished.loop, []).append((finished.future, result, error))
        index += len(done)
    return told


def serve(jobs: queue.SimpleQueue[Job | None], using: threading.Lock) -> None:
    """The thread: take every waiting job, run them holding the connection, then tell each
    loop the outcomes in one call, until ``None`` (the store closed or was dropped)."""
    closed = False
    while not closed and (first := jobs.get()) is not None:
        batch, closed = _take_waiting(jobs, first)
        with using:
            told = _run_batch(batch)
        for loop, settled in told.items():
            with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody to tell
                loop.call_soon_threadsafe(settle, settled)
        del batch, first, told  # hold nothing of finished jobs while waiting for the next
