"""The reference server with a provider's real client behind it, as ``segue serve --provider P``
builds it with a key: ``ServerConfig(provider=P)`` -> the adapter -> the unmodified SDK -> HTTP
-> the provider's fake API (``segue.testing.harnesses``). The server, page and CLI tests that
drive a real model run once per provider from here, their answers scripted in neutral terms
(``Said``) and what was asked read back the same way (``Sent``).

OpenAI is served as ``segue serve`` serves it: ``OpenAIModel`` on Chat Completions.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from fastapi import FastAPI

from segue.executor.models.providers import DEFAULT_MODELS, KEY_VARIABLES, Provider
from segue.server.run import ServerConfig, build_app, demo_tools
from segue.testing.conformance import Call, Said, Sent
from segue.testing.harnesses import AnthropicHarness, OpenAIHarness

PROVIDERS: Final[list[Provider]] = ["anthropic", "openai"]
SUMMARY_MODELS: Final[dict[Provider, str]] = {
    "anthropic": "claude-haiku-4-5",
    "openai": "gpt-4o-mini",
}
"""A smaller model of each provider, for the requests at the limit."""


@dataclass
class Backend:
    """A provider's fake API, started, and the server's configuration for it."""

    provider: Provider
    harness: AnthropicHarness | OpenAIHarness

    @property
    def key(self) -> str:
        return self.harness.key

    @property
    def url(self) -> str:
        """The fake API's base URL (``--base-url``)."""
        return str(self.harness.server.url)

    @property
    def model(self) -> str:
        """The model new conversations get."""
        return DEFAULT_MODELS[self.provider]

    @property
    def env(self) -> dict[str, str]:
        """The environment ``segue serve --provider P`` reads its key from."""
        return {KEY_VARIABLES[self.provider]: self.key}

    @property
    def args(self) -> list[str]:
        """``segue serve``'s arguments for this provider."""
        return ["--provider", self.provider, "--base-url", self.url]

    def config(self, **fields: Any) -> ServerConfig:
        return ServerConfig(provider=self.provider, api_key=self.key, base_url=self.url, **fields)

    def app(self, db: Path, *, tools: bool = False, **fields: Any) -> FastAPI:
        """The server with this provider's model (``tools``: with the demo's lookup)."""
        return build_app(self.config(db=db, **fields), tools=demo_tools() if tools else None)

    def sent(self) -> list[Sent]:
        return self.harness.sent()

    def respond(self, answer: Callable[[Sent], Said]) -> None:
        self.harness.respond(answer)

    def default(self, answer: Said | Callable[[], Said]) -> None:
        self.harness.default(answer)

    def script(self, *answers: Said) -> None:
        self.harness.script(*answers)


@contextlib.contextmanager
def backend(provider: Provider) -> Iterator[Backend]:
    """The provider's fake API for the block."""
    harness = AnthropicHarness() if provider == "anthropic" else OpenAIHarness("chat")
    with harness:
        yield Backend(provider, harness)


def prompt_of(sent: Sent) -> int:
    """About four characters of the request's JSON per token: a prompt as large as the request."""
    return max(1, len(json.dumps(sent.raw, separators=(",", ":"))) // 4)


def asked(sent: Sent) -> str:
    """The text of the request's last user message."""
    users = [turn.text for turn in sent.turns if turn.role == "user"]
    return users[-1] if users else ""


def chat(
    sent: Sent,
    *,
    reply_chars: int = 1_200,
    tool_every: int = 0,
    pieces: int = 8,
    chunk_delay: float = 0.0,
) -> Said:
    """The fake API as a chat model: about ``reply_chars`` characters on the last question, and
    the usage of a prompt as large as the request, so the context fills up turn by turn as a
    real one does. With ``tool_every``, every n-th question (counting the user's messages) is
    first answered with a call of the first tool offered."""
    question = asked(sent)
    last = sent.turns[-1] if sent.turns else None
    users = sum(turn.role == "user" for turn in sent.turns)
    if (
        tool_every
        and sent.callable_tools
        and last is not None
        and last.role == "user"
        and users % tool_every == 0
    ):
        call = Call(sent.tools[0], {"query": question[:20]})
        return Said(text="Let me check that.", calls=[call], prompt=prompt_of(sent), output=10)
    opening = f"About {question[:60]!r}: "
    filler = "the tide turns twice a day. "
    text = (opening + filler * (reply_chars // len(filler) + 1))[:reply_chars]
    return Said(
        text=text,
        prompt=prompt_of(sent),
        output=len(text) // 4,
        pieces=pieces,
        chunk_delay=chunk_delay,
    )
