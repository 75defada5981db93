"""Content blocks: what a message holds besides plain text, in the Messages API's own shapes.

A user message may carry images and documents (base64 or by URL); an assistant reply may carry
thinking blocks whose signatures must go back to the provider unchanged; a tool result may carry
images. A ``Message`` keeps such content as an ordered tuple of these blocks next to its plain
``text`` (the text is what summaries, estimates and logs read; the blocks are what the provider
is sent). Every block validates on construction and dumps to exactly the JSON the API takes, so
stores round-trip them and adapters send them as they are.

Token estimates for pre-flight are here too, and they are conservative on purpose: pre-flight
would rather continue a little early than send a prompt the provider refuses. An image whose
size can be read from its header costs what the provider's formula says for it (after the
provider's own downscaling); anything else costs the most an image can.
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
from collections.abc import Sequence
from math import ceil, sqrt
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, Field, ValidationInfo

from segue.statemachine._values import Frozen

ImageMediaType = Literal["image/jpeg", "image/png", "image/gif", "image/webp"]

IMAGE_LONG_EDGE: Final = 2_576
IMAGE_MAX_PIXELS: Final = 3_600_000
"""The provider downscales an image to at most this long edge and about this many pixels (its
high-resolution models; older ones stop at 1,568 px and ~1.15 megapixels), so no image costs more
than ``IMAGE_MAX_PIXELS / PIXELS_PER_TOKEN`` tokens."""
PIXELS_PER_TOKEN: Final = 750
IMAGE_MAX_TOKENS: Final = -(-IMAGE_MAX_PIXELS // PIXELS_PER_TOKEN)
"""The most one image can cost (4,800): what an image whose size cannot be read is counted as
(a URL, an unreadable header)."""
DOCUMENT_PAGE_TOKENS: Final = 3_000 + 1_600
"""A PDF page is sent as its text (dense pages run to about 3,000 tokens) and as a page image
(about 1,600)."""
DOCUMENT_URL_PAGES: Final = 100
"""A PDF by URL cannot be measured here: it is assumed to run to this many pages (exact
pre-flight with ``count_tokens`` replaces the guess)."""
_HEADER_BYTES: Final = 96 * 1024
"""How much of a base64 image is decoded to find its size (JPEG's size marker may follow EXIF)."""
_PAGE = re.compile(rb"/Type\s*/Page(?!s)")


MAX_INPUT_DEPTH: Final = 64
"""The deepest a tool call's input may nest (objects and lists within it): a tool's JSON
Schema rarely goes past ten. Far deeper input is what a parser's recursion limit refuses,
so a conversation that stored it could no longer be read."""
MAX_INPUT_CHARS: Final = 4_000_000
"""The most characters a tool call's input may hold (its keys' and strings' characters, and
one for every other value): more than any model writes in one reply."""
ENTERING: Final = "segue.entering"
"""The validation context key (``{ENTERING: True}``) under which a tool input from outside is
held to ``MAX_INPUT_DEPTH`` and ``MAX_INPUT_CHARS`` (an import; a model's reply is checked with
``input_fault``). Reading what a store holds does not check them: nothing stored is refused
on its way out."""


def input_fault(value: object) -> str | None:
    """What makes a tool input too deep or too large to keep, or None when it is neither.

    Iterative (a stack, not recursion), so any depth is measured without running out of
    Python's own stack, and it stops at the first bound passed."""
    chars = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            if depth > MAX_INPUT_DEPTH:
                return f"nests deeper than {MAX_INPUT_DEPTH} levels"
            for key, inner in item.items():
                chars += len(key) if isinstance(key, str) else 1
                stack.append((inner, depth + 1))
        elif isinstance(item, list | tuple):
            if depth > MAX_INPUT_DEPTH:
                return f"nests deeper than {MAX_INPUT_DEPTH} levels"
            stack.extend((inner, depth + 1) for inner in item)
        else:
            chars += len(item) if isinstance(item, str) else 1
        if chars > MAX_INPUT_CHARS:
            return f"holds more than {MAX_INPUT_CHARS:,} characters"
    return None


def _bounded(value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
    """A tool input, held to its bounds when it enters (see ``ENTERING``)."""
    if isinstance(info.context, dict) and info.context.get(ENTERING):
        fault = input_fault(value)
        if fault is not None:
            msg = f"a tool input {fault}"
            raise ValueError(msg)
    return value


ToolInput = Annotated[dict[str, Any], AfterValidator(_bounded)]
"""A tool call's input: a JSON object, bounded in depth and size where it enters."""


class Base64Source(Frozen):
    """Data sent inline, base64-encoded."""

    type: Literal["base64"] = "base64"
    media_type: str
    data: str


class UrlSource(Frozen):
    """Data the provider fetches from a URL."""

    type: Literal["url"] = "url"
    url: Annotated[str, Field(min_length=1)]


class PlainTextSource(Frozen):
    """A document given as plain text."""

    type: Literal["text"] = "text"
    media_type: Literal["text/plain"] = "text/plain"
    data: str


class ImageBase64Source(Base64Source):
    """An image sent inline: jpeg, png, gif or webp."""

    media_type: ImageMediaType


class PdfBase64Source(Base64Source):
    """A PDF sent inline."""

    media_type: Literal["application/pdf"]


class TextBlock(Frozen):
    """Plain text."""

    type: Literal["text"] = "text"
    text: str


class ImageBlock(Frozen):
    """An image."""

    type: Literal["image"] = "image"
    source: Annotated[ImageBase64Source | UrlSource, Field(discriminator="type")]


class DocumentBlock(Frozen):
    """A document: a PDF (inline or by URL) or plain text."""

    type: Literal["document"] = "document"
    source: Annotated[PdfBase64Source | UrlSource | PlainTextSource, Field(discriminator="type")]
    title: str | None = None
    context: str | None = None


class ThinkingBlock(Frozen):
    """The model's thinking; sent back unchanged (its signature proves it is the model's)."""

    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str


class RedactedThinkingBlock(Frozen):
    """Thinking the provider encrypted; sent back unchanged."""

    type: Literal["redacted_thinking"] = "redacted_thinking"
    data: str


class ToolUseBlock(Frozen):
    """A tool call in its place among a reply's blocks (its twin in ``Message.tool_calls`` is
    what the runtime runs)."""

    type: Literal["tool_use"] = "tool_use"
    id: Annotated[str, Field(min_length=1)]
    name: Annotated[str, Field(min_length=1)]
    input: ToolInput = Field(default_factory=dict)


class AgentToolUseBlock(Frozen):
    """A tool the provider's own agent ran while answering (a Claude Agent SDK session's Bash,
    Read...): kept in the record of the reply, never run by segue nor sent as a ``tool_use``."""

    type: Literal["agent_tool_use"] = "agent_tool_use"
    id: Annotated[str, Field(min_length=1)]
    name: Annotated[str, Field(min_length=1)]
    input: ToolInput = Field(default_factory=dict)


class AgentToolResultBlock(Frozen):
    """What a tool of the provider's own agent gave back (see ``AgentToolUseBlock``)."""

    type: Literal["agent_tool_result"] = "agent_tool_result"
    tool_use_id: Annotated[str, Field(min_length=1)]
    output: str = ""
    is_error: bool = False


class CompactionBlock(Frozen):
    """The provider's own compaction of the context (a conversation created with
    ``compaction="provider"``, REQ-SEG-048): it stands in for everything before it, and goes
    back to the provider exactly as it came, so that what came before is never sent again.

    Anthropic's ``compaction`` block carries the summary (``content``) and opaque parts
    (``encrypted_content``, ``signature``, ``tool_changes``); OpenAI's ``compaction`` item is
    opaque (``encrypted_content``, ``id``), and a compaction asked for on demand
    (``responses.compact``) returns, before it, the items of the window it kept (``window``).
    A field the provider did not send stays None and is not sent back."""

    type: Literal["compaction"] = "compaction"
    provider: Literal["anthropic", "openai"]
    """Whose block it is: only that provider can read it back."""
    content: str | None = None
    """The summary the provider wrote (Anthropic's); None on OpenAI, whose item is opaque, and
    on an Anthropic block whose summary failed (``failed``)."""
    encrypted_content: str | None = None
    signature: str | None = None
    tool_changes: tuple[dict[str, Any], ...] | None = None
    """Anthropic's ``tool_addition`` and ``tool_removal`` entries of the compacted range."""
    id: str | None = None
    """OpenAI's id of the item."""
    window: tuple[dict[str, Any], ...] = ()
    """The items OpenAI's ``responses.compact`` put before the item (the conversation's user
    messages), sent back before it as they came."""

    @property
    def failed(self) -> bool:
        """Whether the block holds no compaction at all: an Anthropic block without a summary
        (the provider says its summary failed), an OpenAI item without its content."""
        if self.provider == "anthropic":
            return self.content is None or not self.content.strip()
        return not self.encrypted_content


ContentBlock = Annotated[
    TextBlock
    | ImageBlock
    | DocumentBlock
    | ThinkingBlock
    | RedactedThinkingBlock
    | ToolUseBlock
    | AgentToolUseBlock
    | AgentToolResultBlock
    | CompactionBlock,
    Field(discriminator="type"),
]
"""Every block a message may carry."""

UserBlock = Annotated[TextBlock | ImageBlock | DocumentBlock, Field(discriminator="type")]
"""What a user message may carry."""

ToolResultBlock = Annotated[TextBlock | ImageBlock, Field(discriminator="type")]
"""What a tool result may carry besides its text."""


# --------------------------------------------------------------------------- estimates


def estimate_blocks(blocks: Sequence[Any], text_tokens: Any) -> int:
    """A conservative token estimate of ``blocks`` (``text_tokens(text)`` for any text)."""
    total = 0
    for block in blocks:
        kind = block.type
        if kind == "text":
            total += text_tokens(block.text)
        elif kind == "image":
            total += image_tokens(block.source)
        elif kind == "document":
            total += document_tokens(block.source, text_tokens)
        elif kind == "thinking":
            total += text_tokens(block.thinking)
        elif kind == "redacted_thinking":
            total += text_tokens(block.data)
        elif kind in ("tool_use", "agent_tool_use"):
            total += text_tokens(block.name + repr(block.input))
        elif kind == "agent_tool_result":
            total += text_tokens(block.output)
        elif kind == "compaction":
            # The provider reads the summary, or its opaque form: counted as text, the longer.
            total += text_tokens(block.content or block.encrypted_content or "")
            total += sum(text_tokens(repr(item)) for item in block.window)
    return total


def image_tokens(source: Any) -> int:
    """Tokens of one image: from its size when its header says it, else the maximum."""
    if source.type != "base64":
        return IMAGE_MAX_TOKENS
    size = image_size(source.data)
    if size is None:
        return IMAGE_MAX_TOKENS
    width, height = size
    scale = min(
        1.0, IMAGE_LONG_EDGE / max(width, height), sqrt(IMAGE_MAX_PIXELS / (width * height))
    )
    return max(1, ceil(width * scale * height * scale / PIXELS_PER_TOKEN))


def document_tokens(source: Any, text_tokens: Any) -> int:
    """Tokens of one document: plain text as text; a PDF by its page count (or a guess)."""
    if source.type == "text":
        return int(text_tokens(source.data))
    if source.type != "base64":
        return DOCUMENT_URL_PAGES * DOCUMENT_PAGE_TOKENS
    try:
        raw = base64.b64decode(source.data, validate=False)
    except (binascii.Error, ValueError):
        return DOCUMENT_URL_PAGES * DOCUMENT_PAGE_TOKENS
    pages = len(_PAGE.findall(raw))
    if pages == 0:  # compressed object streams hide the page objects: guess from the size
        pages = max(1, ceil(len(raw) / 50_000))
    return pages * DOCUMENT_PAGE_TOKENS


def image_size(data: str) -> tuple[int, int] | None:
    """(width, height) of a base64 PNG, GIF, JPEG or WebP image, from its header."""
    try:
        head = base64.b64decode(data[: _HEADER_BYTES * 4 // 3 // 4 * 4], validate=False)
    except (binascii.Error, ValueError):
        return None
    try:
        size = _png(head) or _gif(head) or _webp(head) or _jpeg(head)
    except (struct.error, IndexError):
        return None
    if size is None or size[0] <= 0 or size[1] <= 0:
        return None
    return size


def _png(head: bytes) -> tuple[int, int] | None:
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", head[16:24])
    return int(width), int(height)


def _gif(head: bytes) -> tuple[int, int] | None:
    if head[:6] not in (b"GIF87a", b"GIF89a"):
        return None
    width, height = struct.unpack("<HH", head[6:10])
    return int(width), int(height)


def _webp(head: bytes) -> tuple[int, int] | None:
    if head[:4] != b"RIFF" or head[8:12] != b"WEBP":
        return None
    chunk = head[12:16]
    if chunk == b"VP8X":
        width = 1 + int.from_bytes(head[24:27], "little")
        height = 1 + int.from_bytes(head[27:30], "little")
        return width, height
    if chunk == b"VP8L":
        bits = int.from_bytes(head[21:25], "little")
        return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
    if chunk == b"VP8 ":
        width, height = struct.unpack("<HH", head[26:30])
        return int(width) & 0x3FFF, int(height) & 0x3FFF
    return None


_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def _jpeg(head: bytes) -> tuple[int, int] | None:
    if head[:2] != b"\xff\xd8":
        return None
    index = 2
    while index + 9 < len(head):
        if head[index] != 0xFF:
            return None
        marker = head[index + 1]
        if marker == 0xFF:  # fill byte
            index += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            index += 2
            continue
        length = int.from_bytes(head[index + 2 : index + 4], "big")
        if marker in _SOF:
            height, width = struct.unpack(">HH", head[index + 5 : index + 9])
            return int(width), int(height)
        index += 2 + length
    return None
