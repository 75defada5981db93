"""The names a user imports from ``segue`` keep importing, whatever moves inside the library.

The list is what the README, the docs and the examples import, what the public contract names
(values, phases, events, effects, the runtime facade, its errors and updates), and every name
the earlier, larger face exported (``EARLIER``). A module that moves inside the package must
not move a name out from under an application. ``segue.__all__`` itself is the small face (what
an application calls); the rest is in ``segue.core``, ``segue.effects``, ``segue.updates``,
``segue.errors`` and ``segue.adapters``, each of whose names resolves.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import warnings
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


EARLIER = CONTRACT | {
    # the core's values, rules and machinery
    "AgentToolResultBlock", "AgentToolUseBlock", "Base64Source", "BUSY_PHASES",
    "CANCELLED_SUMMARY", "CHECKPOINT_PROMPT", "CONTEXT_FAILURES", "CheckpointFailed",
    "CheckpointResponse", "CompactionBlock", "CompactionFailed", "CompactionResponse",
    "CompactionUndoRequested", "ContentBlock", "ContinuationRedone", "ConversationConfig",
    "DocumentBlock", "ENDED_PHASES", "EVENT_TYPES", "Event", "GitState", "HANDLED_PAIRS",
    "ImageBlock", "MessageKind", "ModelSettings", "OPAQUE_SUMMARY", "PHASE_TYPES", "Phase",
    "PhaseKind", "PlainTextSource", "ProviderCompacted", "RECOVERABLE_ERRORS", "REQUEST_PHASES",
    "RedactedThinkingBlock", "RetryDue", "SessionSnapshot", "SummaryRedoRequested",
    "SummaryRequest", "TextBlock", "ThinkingBlock", "ToolUseBlock", "UrlSource",
    "WAITING_PHASES", "WindowSource", "accepts_message", "checkpoint_sections",
    "compile_resume_context", "continuation_prompt", "continues_in_new", "estimate_content",
    "estimate_tokens", "extract_checkpoint", "extract_decisions", "limit_tokens",
    "provider_compacts", "threshold_tokens",
    # effects
    "Effect", "AppendMessage", "ArchiveTranscript", "CancelRequest", "NotifyCompactionFailed",
    "NotifyFailed", "NotifyParent", "NotifyToolRoundLimit", "NotifyTruncated",
    "ReportAccountingAnomaly", "RequestCheckpoint", "RequestCompaction", "SaveSnapshot",
    "ScheduleRetry", "StartGeneration", "StartSession",
    # the runtime's ports, records and helpers
    "AgentToolActivity", "ProviderCompaction", "StreamingLlmModel", "TextSink", "ToolSink",
    "ToolSpec", "TransitionRecord", "current_conversation_id", "git_context",
    "SnapshotContext", "Link", "UsageReport",
    # errors and updates
    "ConcurrentUpdateError", "ConversationExistsError", "DuplicateMessageError",
    "InvalidTextError", "UnsupportedOptionError", "NotPausedError", "NoCompactionError",
    "CompactionDoesNotFitError", "SubAgentFailedError", "UpdatesLostError",
    "UserMessageUpdate", "ToolStartedUpdate", "ToolFinishedUpdate", "RetryUpdate",
    "PausedUpdate", "SessionUpdate", "CompactedUpdate", "NoticeUpdate", "ContextEditedUpdate",
    "FallbackUpdate",
}  # fmt: skip
"""Every name ``segue`` exported before its face was made small (0.1's ``__all__`` and the
effects it resolved besides)."""

FACE = {
    "Runtime", "MemoryStore", "SqliteStore", "PostgresStore", "Store", "AnthropicModel",
    "OpenAIModel", "ScriptedModel", "LlmModel", "Tool", "ToolRegistry", "subagent_tool",
    "failure_of", "ConversationOptions", "ContextExhaustionBehavior", "ConversationState",
    "Message", "Usage", "Update", "Watch", "update_json", "SegueError", "MessageRejectedError",
    "ConversationNotFoundError", "LlmCallError",
}  # fmt: skip
"""What an application calls: the whole of ``segue.__all__``."""

SUBMODULES = ("segue.core", "segue.effects", "segue.updates", "segue.errors", "segue.adapters")


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


@pytest.mark.parametrize("name", sorted(EARLIER | DOCUMENTED))
def test_a_public_name_imports_from_segue(name: str) -> None:
    """Each earlier name still imports from ``segue``, quietly (a warning would fail an
    application's tests that turn warnings into errors, as this suite does)."""
    segue = importlib.import_module("segue")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert getattr(segue, name) is not None


def test_earlier_names_import_quietly_in_a_fresh_interpreter() -> None:
    """From an interpreter that loaded nothing before: a face name, a core one, an effect, an
    error, an update and an adapter's, with warnings as errors and nothing printed."""
    code = (
        "import warnings; warnings.simplefilter('error')\n"
        "from segue import (Runtime, UserMessage, StartGeneration, StoreError, TextUpdate,\n"
        "    ToolSpec, Link)\n"
    )
    done = subprocess.run(  # noqa: S603  # this interpreter, a fixed program
        [sys.executable, "-W", "error", "-c", code],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == done.stderr == ""


def test_the_face_is_small() -> None:
    segue = importlib.import_module("segue")
    assert set(segue.__all__) == FACE
    assert len(segue.__all__) <= 30
    for name in segue.__all__:
        assert getattr(segue, name) is not None, name


@pytest.mark.parametrize("module_name", SUBMODULES)
def test_each_submodule_names_resolve(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert module.__all__
    for name in module.__all__:
        assert getattr(module, name) is not None, (module_name, name)


def test_every_earlier_name_has_a_home_beside_the_face() -> None:
    """An earlier name not in the face is in one of the submodules (or is one of a runtime's
    records, resolved from its own module), and ``segue.X`` is that very object."""
    segue = importlib.import_module("segue")
    homes = {
        name: module_name
        for module_name in SUBMODULES
        for name in importlib.import_module(module_name).__all__
    }
    elsewhere = {
        "ConversationPage", "StoredConversation", "StoredMessage", "TransitionRecord", "Link",
        "UsageReport", "git_context", "SnapshotContext", "current_conversation_id",
        "ConversationView", "DoneView",
    }  # fmt: skip
    for name in sorted(EARLIER - FACE - elsewhere):
        assert name in homes, name
        assert getattr(segue, name) is getattr(importlib.import_module(homes[name]), name), name


def test_one_error_tree() -> None:
    """Every error segue raises is a ``SegueError``, all of them in ``segue.errors`` (the lazy
    loader's and the adapters' errors too, under their earlier names)."""
    errors = importlib.import_module("segue.errors")
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.SegueError), name
    assert issubclass(errors.SubAgentFailedError, errors.SegueError)
    assert importlib.import_module("segue._lazy").MissingExtraError is errors.MissingExtraError
    executor_errors = importlib.import_module("segue.executor.errors")
    assert executor_errors.StoreError is errors.StoreError
    assert issubclass(errors.InvalidMetadataError, errors.InvalidInputError)
    assert issubclass(errors.InvalidInputError, ValueError)
    assert issubclass(errors.InvalidMessageError, errors.MessageRejectedError)
    assert issubclass(errors.InvalidMessageError, errors.InvalidInputError)
    assert issubclass(errors.NotPausedError, errors.ConversationStateError)


def test_the_adapters_module_gives_an_adapter_author_what_it_needs() -> None:
    adapters = importlib.import_module("segue.adapters")
    assert {"BaseLlmModel", "guarded", "LlmModel", "LlmRequest", "LlmReply"} <= set(
        adapters.__all__
    )
    model_port = importlib.import_module("segue.executor.model_port")
    assert adapters.BaseLlmModel is model_port.BaseLlmModel


def test_an_unknown_name_is_an_attribute_error() -> None:
    segue = importlib.import_module("segue")
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        _ = segue.NoSuchName


def test_every_effect_imports_from_segue_effects() -> None:
    effects = importlib.import_module("segue.effects")
    for name in effects.__all__:
        assert getattr(effects, name) is not None, name
    assert "StartGeneration" in effects.__all__


def test_importing_segue_loads_no_runtime() -> None:
    """The pure core costs nothing more on import: the runtime's names load on first use."""
    heavy = ("segue.executor", "anthropic", "sqlite3")
    code = f"import sys, segue\nprint(','.join(m for m in {heavy!r} if m in sys.modules))"
    done = subprocess.run(  # noqa: S603  # this interpreter, a fixed program
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == ""
