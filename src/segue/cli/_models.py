"""Which model answers a CLI command: a provider's model through its official client (Claude with
``ANTHROPIC_API_KEY``, OpenAI or any OpenAI-compatible server with ``OPENAI_API_KEY``), or the
offline scripted model for the demo's conversations (and ``--offline``).

``connect`` is the one place a command's provider is chosen: the key from its environment
variable, ``base_url`` (else the client's own ``ANTHROPIC_BASE_URL`` / ``OPENAI_BASE_URL``) and
extra headers, and the adapter over the client. The providers' names, key variables and default
models are ``segue.executor.models.providers``' (the server builds its model there too).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any, Final

from segue.cli._app import CliError
from segue.cli.demo import DEMO_MODEL, demo_model
from segue.executor.model_port import LlmModel
from segue.executor.models.providers import (
    DEFAULT_MODELS,
    KEY_VARIABLES,
    PROVIDERS,
    Provider,
)
from segue.statemachine import ConversationState
from segue.statemachine.models import provider_of

NO_KEY = "ANTHROPIC_API_KEY is not set: export your Anthropic API key, or try `segue demo`"
_NO_KEY: Final[dict[Provider, str]] = {
    "anthropic": NO_KEY,
    "openai": "OPENAI_API_KEY is not set: export your OpenAI API key (any value for a local "
    "server that needs none), or try `segue demo`",
}
_GET_A_KEY: Final[dict[Provider, str]] = {
    "anthropic": "export ANTHROPIC_API_KEY to talk to Claude",
    "openai": "export OPENAI_API_KEY to talk to an OpenAI model (any value for a server that "
    "needs none)",
}


def provider_for(provider: str | None, model: str | None) -> Provider:
    """The provider asked for, else the one the model's name tells, else Anthropic."""
    if provider is not None:
        wanted = provider.strip().lower()
        if wanted not in PROVIDERS:
            raise CliError(f"unknown provider {provider!r}: choose anthropic or openai", 2)
        return "openai" if wanted == "openai" else "anthropic"
    return provider_of(model or "") or "anthropic"


def api_key(provider: Provider = "anthropic") -> str | None:
    """The provider's API key from the environment, or None."""
    return os.environ.get(KEY_VARIABLES[provider], "").strip() or None


def required_key(provider: Provider = "anthropic") -> str:
    """The provider's API key from the environment (a setup error without one)."""
    key = api_key(provider)
    if key is None:
        raise CliError(_NO_KEY[provider], 2)
    return key


def offline_line(provider: Provider, base_url: str | None) -> str:
    """What ``segue chat`` and ``segue serve`` say when the provider's key is not set: the
    scripted model answers, offline (and not the server at ``base_url``, if one was given)."""
    instead = f", not the server at {base_url}" if base_url else ""
    return (
        f"offline: {KEY_VARIABLES[provider]} is not set, so the scripted model answers"
        f"{instead} ({_GET_A_KEY[provider]})"
    )


async def connect(
    provider: Provider,
    key: str,
    *,
    base_url: str | None,
    headers: dict[str, str],
    check_model: str | None = None,
) -> tuple[Any, LlmModel]:
    """A client and its adapter. With ``check_model`` the API is asked about that model first,
    so a bad key (or, from Anthropic, an unknown model) is one line (exit 2) before anything is
    stored. The key never appears in the error, nor in any exception chained below it."""
    if provider == "openai":
        return await _openai(key, base_url=base_url, headers=headers, check_model=check_model)
    return await claude(key, base_url=base_url, headers=headers, check_model=check_model)


async def claude(
    key: str,
    *,
    base_url: str | None,
    headers: dict[str, str],
    check_model: str | None = None,
) -> tuple[Any, LlmModel]:
    """The Anthropic client and ``AnthropicModel`` (see ``connect``)."""
    import anthropic  # noqa: PLC0415  # ~2 s to import: only commands that call Claude pay

    from segue.executor.models.anthropic import AnthropicModel, call_error  # noqa: PLC0415
    from segue.executor.models.call_errors import scrub_secrets  # noqa: PLC0415

    client = anthropic.AsyncAnthropic(
        api_key=key, base_url=base_url, default_headers=headers or None
    )
    if check_model is not None:
        try:
            await client.models.retrieve(check_model)
        except anthropic.APIStatusError as exc:
            secrets = (key, *headers.values())
            error = call_error(exc, model=check_model, secrets=secrets)
            if error.fatal:  # unknown model, bad key: no message can succeed
                await client.close()
                scrub_secrets(exc, secrets)
                raise CliError(error.message, 2) from exc
        except anthropic.APIError:
            pass  # unreachable for now: the first message says so, after the runtime's retries
    return client, AnthropicModel(client=client)


async def _openai(
    key: str,
    *,
    base_url: str | None,
    headers: dict[str, str],
    check_model: str | None,
) -> tuple[Any, LlmModel]:
    """The OpenAI client and ``OpenAIModel``. Only a refused key fails the check: many
    compatible servers have no ``/models/{id}``, so an unknown model is left to the first
    message."""
    try:
        import openai  # noqa: PLC0415  # the segue[openai] extra
    except ImportError as missing:
        msg = f"--provider openai needs the openai extra: pip install 'segue[openai]' ({missing})"
        raise CliError(msg, 2) from None

    from segue.executor.models.call_errors import scrub_secrets  # noqa: PLC0415
    from segue.executor.models.openai import OpenAIModel, call_error  # noqa: PLC0415

    client = openai.AsyncOpenAI(api_key=key, base_url=base_url, default_headers=headers or None)
    if check_model is not None:
        try:
            await client.models.retrieve(check_model)
        except openai.APIStatusError as exc:
            secrets = (key, *headers.values())
            error = call_error(exc, model=check_model, secrets=secrets)
            if exc.status_code in (401, 403):
                await client.close()
                scrub_secrets(exc, secrets)
                raise CliError(error.message, 2) from exc
        except openai.APIError:
            pass  # unreachable for now: the first message says so, after the runtime's retries
    return client, OpenAIModel(client)


@contextlib.asynccontextmanager
async def model_for(
    state: ConversationState,
    *,
    offline: bool,
    base_url: str | None,
    headers: dict[str, str],
) -> AsyncIterator[LlmModel]:
    """The model that answers ``state``'s requests: offline for the demo's conversations or
    when asked, else its provider's (told by the model's name; it needs that provider's key)."""
    if offline or state.model == DEMO_MODEL:
        yield demo_model()
        return
    provider = provider_for(None, state.model)
    client, model = await connect(
        provider, required_key(provider), base_url=base_url, headers=headers
    )
    try:
        yield model
    finally:
        await client.close()


__all__ = [
    "DEFAULT_MODELS",
    "KEY_VARIABLES",
    "NO_KEY",
    "PROVIDERS",
    "Provider",
    "api_key",
    "claude",
    "connect",
    "model_for",
    "offline_line",
    "provider_for",
    "required_key",
]
