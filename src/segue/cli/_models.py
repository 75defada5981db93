"""Which model answers a CLI command: real Claude through the official client, or the offline
scripted model for the demo's conversations (and ``--offline``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from segue.cli._app import CliError
from segue.cli.demo import DEMO_MODEL, demo_model
from segue.executor.ports import LlmModel
from segue.statemachine import ConversationState

if TYPE_CHECKING:
    import anthropic

NO_KEY = "ANTHROPIC_API_KEY is not set: export your Anthropic API key, or try `segue demo`"


def api_key() -> str:
    """The API key from the environment (a setup error without one)."""
    key = os.environ.get("ANTHROPIC_API_KEY", "").strip()
    if not key:
        raise CliError(NO_KEY, 2)
    return key


async def claude(
    key: str,
    *,
    base_url: str | None,
    headers: dict[str, str],
    check_model: str | None = None,
) -> tuple[anthropic.AsyncAnthropic, LlmModel]:
    """A client and its adapter. With ``check_model`` the API is asked about that model first,
    so an unknown model or a bad key is one line (exit 2) before anything is stored."""
    import anthropic  # noqa: PLC0415  # ~2 s to import: only commands that call Claude pay

    from segue.executor.models.anthropic import AnthropicModel, call_error  # noqa: PLC0415

    client = anthropic.AsyncAnthropic(
        api_key=key, base_url=base_url, default_headers=headers or None
    )
    if check_model is not None:
        try:
            await client.models.retrieve(check_model)
        except anthropic.APIStatusError as exc:
            error = call_error(exc, model=check_model, secrets=(key, *headers.values()))
            if error.fatal:  # unknown model, bad key: no message can succeed
                await client.close()
                raise CliError(error.message, 2) from exc
        except anthropic.APIError:
            pass  # unreachable for now: the first message says so, after the runtime's retries
    return client, AnthropicModel(client=client)


@contextlib.asynccontextmanager
async def model_for(
    state: ConversationState,
    *,
    offline: bool,
    base_url: str | None,
    headers: dict[str, str],
) -> AsyncIterator[LlmModel]:
    """The model that answers ``state``'s requests: offline for the demo's conversations or
    when asked, else Claude (which needs the API key)."""
    if offline or state.model == DEMO_MODEL:
        yield demo_model()
        return
    client, model = await claude(api_key(), base_url=base_url, headers=headers)
    try:
        yield model
    finally:
        await client.close()
