"""``segue eval-summary``: what a conversation keeps across the limit, with your settings.

Plants typed facts in a synthetic conversation, carries it through ``--limits`` limits with the
provider, model, behaviour, summary prompt and model, compaction, pinned messages and window
given, then asks for each fact and scores the answers (``segue.testing.retention``). The
conversations live in memory: nothing is stored. ``--min-recall`` makes the exit code 1 below
it, so a CI job can gate a summary prompt. Without the provider's key it runs offline, on the
scripted model, and says what that figure measures.
"""

from __future__ import annotations

import contextlib
from typing import Annotated

import typer

from segue.cli._app import (
    BaseUrlOption,
    BehaviorOption,
    CliError,
    CompactionOption,
    ContextEditsOption,
    HeaderOption,
    JsonOption,
    app,
    context_edits_of,
    headers_of,
    options_of,
    run,
    whole_number,
)
from segue.cli._models import api_key, connect, offline_line, provider_for
from segue.cli._output import console, entry, print_json, say
from segue.executor.model_port import LlmModel
from segue.executor.models.providers import DEFAULT_MODELS
from segue.executor.models.scripted import ScriptedModel
from segue.executor.models.windows import WindowReporter
from segue.statemachine import ContextExhaustionBehavior as Behavior
from segue.testing.retention import (
    PerfectReader,
    RetentionError,
    RetentionReport,
    evaluate,
    plant_facts,
    report_table,
)

DEFAULT_WINDOW = 8_000
"""The window a run uses unless told (or the model's, if smaller): small, so limits come fast."""


def _recall(given: str) -> float:
    try:
        value = float(given)
    except ValueError:
        raise typer.BadParameter(f"{given!r} is not a number from 0 to 1") from None
    if not 0 <= value <= 1:
        raise typer.BadParameter(f"{given!r} is not a number from 0 to 1")
    return value


@app.command("eval-summary")
def eval_summary(  # a typer command's options are its parameters
    provider: Annotated[
        str | None,
        typer.Option(
            metavar="NAME", help="anthropic or openai (default: told by --model, else anthropic)."
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(metavar="ID", help="Model id (default: claude-sonnet-4-6, or gpt-4o)."),
    ] = None,
    base_url: BaseUrlOption = None,
    header: HeaderOption = None,
    behavior: BehaviorOption = Behavior.COMPACT_IN_PLACE,
    context_window: Annotated[
        int | None,
        typer.Option(
            parser=whole_number(1_000),
            metavar="TOKENS",
            help=f"The window the run uses (default {DEFAULT_WINDOW:,}, or the model's if "
            "smaller): a small one makes the limits come fast.",
        ),
    ] = None,
    limits: Annotated[
        int,
        typer.Option(
            "--limits",
            parser=whole_number(1, 30),
            metavar="K",
            help="Limits to carry the facts through after the last is told (1 to 30).",
        ),
    ] = 3,
    facts: Annotated[
        int,
        typer.Option(parser=whole_number(1, 500), metavar="N", help="Facts to plant."),
    ] = 24,
    seed: Annotated[
        int, typer.Option(parser=whole_number(0), metavar="N", help="Draws the facts' values.")
    ] = 0,
    summary_prompt: Annotated[
        str | None,
        typer.Option(
            metavar="TEXT", help="The instruction sent at the limit, in place of segue's."
        ),
    ] = None,
    summary_model: Annotated[
        str | None, typer.Option(metavar="ID", help="The model the limit's requests go to.")
    ] = None,
    compaction: CompactionOption = "segue",
    context_edits: ContextEditsOption = None,
    pin: Annotated[
        list[str] | None,
        typer.Option(
            metavar="TEXT", help="A message told first and pinned (repeatable), as your app pins."
        ),
    ] = None,
    min_recall: Annotated[
        float | None,
        typer.Option(parser=_recall, metavar="R", help="Exit 1 when recall is below R (0 to 1)."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Measure what your settings keep across the limit: plant facts, cross the limits, ask.

    Without the provider's key it runs offline on the scripted model (a perfect reader that
    summarises little): that figure measures what the tail and pinned messages keep.
    """
    chosen = provider_for(provider, model)
    key = api_key(chosen)
    fields = {
        "model": model or DEFAULT_MODELS[chosen],
        "behavior": behavior,
        "summary_prompt": summary_prompt,
        "summary_model": summary_model,
        "compaction": compaction,
        "context_edits": context_edits_of(context_edits) or None,
    }
    given = {k: v for k, v in fields.items() if v is not None}
    options = options_of(given)  # a bad option is refused before any model is asked
    out = console()
    if key is None and not as_json:
        say(out, offline_line(chosen, base_url))
    planted = plant_facts(facts, seed=seed)

    async def measure() -> RetentionReport:
        async with contextlib.AsyncExitStack() as stack:
            llm: LlmModel
            if key is None:
                llm = ScriptedModel(default=PerfectReader(planted))
            else:
                client, llm = await connect(
                    chosen, key, base_url=base_url, headers=headers_of(header)
                )
                stack.push_async_callback(client.close)
            window = context_window or min(DEFAULT_WINDOW, await _window(llm, options.model))
            sized = options_of({**given, "context_window": window})
            try:
                return await evaluate(
                    llm,
                    sized,
                    facts=planted,
                    limits=limits,
                    seed=seed,
                    pinned=pin or (),
                    offline=key is None,
                )
            except RetentionError as error:
                raise CliError(str(error), 1) from None

    report = run(measure())
    if as_json:
        print_json(report.to_json())
    else:
        for line in report_table(report):
            (entry if line.startswith("  ") else say)(out, line)  # a lost fact: one line each
    if min_recall is not None and report.recall < min_recall:
        if not as_json:
            say(out, f"recall {report.recall:.2f} is below --min-recall {min_recall:g}")
        raise typer.Exit(1)


async def _window(llm: LlmModel, model: str) -> int:
    """The model's window as its adapter reports it (the default when it cannot say)."""
    if not isinstance(llm, WindowReporter):
        return DEFAULT_WINDOW
    return (await llm.window(model)).tokens
