"""The providers segue has adapters for, by name: which environment variable holds each one's key,
which model a conversation gets when none is named, and the adapter over a new official client.

The CLI (``segue chat``, ``segue serve``) and the reference server (``segue.server.run``) both
build their model here, so the two cannot drift apart, and neither imports the other. Each
provider's client is imported only when its adapter is built: an application that uses one
provider need not have the other's package installed.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from segue.executor.model_port import LlmModel

Provider = Literal["anthropic", "openai"]
PROVIDERS: Final[tuple[Provider, ...]] = ("anthropic", "openai")
KEY_VARIABLES: Final[dict[Provider, str]] = {
    "anthropic": "ANTHROPIC_API_KEY",
    "openai": "OPENAI_API_KEY",
}
"""The environment variable each provider's key is read from (and named in its errors)."""
DEFAULT_MODELS: Final[dict[Provider, str]] = {"anthropic": "claude-sonnet-4-6", "openai": "gpt-4o"}
"""The model of a conversation created without one."""


def new_client(
    provider: Provider, key: str, *, base_url: str | None, headers: dict[str, str]
) -> Any:
    """The provider's official async client (``base_url`` None: the client's own default, or
    its ``ANTHROPIC_BASE_URL`` / ``OPENAI_BASE_URL``). ``ImportError`` when the provider's
    package is not installed."""
    if provider == "openai":
        import openai  # noqa: PLC0415  # the segue[openai] extra

        return openai.AsyncOpenAI(api_key=key, base_url=base_url, default_headers=headers or None)
    import anthropic  # noqa: PLC0415  # ~2 s to import: only who calls Claude pays

    return anthropic.AsyncAnthropic(api_key=key, base_url=base_url, default_headers=headers or None)


async def release_connections(client: Any) -> None:
    """Close the pooled connections of a client ``new_client`` made, keeping it usable (its
    next request opens a new connection).

    A pooled connection belongs to the event loop that opened it: once a server's loop ends, it
    can serve no request again and is left open until the garbage collector finds it. The SDKs
    keep their HTTP client as ``_client`` and httpx its pool as ``_transport``, neither of them
    public, so this reads both with care and leaves a client without them as it is; only a
    client segue made and nobody else shares is given here (closing a pool also ends the
    requests it carries)."""
    http = getattr(client, "_client", None)
    close = getattr(getattr(http, "_transport", None), "aclose", None)
    if close is not None:
        await close()


def adapter(provider: Provider, client: Any) -> LlmModel:
    """The provider's adapter over ``client`` (as made by ``new_client``)."""
    if provider == "openai":
        from segue.executor.models.openai import OpenAIModel  # noqa: PLC0415

        return OpenAIModel(client)
    from segue.executor.models.anthropic import AnthropicModel  # noqa: PLC0415

    return AnthropicModel(client)


def build_llm(
    provider: Provider, key: str, *, base_url: str | None, headers: dict[str, str]
) -> LlmModel:
    """The provider's adapter over a new client, without asking the API anything (a server
    must start even while the API is unreachable; its first message says so)."""
    return adapter(provider, new_client(provider, key, base_url=base_url, headers=headers))


__all__ = [
    "DEFAULT_MODELS",
    "KEY_VARIABLES",
    "PROVIDERS",
    "Provider",
    "adapter",
    "build_llm",
    "new_client",
    "release_connections",
]
