"""What a runtime was set up with: its store, model, tools and bounds, owned in one place.

Every part of the runtime (the drive loop, the request builder, the performer, the claims) reads
these from here each time it uses one, so a caller that assigns ``rt.llm`` or ``rt.store`` is
heard at the next request, by every part at once, without any of them keeping a copy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from segue.executor.model_port import LlmModel
from segue.executor.snapshots import SnapshotContext
from segue.executor.store_port import Store
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
