"""What the REST API takes and gives: thin views of segue's own values.

The views of conversations, messages and snapshots are ``segue.views`` (shared with the CLI's
``--json``). Requests are validated here (unknown fields refused, empty text refused
before it reaches the runtime), so a client's mistake is a 422 with the field named.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    field_validator,
    model_validator,
)

from segue.executor.bounds import (
    MAX_ID_LENGTH,
    MAX_METADATA_KEY,
    MAX_METADATA_KEYS,
    MAX_METADATA_VALUE,
    checked_metadata,
)
from segue.statemachine import ContextExhaustionBehavior, SummaryRequest
from segue.statemachine.options import MIN_WINDOW, ConversationOptions, check_window
from segue.statemachine.state import MAX_PROMPT_CHARS, Compaction
from segue.views import (
    ID_PATTERN,
    ConversationView,
    LinkView,
    MessageView,
    SnapshotView,
    ToolCallView,
)

MAX_RUN_SECONDS: Final = 366 * 24 * 3600
"""The longest run bound a conversation may be given (a year): anything longer is no bound."""

Instruction = Annotated[str, Field(min_length=1, max_length=MAX_PROMPT_CHARS, pattern=r"\S")]
"""Text for the limit's request (a summary prompt, a focus): not only whitespace."""


class _Request(BaseModel):
    # Strict: a JSON body says its types (``"pinned": 0`` is not a bool, ``"3"`` not a number);
    # a number where a float is asked is still one.
    model_config = ConfigDict(extra="forbid", strict=True)


def storable_metadata(metadata: dict[str, str]) -> dict[str, str]:
    """``metadata`` if a store can keep it (the runtime's bounds, and text UTF-8 can encode:
    JSON can carry a lone surrogate, which no database takes), else a ``ValueError`` saying
    what to change: refused with a 422 before anything is stored."""
    for key, value in metadata.items():
        for text in (key, value):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                msg = f"metadata {key[:40]!r} holds a lone surrogate, which no store can keep"
                raise ValueError(msg) from None
    return checked_metadata(metadata)


Metadata = Annotated[
    dict[
        Annotated[str, Field(min_length=1, max_length=MAX_METADATA_KEY)],
        Annotated[str, Field(max_length=MAX_METADATA_VALUE)],
    ],
    Field(max_length=MAX_METADATA_KEYS),
    AfterValidator(storable_metadata),
]
"""The application's labels of a conversation (``{"user": "u-17", "title": "Tides"}``):
string keys of 1 to 64 characters and values of at most 1,024, at most 64 pairs, no NUL."""
ConversationId = Annotated[
    str, Field(min_length=1, max_length=MAX_ID_LENGTH, pattern=f"^{ID_PATTERN.pattern}$")
]
"""An id the application chooses (an import's): ``segue.views.ID_PATTERN``."""


_OPTIONS: Final = ConversationOptions.model_fields


class CreateConversation(ConversationOptions):
    """A new conversation: ``ConversationOptions`` (every field may be left out: the server's
    model, behaviour and window apply), within the bounds a server keeps."""

    # Optional here: left out, the server's model and behaviour apply.
    model: Annotated[str, Field(min_length=1, max_length=200)] | None = None  # type: ignore[assignment]
    behavior: ContextExhaustionBehavior | None = None  # type: ignore[assignment]
    system: Annotated[str, Field(max_length=100_000)] | None = None
    context_window: Annotated[StrictInt, Field(ge=MIN_WINDOW, le=10_000_000)] | None = None
    """Tokens (at least 1,000, as the page and the CLI ask); left out: the model's window."""
    max_run_seconds: Annotated[StrictFloat, Field(gt=0, le=MAX_RUN_SECONDS)] | None = None
    """``checkpoint_restart``: past this many seconds, the limit ends the run."""
    # The options' numbers again, strict: a JSON body says its types ("0.8" is not a number).
    warning_threshold: Annotated[float, Field(gt=0, le=1, strict=True)] = _OPTIONS[
        "warning_threshold"
    ].default
    continuation_threshold: Annotated[float, Field(gt=0, le=1, strict=True)] = _OPTIONS[
        "continuation_threshold"
    ].default
    retry_base_delay: Annotated[float, Field(ge=0, le=600, strict=True)] = _OPTIONS[
        "retry_base_delay"
    ].default
    retry_max_delay: Annotated[float, Field(ge=0, le=3600, strict=True)] = _OPTIONS[
        "retry_max_delay"
    ].default
    temperature: Annotated[float, Field(ge=0, le=1, strict=True)] | None = None
    metadata: Metadata | None = None
    """The application's labels (``{"user": "u-17", "title": "Tides"}``): what it finds the
    conversation by later; a ``title`` is shown as the conversation's title."""

    def options(self, server: Info, *, given: set[str]) -> ConversationOptions:
        """The conversation's options, with the server's own (``server``: its model,
        behaviour, window and bounds) where the request left them out (``given``: the fields
        the request set; a value does not say whether it was set or defaulted)."""
        model, behavior, context_window = server.model, server.behavior, server.context_window
        dumped = self.model_dump(exclude={"metadata"})
        asked = {name: value for name, value in dumped.items() if name in given}
        fields = {**server.limits, **asked}
        fields["model"] = self.model or model
        fields["behavior"] = self.behavior or behavior
        if self.context_window is None and context_window is not None:
            fields["context_window"] = context_window
        compacts = fields["behavior"] == ContextExhaustionBehavior.COMPACT_IN_PLACE
        if "compaction" not in given and compacts:  # the server's only where it applies
            fields["compaction"] = server.compaction
        if "context_edits" not in given:
            fields["context_edits"] = server.context_edits
        if "summary_request" not in given:
            fields["summary_request"] = server.summary_request
        return ConversationOptions(**fields)

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        """Nothing yet: how the options fit together (the thresholds, the compaction and the
        behaviour, the model's settings) is checked once, on the options ``options`` completes
        with the server's own (a request's ``compaction="provider"`` on a server whose
        behaviour is ``compact_in_place`` is sound), by the options' own check."""
        return self

    @field_validator("context_window", mode="before")
    @classmethod
    def _window(cls, given: object) -> object:
        """A window below ``MIN_WINDOW`` refused in the words the library and the CLI say it
        (the core's ``check_window``); the field's ``ge`` tells the OpenAPI schema."""
        if type(given) is int:
            check_window(given)
        return given


class Purge(_Request):
    """Which conversations a retention purge deletes."""

    older_than: Annotated[float, Field(ge=0, le=MAX_RUN_SECONDS * 100, strict=True)]
    """Seconds nobody wrote to the conversation (a message, a step, a pause all write):
    ``2592000`` is 30 days."""
    metadata: Metadata | None = None
    """Only the conversations whose metadata holds every one of these pairs."""
    vacuum: Annotated[bool, Field(strict=True)] = False
    """Then rewrite the store's files without the deleted text (PostgreSQL: ``VACUUM FULL``,
    each table locked while it is rewritten; ``docs/data.md``)."""


class Purged(BaseModel):
    """What a purge did."""

    deleted: int
    """Conversations deleted (one whose turn runs is left for the next purge)."""
    vacuumed: bool | None = None
    """Asked to vacuum: whether the store's files were rewritten (False: a store that
    overwrites deleted text as it deletes); left out when not asked."""


class SendMessage(_Request):
    """One user message."""

    text: Annotated[str, Field(min_length=1)]
    pinned: StrictBool = False
    """Never summarised away: every fresh start carries it verbatim (pinned messages may hold a
    quarter of the window together; more is a 422 ``message_too_large``)."""


class Continue(_Request):
    """Take the conversation's path at the limit now."""

    focus: Instruction | None = None
    """What the summary (checkpoint, compaction) must keep above all."""


class RedoSummary(_Request):
    """Make the latest compaction's summary again (REQ-SEG-063)."""

    focus: Instruction | None = None
    """What the new summary must keep above all."""
    summary_prompt: Instruction | None = None
    """The instruction for this summary only, in place of the conversation's."""
    summary_model: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    """The model that writes this summary only, in place of the conversation's."""


class Pause(_Request):
    """Why the conversation pauses (shown in its snapshot)."""

    reason: Annotated[str, Field(max_length=2_000)] = ""
    timeout: Annotated[StrictFloat, Field(gt=0, le=3_600)] | None = None
    """Wait at most this many seconds for the turn to end, then cancel it and pause."""


class PauseView(ConversationView):
    """A conversation after a pause was asked for."""

    snapshot_version: int | None = None
    """The snapshot's version when the pause was taken at once; None while it waits for the
    running turn's next boundary (``pause_requested``), then ``GET .../snapshots`` has it."""


class Resume(_Request):
    """The first message of the resumed session (a standard one when left out)."""

    prompt: Annotated[str, Field(max_length=100_000)] | None = None


MAX_RECENT_TURNS: Final = 100
"""The most exchanges a child carries as plain text (beyond it, a summary is the way)."""


class StartChild(_Request):
    """Continue an ended conversation (read-only at its limit, or failed) in its one child."""

    seed_with_summary: StrictBool = True
    """Seed the child with the summary (or checkpoint) the conversation ended with, if any."""
    recent_turns: Annotated[StrictInt, Field(ge=0, le=MAX_RECENT_TURNS)] = 0
    """Carry the last exchanges too, as plain text (a failed conversation has no summary: its
    last turns, or nothing, are the user's choice)."""
    auto_continue: StrictBool = False
    """Start the child's first turn from the summary at once (with ``seed_with_summary``)."""


class ErrorBody(BaseModel):
    """Every error: a stable code for programs, a message for people."""

    error: str
    message: str
    field: str | None = None
    """Where in the request the error is, when the API can say (an import's
    ``invalid_document``: ``messages.3.session``; ``""`` for the document as a whole)."""
    needed_tokens: int | None = None
    """An undone compaction that does not fit (``does_not_fit``): the tokens it needs."""
    threshold_tokens: int | None = None
    """... and the conversation's continuation threshold, which it must stay below."""


_REASONS: Final = {
    401: "The server has a token and the request did not send it (`unauthorized`).",
    403: "Addressed to a name this server does not answer, or sent from another site "
    "(`forbidden`).",
    404: "No such conversation, or no such snapshot of it (`not_found`).",
    409: "The conversation's state does not allow it (`busy`, `read_only`, `paused`, `failed`, "
    "`not_paused`, `no_compaction`, `conflict`), or an import's id is taken (`exists`).",
    413: "The body is over the server's bound (`too_large`).",
    415: "The body is not JSON (`unsupported_media_type`).",
    422: "The request is not valid; the message names the field or says why (`invalid_request`, "
    "`message_too_large`, `invalid_metadata`, `invalid_cursor`, `invalid_document`, "
    "`unsupported_option`), or an undone compaction would not fit (`does_not_fit`, with "
    "`needed_tokens` and `threshold_tokens`).",
    503: "The store cannot be used now; try again shortly (`unavailable`).",
}


def documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The API's errors a route may answer with, for its OpenAPI schema: each an ``ErrorBody``."""
    return {status: {"model": ErrorBody, "description": _REASONS[status]} for status in statuses}


EVERY_ROUTE: Final = (401, 403, 503)
"""What any API route may answer, whatever it does (the token, the host, the store)."""
ABOUT_ONE: Final = (404, 422)
"""What a route about one conversation may answer (it may not exist; its id may not be one)."""
SENDING: Final = (409, 413, 415, 422)
"""What a route that sends a body and changes a conversation may answer."""


class Info(BaseModel):
    """What this server runs."""

    version: str
    offline: bool
    """True when no API key was given: the offline scripted model answers."""
    model: str
    """The model of a conversation created without one."""
    behavior: ContextExhaustionBehavior
    """The behaviour of a conversation created without one."""
    context_window: Annotated[int, Field(ge=MIN_WINDOW)] | None = None
    """The window of a conversation created without one (None: the model's)."""
    limits: dict[str, int | float] = Field(default_factory=dict)
    """The bounds a conversation created without them gets (``max_attempts``...; the
    library's defaults for those not named)."""
    compaction: Compaction = "segue"
    """Who compacts a ``compact_in_place`` conversation created without saying."""
    context_edits: list[dict[str, Any]] = Field(default_factory=list)
    """The provider's context edits of a conversation created without them."""
    summary_request: SummaryRequest = "tool_less"
    """How the limit's requests of a conversation created without saying are sent
    (REQ-SEG-055)."""
    provider_compaction: bool = False
    """Whether the server's model adapter can have the provider compact a conversation of
    ``model`` (``compaction="provider"``; asked of one that cannot, creating it answers 422
    ``unsupported_option``). Said by the server from its adapter, whatever the application
    gave: the page offers the choice only then."""


__all__ = [
    "MAX_RUN_SECONDS",
    "MIN_WINDOW",
    "Continue",
    "ConversationId",
    "ConversationView",
    "CreateConversation",
    "ErrorBody",
    "Info",
    "LinkView",
    "MessageView",
    "Metadata",
    "Pause",
    "PauseView",
    "Purge",
    "Purged",
    "RedoSummary",
    "Resume",
    "SendMessage",
    "SnapshotView",
    "StartChild",
    "ToolCallView",
]
