"""What a fake provider counts when a test does not script usage: the prompt's tokens as segue
estimates them (``segue.statemachine.estimate_tokens``, so an offline meter moves as a real one
would), and, for the Messages API, prompt caching by Anthropic's documented rules, with a bill.

The rules ``PromptCache`` plays (Anthropic's prompt-caching documentation):

* The prompt is one prefix in the order tools, system, messages; each content block (a tool
  definition, a system block, a message's block) ends a position in it.
* A ``cache_control`` on a block is a breakpoint (at most 4, more is a 400); a top-level
  ``cache_control`` (automatic caching) puts one on the last block.
* A breakpoint's prefix is written to the cache when it holds at least the model's minimum
  (``MIN_CACHEABLE``: 1,024 tokens, 2,048 or 4,096 for some models); a shorter one is not
  cached at all, silently.
* A later request reads the longest prefix cached before, found from each of its breakpoints
  looking back at most 20 blocks (``LOOKBACK``), if it is still alive: 5 minutes after it was
  last written or read (``"ttl": "1h"``: an hour), each hit refreshing it.
* The prefix is identical or it is not: one changed byte misses everything after it. What
  invalidates by level: the tools change everything; ``tool_choice`` and ``thinking`` change
  the messages' prefixes only (the tools' and the system's stay cached).
* ``usage``: ``cache_read_input_tokens`` the prefix read, ``cache_creation_input_tokens``
  what was written after it up to the last breakpoint, ``input_tokens`` the rest.

``Bill`` prices each answer relative to one uncached input token: input x 1, cache writes
x 1.25 (x 2 for an hour's TTL), cache reads x 0.1, output x 5. Only the standard library and
segue's own estimate are used.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from segue.statemachine import estimate_tokens
from segue.testing._measured import MEASURED, Measured

MAX_BREAKPOINTS: Final = 4
LOOKBACK: Final = 20
"""Blocks a breakpoint looks back for an earlier cache entry."""
TTL_SECONDS: Final[Mapping[str, float]] = {"5m": 300.0, "1h": 3600.0}
MIN_CACHEABLE: Final[tuple[tuple[str, int], ...]] = (
    ("claude-opus-4-5", 4_096),
    ("claude-opus-4-6", 4_096),
    ("claude-opus-4-7", 2_048),
    ("claude-haiku-4-5", 4_096),
    ("claude-3-5-haiku", 2_048),
    ("claude-3-haiku", 2_048),
)
"""Models whose minimum cacheable prefix is not the default 1,024 tokens (longest prefix)."""
DEFAULT_MIN_CACHEABLE: Final = 1_024
PRICES: Final[Mapping[str, float]] = {
    "input": 1.0,
    "write_5m": 1.25,
    "write_1h": 2.0,
    "read": 0.1,
    "output": 5.0,
}
"""Each kind of token's price relative to one uncached input token."""


class TooManyBreakpointsError(ValueError):
    """More than four ``cache_control`` blocks: the API answers 400."""


def min_cacheable(model: str) -> int:
    """The shortest prefix ``model`` caches."""
    best = ("", DEFAULT_MIN_CACHEABLE)
    for prefix, tokens in MIN_CACHEABLE:
        if model.startswith(prefix) and len(prefix) > len(best[0]):
            best = (prefix, tokens)
    return best[1]


def text_tokens(value: object) -> int:
    """segue's estimate of one block: its text when it has one, else its JSON."""
    if isinstance(value, str):
        return estimate_tokens(value)
    if isinstance(value, dict):
        if isinstance(value.get("text"), str):
            return estimate_tokens(value["text"])
        if value.get("type") == "tool_result":
            return text_tokens(value.get("content", ""))
        if value.get("type") == "tool_use":
            return estimate_tokens(str(value.get("name", "")) + json.dumps(value.get("input")))
    if isinstance(value, list):
        return sum(text_tokens(item) for item in value)
    return estimate_tokens(json.dumps(value, sort_keys=True))


def plain_text(content: Any) -> str:
    """The text a message's content holds: itself when it is a string, else its parts' texts
    joined by spaces ("" for anything else)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(part["text"])
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        ).strip()
    return ""


def output_tokens(text: str, calls: Sequence[tuple[str, object]] = (), thinking: str = "") -> int:
    """segue's estimate of what a reply writes: its text, tool calls (name and input) and
    thinking; at least one token."""
    tokens = text_tokens(text) if text else 1
    tokens += sum(text_tokens({"type": "tool_use", "name": n, "input": i}) for n, i in calls)
    return tokens + (text_tokens(thinking) if thinking else 0)


@dataclass(frozen=True, slots=True)
class Block:
    """One position of the prompt: its tokens, its identity, and its breakpoint's TTL."""

    tokens: int
    key: str
    ttl: str | None


def _without_cache_control(block: Any) -> Any:
    if isinstance(block, dict):
        return {k: v for k, v in block.items() if k != "cache_control"}
    return block


def _ttl(block: Any) -> str | None:
    control = block.get("cache_control") if isinstance(block, dict) else None
    if not isinstance(control, dict):
        return None
    ttl = control.get("ttl", "5m")
    return ttl if ttl in TTL_SECONDS else "5m"


def prompt_blocks(request: Mapping[str, Any]) -> list[Block]:
    """The request's prompt as positions in cache order, each keyed by everything before it
    (see the module docstring for what each level's key holds)."""
    digest = hashlib.sha256(str(request.get("model", "")).encode())
    raw: list[tuple[str, Any]] = [("tools", tool) for tool in request.get("tools") or ()]
    system = request.get("system")
    if isinstance(system, str) and system:
        raw.append(("system", {"type": "text", "text": system}))
    elif isinstance(system, list):
        raw += [("system", block) for block in system]
    for message in request.get("messages") or ():
        content = message.get("content")
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        raw += [(f"message:{message.get('role')}", part) for part in parts or ()]
        raw.append(("end", message.get("role")))  # where one message ends and the next begins
    blocks: list[Block] = []
    in_messages = False
    for level, block in raw:
        if level.startswith("message") and not in_messages:
            in_messages = True  # what changes the messages' prefixes but not the system's
            for name in ("tool_choice", "thinking"):
                digest.update(json.dumps([name, request.get(name)], sort_keys=True).encode())
        digest.update(json.dumps([level, _without_cache_control(block)], sort_keys=True).encode())
        if level == "end":
            continue
        blocks.append(Block(text_tokens(block), digest.hexdigest(), _ttl(block)))
    if isinstance(request.get("cache_control"), dict) and blocks:  # automatic caching
        last = blocks[-1]
        ttl = _ttl({"cache_control": request["cache_control"]})
        blocks[-1] = Block(last.tokens, last.key, last.ttl or ttl)
    return blocks


@dataclass(frozen=True, slots=True)
class Accounted:
    """One request's prompt as the provider bills it."""

    input_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int
    written_1h: int = 0

    @property
    def written_5m(self) -> int:
        return self.cache_creation_input_tokens - self.written_1h


class PromptCache:
    """The provider's prompt cache for one fake server (thread-safe); ``clock`` in seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._entries: dict[str, tuple[float, float]] = {}  # key -> (expires at, ttl)
        self._lock = threading.Lock()

    def clear(self) -> None:
        """Forget every entry (a new cache)."""
        with self._lock:
            self._entries.clear()

    def account(self, request: Mapping[str, Any]) -> Accounted:
        """Read and write the cache for ``request``; what its prompt costs, by kind."""
        blocks = prompt_blocks(request)
        breakpoints = [i for i, block in enumerate(blocks) if block.ttl is not None]
        explicit = sum(_explicit_breakpoints(request))
        if explicit > MAX_BREAKPOINTS:
            msg = f"A maximum of 4 blocks with cache_control may be provided. Found {explicit}."
            raise TooManyBreakpointsError(msg)
        ends = [0]
        for block in blocks:
            ends.append(ends[-1] + block.tokens)
        total = ends[-1]
        with self._lock:
            now = self.clock()
            hit = self._longest_hit(blocks, breakpoints, now)
            read = ends[hit + 1] if hit is not None else 0
            written = written_1h = 0
            minimum = min_cacheable(str(request.get("model", "")))
            start = read
            for index in breakpoints:
                block, end = blocks[index], ends[index + 1]
                ttl = TTL_SECONDS[block.ttl or "5m"]
                if hit is not None and index <= hit:
                    self._entries[block.key] = (now + ttl, ttl)  # a hit refreshes
                    continue
                if end < minimum:
                    continue  # too short to cache: no error, nothing written
                self._entries[block.key] = (now + ttl, ttl)
                if end > start:
                    written += end - start
                    written_1h += end - start if block.ttl == "1h" else 0
                    start = end
            if hit is not None:
                key = blocks[hit].key
                ttl = self._entries[key][1]
                self._entries[key] = (now + ttl, ttl)
        return Accounted(total - read - written, read, written, written_1h)

    def _longest_hit(
        self, blocks: Sequence[Block], breakpoints: Sequence[int], now: float
    ) -> int | None:
        best: int | None = None
        for index in breakpoints:
            for back in range(index, max(-1, index - LOOKBACK), -1):
                entry = self._entries.get(blocks[back].key)
                if entry is not None and entry[0] > now:
                    best = back if best is None else max(best, back)
                    break
        return best


def _explicit_breakpoints(request: Mapping[str, Any]) -> list[int]:
    def marked(block: Any) -> int:
        return int(isinstance(block, dict) and isinstance(block.get("cache_control"), dict))

    counts = [marked(tool) for tool in request.get("tools") or ()]
    system = request.get("system")
    counts += [marked(block) for block in system] if isinstance(system, list) else []
    for message in request.get("messages") or ():
        content = message.get("content")
        counts += [marked(block) for block in content] if isinstance(content, list) else []
    return counts


@dataclass(slots=True)
class Bill:
    """What the answers served so far cost, in tokens of each kind and in relative price."""

    requests: int = 0
    input_tokens: int = 0
    cache_read_input_tokens: int = 0
    written_5m: int = 0
    written_1h: int = 0
    output_tokens: int = 0
    by_request: list[float] = field(default_factory=list)
    entries: list[tuple[Accounted, int]] = field(default_factory=list)
    """Each answer's prompt and output tokens, in the order they were served."""

    def add(self, prompt: Accounted, output_tokens: int) -> None:
        """Count one answer."""
        self.entries.append((prompt, output_tokens))
        self.requests += 1
        self.input_tokens += prompt.input_tokens
        self.cache_read_input_tokens += prompt.cache_read_input_tokens
        self.written_5m += prompt.written_5m
        self.written_1h += prompt.written_1h
        self.output_tokens += output_tokens
        self.by_request.append(price(prompt, output_tokens))

    @property
    def prompt_tokens(self) -> int:
        """Every prompt token sent, however it was billed."""
        return self.input_tokens + self.cache_read_input_tokens + self.written_5m + self.written_1h

    @property
    def cost(self) -> float:
        """The whole bill, relative to one uncached input token."""
        return sum(self.by_request)

    @property
    def read_share(self) -> float:
        """The share of prompt tokens read from the cache."""
        return self.cache_read_input_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def price(prompt: Accounted, output_tokens: int) -> float:
    """One answer's price relative to one uncached input token (``PRICES``)."""
    return (
        prompt.input_tokens * PRICES["input"]
        + prompt.written_5m * PRICES["write_5m"]
        + prompt.written_1h * PRICES["write_1h"]
        + prompt.cache_read_input_tokens * PRICES["read"]
        + output_tokens * PRICES["output"]
    )


__all__ = [
    "LOOKBACK",
    "MAX_BREAKPOINTS",
    "MEASURED",
    "MIN_CACHEABLE",
    "PRICES",
    "Accounted",
    "Bill",
    "Block",
    "Measured",
    "PromptCache",
    "TooManyBreakpointsError",
    "min_cacheable",
    "output_tokens",
    "plain_text",
    "price",
    "prompt_blocks",
    "text_tokens",
]
