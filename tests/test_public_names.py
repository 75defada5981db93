"""The names a user imports from ``segue`` keep importing, whatever moves inside the library.

The list is what the README, the docs and the examples import, and what the public contract
names (values, phases, events, effects, the runtime facade, its errors and updates). A module
that moves inside the package must not move a name out from under an application.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CONTRACT = {
    # values and the core
    "Usage", "ToolCall", "Message", "ContextExhaustionBehavior", "ErrorKind", "model_info",
    "ModelInfo", "new_conversation", "ConversationState", "ConversationOptions", "transition",
    "FALLBACK_SUMMARY",
    # phases
    "Idle", "LlmRequesting", "ToolExecuting", "AwaitingContinuation", "ContextExhausted",
    "Failed", "Paused", "AwaitingCheckpoint", "Compacting",
    # events
    "UserMessage", "LlmResponse", "LlmError", "ToolResult", "ContinuationResponse",
    "ContinuationFailed", "UserCancel", "ManualContinuation", "PauseRequested",
    "ResumeRequested",
    # effects the contract names (every effect stays importable from ``segue.effects``)
    "RequestLlm", "ExecuteTools", "RequestContinuation", "NotifyContextWarning",
    "NotifyContextExhausted", "RejectUserMessage",
    # the runtime, its ports, stores and adapters
    "Runtime", "SqliteStore", "MemoryStore", "PostgresStore", "AnthropicModel", "OpenAIModel",
    "ScriptedModel", "LlmModel", "LlmRequest", "LlmReply", "Store", "StoredConversation",
    "StoredMessage", "Tool", "ToolRegistry", "subagent_tool", "failure_of",
    # errors
    "SegueError", "ConversationExhaustedError", "MessageRejectedError", "InvalidMessageError",
    "ConversationNotFoundError", "LlmCallError", "StoreUnavailableError", "StoreLockedError",
    "StoreFullError", "ConversationBusyError", "InvalidMetadataError", "InvalidCursorError",
    "InvalidDocumentError", "ConversationPage",
    "ConversationPausedError", "ConversationFailedError", "MessageTooLargeError", "StoreError",
    # updates
    "Update", "TextUpdate", "DoneUpdate", "OccupancyUpdate", "WarningUpdate", "ExhaustedUpdate",
    "FailedUpdate", "Watch",
    # views (what a backend sends as JSON)
    "ConversationView", "DoneView", "update_json",
}  # fmt: skip


def _documented() -> set[str]:
    """Every name the README, the docs and the examples import from ``segue``."""
    names: set[str] = set()
    sources = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "examples").glob("*.py")]
    for source in sources:
        text = source.read_text()
        for match in re.finditer(r"from segue import \(([^)]*)\)|from segue import ([^\n]+)", text):
            listed = match.group(1) if match.group(1) is not None else match.group(2)
            for part in listed.split(","):
                name = part.split("#")[0].split(" as ")[0].strip()
                if name.isidentifier():
                    names.add(name)
    return names


DOCUMENTED = _documented()


def test_the_docs_import_names_this_test_reads() -> None:
    assert {"Runtime", "SqliteStore"} <= DOCUMENTED  # the reader above found the imports


@pytest.mark.parametrize("name", sorted(CONTRACT | DOCUMENTED))
def test_a_public_name_imports_from_segue(name: str) -> None:
    segue = importlib.import_module("segue")
    assert getattr(segue, name) is not None


def test_every_effect_imports_from_segue_effects() -> None:
    effects = importlib.import_module("segue.effects")
    for name in effects.__all__:
        assert getattr(effects, name) is not None, name
    assert "StartGeneration" in effects.__all__


def test_importing_segue_loads_no_runtime() -> None:
    """The pure core costs nothing more on import: the runtime's names load on first use."""
    heavy = ("segue.executor.runtime", "anthropic", "sqlite3")
    code = f"import sys, segue\nprint(','.join(m for m in {heavy!r} if m in sys.modules))"
    done = subprocess.run(  # noqa: S603  # this interpreter, a fixed program
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == ""
