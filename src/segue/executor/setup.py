"""What a runtime was set up with: its store, model, tools and bounds, owned in one place.

Every part of the runtime (the drive loop, the request builder, the performer, the claims) reads
these from here each time it uses one, so a caller that assigns ``rt.llm`` is heard at the next
request, by every part at once, without any of them keeping a copy. The store is the runtime's
for its lifetime: the parts that only read and write through it are given it directly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from segue.executor.model_port import LlmModel
from segue.executor.snapshots import SnapshotContext
from segue.executor.store_port import Store
from segue.executor.telemetry import Telemetry
from segue.executor.tools import ToolRegistry


@dataclasses.dataclass(slots=True, kw_only=True, eq=False)
class Setup:
    """The runtime's dependencies and settings (see ``Runtime`` for each)."""

    store: Store
    llm: LlmModel
    tools: ToolRegistry
    archive_dir: Path | None
    keep_recent: int
    max_tokens: int | None
    snapshot_context: SnapshotContext | None
    clock: Callable[[], float]
    """The time commits are recorded at (never the core's: it has no clock)."""
    sleep: Callable[[float], Any]
    """How a retry's delay is waited out (a test passes one that returns at once)."""
    telemetry: Telemetry
    """Who is told of turns, model calls, tools and commits (``telemetry.NOTHING``: nobody)."""


class RuntimeSettings(TypedDict):
    """What a ``Runtime`` may be set up with besides its store, model and tools."""

    archive_dir: NotRequired[Path | str | None]
    """Where transcripts are archived before a compaction, and tool output beyond its cap is
    kept (private files); None: ``~/.segue/archives`` for archives, no tool-output files."""
    keep_recent: NotRequired[int]
    """Messages a compaction keeps verbatim (``transcript.DEFAULT_KEEP_RECENT``)."""
    max_tokens: NotRequired[int | None]
    """A bound on every answer, below each conversation's own."""
    snapshot_context: NotRequired[SnapshotContext | None]
    """Called with a conversation id when it pauses and when it resumes; what it returns (JSON
    data: task, test or git state; ``git_context(dir)`` is a built-in one) is stored with the
    snapshot and compiled into the resume context."""
    owner: NotRequired[str | None]
    """Who this runtime is in the store's claims (default: host, process id, a random part)."""
    lease: NotRequired[float]
    """Seconds a claim of this runtime lasts unless renewed (``claims.DEFAULT_LEASE``)."""
    clock: NotRequired[Callable[[], float]]
    """The time commits are recorded at (``time.time``)."""
    sleep: NotRequired[Callable[[float], Any]]
    """How a retry's delay is waited out (``asyncio.sleep``)."""
    tracer_provider: NotRequired[Any]
    """OpenTelemetry's tracer provider for segue's spans (the ``otel`` extra); None: the
    global one, once the application sets it."""
    meter_provider: NotRequired[Any]
    """OpenTelemetry's meter provider for segue's metrics; None: the global one."""
    capture_content: NotRequired[bool]
    """Put message text in the model calls' spans (``gen_ai.input.messages``,
    ``gen_ai.output.messages``); off unless asked: transcripts stay out of traces."""
    store_metrics_rate: NotRequired[float]
    """The share of commits (0 to 1) whose duration ``segue.store.commit.duration`` records;
    0.1 by default: a record per commit was the largest single cost of a traced turn, and a
    uniform sample keeps the histogram's quantiles (its counts are the share's)."""
