"""segue's transcript as an OpenAI request, for Chat Completions or the Responses API: what
``OpenAIModel`` sends, built apart from sending it so it can be read, tested and counted.

* **A normal turn** sends the history with its tools: segue's tools as function tools, each
  reply's tool calls (``tool_calls`` on the assistant message; ``function_call`` items), each
  result right after them (``tool`` messages with their ``tool_call_id``;
  ``function_call_output`` items with their ``call_id``), every call answered once
  (``history.paired``). Images go as data URLs in each API's shape (``image_url`` parts;
  ``input_image`` items); a PDF goes as an ``input_file`` on the Responses API, and Chat
  Completions, which cannot take one, is refused before anything is sent
  (``UnsupportedContentError``). Thinking blocks (another provider's) are left out.
* **The grace request** of a turn at its tool-round limit keeps the tools declared (the
  history holds calls) with ``tool_choice: "none"`` and the instruction last.
* **The requests at the limit** (continuation, checkpoint, compaction) offer no callable tool
  (REQ-SEG-047): given the turn's tools, the turn's prefix unchanged with ``tool_choice:
  "none"``, the rejected calls and the instruction last, so a server that caches prompt
  prefixes reads it back; without them (or after an overflow) the history as plain text turns
  (``history.text_turns``) with no tool declared. With ``reuse_prefix`` (REQ-SEG-055) they are
  the turn's request exactly, its tool choice included, with the rejected calls and the
  instruction last: OpenAI caches exact prompt prefixes on its own (``docs/providers.md``).
* **The provider's compaction** (Responses API, REQ-SEG-048): a turn asks for it with
  ``context_management``; its item goes back verbatim, first of the history
  (``openai_context``).
* **Model settings.** Reasoning models (the o-series, gpt-5) take ``max_completion_tokens``
  and refuse a temperature other than the default, so none is sent to them; other models take
  ``max_tokens`` (what every compatible server knows) and the conversation's temperature. A
  thinking budget becomes a reasoning effort.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from segue.errors import UnsupportedContentError
from segue.executor.model_port import LlmRequest, ToolSpec
from segue.executor.models.history import (
    AGENT_BLOCKS,
    agent_prose,
    offers_tools,
    paired,
    rejected_prose,
    role_text,
    text_turns,
    to_json,
)
from segue.executor.models.openai_context import COMPACTION, compaction_items
from segue.statemachine import Message, ModelSettings, ToolCall

Api = Literal["chat", "responses"]
Item = dict[str, Any]

_REASONING = re.compile(r"^(?:o\d+(?:-|$)|gpt-5(?!-chat)|codex-)")
_IMAGES_FOLLOW: Final = "[the images this tool returned follow]"


def is_reasoning_model(model: str) -> bool:
    """Whether ``model`` is one of OpenAI's reasoning models by its name (o1, o3, o4-mini,
    gpt-5...), which take ``max_completion_tokens`` and no temperature."""
    name = model.strip().lower().removeprefix("openai/")
    return bool(_REASONING.match(name))


@dataclass(frozen=True, slots=True)
class Payload:
    """The keyword arguments of one create call (besides ``model`` and ``stream``).

    ``items`` are the messages (Chat Completions) or input items (Responses); ``options`` the
    other parameters (tools, tool choice, token bound, temperature...)."""

    api: Api
    items: list[Item]
    tools: list[Item]
    max_tokens: int
    options: dict[str, Any] = field(default_factory=dict)

    def arguments(self) -> dict[str, Any]:
        """Everything to pass to ``chat.completions.create`` / ``responses.create``."""
        key = "messages" if self.api == "chat" else "input"
        arguments: dict[str, Any] = {key: self.items, **self.options}
        if self.tools:
            arguments["tools"] = self.tools
        return arguments


def build_payload(
    request: LlmRequest, *, api: Api, max_tokens: int, reasoning: bool | None = None
) -> Payload:
    """The request for ``api``: a turn's, or a request at the limit (the turn's prefix with
    ``tool_choice`` none when the turn's tools come with it, else the history as text, no tool
    declared); ``reasoning`` None: told by the model's name. ``UnsupportedContentError`` for
    content the API cannot take."""
    thinks = is_reasoning_model(request.model) if reasoning is None else reasoning
    tools: list[Item] = []
    options: dict[str, Any] = {}
    # REQ-SEG-047: at the limit, given the turn's tools, the turn's prefix with no tool callable.
    prefix = request.purpose != "turn" and bool(request.tools) and request.trim_level == 0
    # REQ-SEG-055: the turn's request repeated, its tool choice included, the instruction last.
    reuse = request.purpose != "turn" and request.reuse_prefix and request.trim_level == 0
    forbid = request.final or (prefix and not reuse)  # no tool may be called
    if api == "responses" and request.compaction is not None and request.purpose != "turn":
        items = _responses_history(request)  # compacted on demand: the history, as it is
    elif request.purpose == "turn" or prefix or reuse:
        items = _chat_history(request) if api == "chat" else _responses_history(request)
        closing = [request.instruction or ""]
        if prefix or reuse:
            closing.insert(0, rejected_prose(request.rejected_tool_calls))
        if any(closing):
            items.append(_user_text(api, "\n\n".join(part for part in closing if part)))
        if offers_tools(request) or prefix:
            tools = [_tool(api, spec) for spec in request.tools]
            choice = "none" if forbid else _tool_choice(api, request.settings)
            if choice is not None:
                options["tool_choice"] = choice
            if _no_parallel(request.settings) and not forbid:
                options["parallel_tool_calls"] = False
    else:
        items = _limit_items(api, request)
    if request.system:
        if api == "chat":
            items.insert(0, {"role": "system", "content": request.system})
        else:
            options["instructions"] = request.system
    bound = max(1, max_tokens)
    options.update(_settings(api, request.settings, bound, thinks=thinks))
    asked = request.compaction
    if api == "responses" and asked is not None and request.purpose == "turn":
        threshold = {"type": COMPACTION, "compact_threshold": asked.trigger_tokens}
        options["context_management"] = [threshold]  # the provider compacts (REQ-SEG-048)
    return Payload(api=api, items=items, tools=tools, max_tokens=bound, options=options)


def _limit_items(api: Api, request: LlmRequest) -> list[Item]:
    """A tool-less request's items: the history as plain text turns, or, on Chat Completions
    when no tool is in the history and nothing is trimmed, the turns' own messages with the
    instruction last. ``text_turns`` joins a seeded child's summary and first message into one,
    a prompt the server has not seen: a server that caches prompt prefixes (llama.cpp's slot)
    then reads the whole conversation anew (measured: 54 of 747 prompt tokens from its cache
    at a child's limit; 700 of 750 with the turns' messages)."""
    plain = (
        api == "chat"
        and request.trim_level == 0
        and bool(request.instruction)
        and not any(m.tool_calls or m.kind == "tool_result" for m in request.messages)
    )
    if not plain:
        return [_turn(api, turn.role, turn.text) for turn in text_turns(request)]
    items = _chat_history(request)
    closing = [rejected_prose(request.rejected_tool_calls), request.instruction or ""]
    items.append(_user_text(api, "\n\n".join(part for part in closing if part)))
    return items


def _settings(api: Api, settings: ModelSettings, bound: int, *, thinks: bool) -> dict[str, Any]:
    """The token bound, temperature and reasoning effort, as the model takes them."""
    options: dict[str, Any] = {}
    if api == "responses":
        options["max_output_tokens"] = bound
        options["store"] = False  # segue keeps the history and sends it whole each time
    elif thinks:
        options["max_completion_tokens"] = bound
    else:
        options["max_tokens"] = bound
    if settings.temperature is not None and not thinks:
        options["temperature"] = settings.temperature
    if settings.thinking_budget is not None and thinks:
        effort = _effort(settings.thinking_budget)
        if api == "chat":
            options["reasoning_effort"] = effort
        else:
            options["reasoning"] = {"effort": effort}
    return options


def _effort(budget: int) -> str:
    if budget < 4_096:
        return "low"
    return "medium" if budget < 16_384 else "high"


def _tool(api: Api, spec: ToolSpec) -> Item:
    parameters = dict(spec.input_schema) or {"type": "object", "properties": {}}
    if api == "chat":
        function = {"name": spec.name, "description": spec.description, "parameters": parameters}
        return {"type": "function", "function": function}
    return {
        "type": "function",
        "name": spec.name,
        "description": spec.description,
        "parameters": parameters,
        "strict": False,
    }


def _tool_choice(api: Api, settings: ModelSettings) -> Any:
    """The conversation's tool choice (the Messages API's shape) in OpenAI's."""
    choice = settings.tool_choice
    if choice is None:
        return None
    kind = choice.get("type")
    if kind == "tool":
        if api == "chat":
            return {"type": "function", "function": {"name": choice["name"]}}
        return {"type": "function", "name": choice["name"]}
    return {"any": "required", "none": "none"}.get(str(kind), "auto")


def _no_parallel(settings: ModelSettings) -> bool:
    choice = settings.tool_choice
    return bool(choice and choice.get("disable_parallel_tool_use"))


def _turn(api: Api, role: str, text: str) -> Item:
    if api == "chat" or role == "user":
        return {"role": role, "content": text}
    return {"role": "assistant", "content": text}


def _user_text(api: Api, text: str) -> Item:
    return _turn(api, "user", text)


# --------------------------------------------------------------------------- content


def _image_url(block: Any) -> str:
    source = block.source
    if source.type == "url":
        return str(source.url)
    return f"data:{source.media_type};base64,{source.data}"


def _document_text(block: Any) -> str:
    title = f"[document {block.title!r}]\n" if block.title else "[document]\n"
    return title + str(block.source.data)


def _user_parts(api: Api, message: Message) -> list[Item]:
    """A user message's blocks as content parts (``UnsupportedContentError`` for a PDF on
    Chat Completions)."""
    parts: list[Item] = []
    text_kind = "text" if api == "chat" else "input_text"
    block: Any
    for block in message.content:
        kind = block.type
        if kind == "text":
            if block.text.strip():
                parts.append({"type": text_kind, "text": block.text})
        elif kind == "image":
            if api == "chat":
                parts.append({"type": "image_url", "image_url": {"url": _image_url(block)}})
            else:
                parts.append({"type": "input_image", "image_url": _image_url(block)})
        elif kind == "document":
            if block.source.type == "text":
                parts.append({"type": text_kind, "text": _document_text(block)})
            elif api == "chat":
                name = f" {block.title!r}" if block.title else ""
                msg = (
                    f"the document{name} is a PDF, which Chat Completions cannot take: use "
                    'OpenAIModel(client, api="responses"), or send the document\'s text'
                )
                raise UnsupportedContentError(msg)
            else:
                parts.append(_input_file(block))
        elif kind in AGENT_BLOCKS:
            parts.append({"type": text_kind, "text": agent_prose(block)})
    return parts


def _user_item(api: Api, message: Message) -> Item:
    """A message sent as the user's (a user's own, a summary...): a user's blocks as content
    parts, any other as its text."""
    if message.content and message.kind == "user":
        return {"role": "user", "content": _user_parts(api, message)}
    return {"role": "user", "content": role_text(message)[1]}


def _input_file(block: Any) -> Item:
    source = block.source
    filename = block.title or "document.pdf"
    if source.type == "url":
        return {"type": "input_file", "file_url": source.url}
    data = f"data:{source.media_type};base64,{source.data}"
    return {"type": "input_file", "filename": filename, "file_data": data}


def _assistant_text(message: Message) -> str:
    """A reply's text as sent back: its text blocks, or its text, with another provider's
    agent tools told in prose; thinking is left out (no OpenAI API takes another's)."""
    if not message.content:
        return role_text(message)[1]
    texts: list[str] = []
    for block in message.content:
        if block.type == "text":
            texts.append(block.text)
        elif block.type in AGENT_BLOCKS:
            texts.append(agent_prose(block))
    return "".join(texts) if texts else message.text


def _calls(message: Message) -> list[ToolCall]:
    """The reply's tool calls, with any ``tool_use`` block its ``tool_calls`` does not hold."""
    calls = list(message.tool_calls)
    known = {c.id for c in calls}
    for block in message.content:
        if block.type == "tool_use" and block.id not in known:
            calls.append(ToolCall(id=block.id, name=block.name, input=block.input))
    return calls


def _result_parts(message: Message) -> tuple[str, list[Any]]:
    """A tool result's text and its images."""
    if not message.content:
        return message.text, []
    texts = [b.text for b in message.content if b.type == "text"]
    images = [b for b in message.content if b.type == "image"]
    return ("".join(texts) if texts else message.text), images


# --------------------------------------------------------------------------- Chat Completions


def _chat_history(request: LlmRequest) -> list[Item]:
    items: list[Item] = []
    images: list[Item] = []  # a tool's images, sent as a user message after the results

    def flush_images() -> None:
        if images:
            items.append({"role": "user", "content": list(images)})
            images.clear()

    for message in _with_calls(request.messages):
        if message.kind == "tool_result":
            text, shown = _result_parts(message)
            if shown:
                text = f"{text}\n{_IMAGES_FOLLOW}" if text else _IMAGES_FOLLOW
                images.extend(
                    {"type": "image_url", "image_url": {"url": _image_url(b)}} for b in shown
                )
            items.append({"role": "tool", "tool_call_id": message.tool_call_id, "content": text})
            continue
        flush_images()
        if role_text(message)[0] == "user":
            items.append(_user_item("chat", message))
            continue
        calls = _calls(message) if message.kind == "assistant" else []
        item: Item = {"role": "assistant", "content": _assistant_text(message) or None}
        if calls:
            item["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": to_json(call.input)},
                }
                for call in calls
            ]
        if item["content"] is None and not calls:
            item["content"] = ""
        items.append(item)
    flush_images()
    return items


def _with_calls(messages: Sequence[Message]) -> list[Message]:
    """``paired`` sees calls only in ``tool_calls``: fold stray ``tool_use`` blocks in first."""
    out: list[Message] = []
    for message in messages:
        calls = _calls(message) if message.kind == "assistant" and message.content else []
        if len(calls) > len(message.tool_calls):
            out.append(message.model_copy(update={"tool_calls": tuple(calls)}))
        else:
            out.append(message)
    return paired(out)


# --------------------------------------------------------------------------- Responses


def _responses_history(request: LlmRequest) -> list[Item]:
    items: list[Item] = []
    for message in _with_calls(request.messages):
        compaction = compaction_items(message)
        if compaction is not None:  # the provider's own, back as it came (REQ-SEG-048)
            items += compaction
            continue
        if message.kind == "tool_result":
            text, shown = _result_parts(message)
            output: Any = text
            if shown:
                output = [{"type": "input_text", "text": text}] if text else []
                output += [{"type": "input_image", "image_url": _image_url(b)} for b in shown]
            items.append(
                {"type": "function_call_output", "call_id": message.tool_call_id, "output": output}
            )
            continue
        if role_text(message)[0] == "user":
            items.append(_user_item("responses", message))
            continue
        said = _assistant_text(message)
        if said:
            items.append({"role": "assistant", "content": said})
        if message.kind == "assistant":
            items += [
                {
                    "type": "function_call",
                    "call_id": call.id,
                    "name": call.name,
                    "arguments": to_json(call.input),
                }
                for call in message.tool_calls
            ]
    return items


def check_content(blocks: Sequence[Any], *, api: Api) -> None:
    """Raise ``UnsupportedContentError`` if ``api`` cannot take one of ``blocks`` (for an
    application that wants the refusal before the message is stored)."""
    _user_parts(api, Message(kind="user", text="", content=tuple(blocks)))


__all__ = [
    "Api",
    "Payload",
    "UnsupportedContentError",
    "build_payload",
    "check_content",
    "is_reasoning_model",
]
