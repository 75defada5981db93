"""What the built-in harnesses read back and write out on a fake's wire, in the conformance
kit's neutral terms (``Sent``) or as the raw events a fake cannot script: kept apart from
``harnesses`` so that each harness there holds only how its provider is scripted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from segue.testing.conformance import Call, Sent, SentTurn


def anthropic_raw_arguments(reply: Any, broken: list[Call]) -> Any:
    """A whole stream whose tool input is text that is not JSON (the fake server sends only
    JSON inputs, so this one is written out as raw server-sent events)."""
    import json  # noqa: PLC0415

    from segue.testing import anthropic_server as fake  # noqa: PLC0415

    call = broken[0]
    start: dict[str, Any] = {
        "id": "msg_raw",
        "type": "message",
        "role": "assistant",
        "model": "conformance-model",
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": 10, "output_tokens": 1},
    }
    block = {"type": "tool_use", "id": call.id or "toolu_bad", "name": call.name, "input": {}}
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": block},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": call.input},
        },
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use"},
            "usage": {"output_tokens": 5},
        },
        {"type": "message_stop"},
    ]
    body = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)
    return fake.RawReply(status=200, body=body.encode(), content_type="text/event-stream")


def anthropic_sent(body: dict[str, Any], headers: Mapping[str, str]) -> Sent:
    turns: list[SentTurn] = []
    for message in body["messages"]:
        content = message["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        texts = [b["text"] for b in blocks if b["type"] == "text"]
        if any(b["type"] == "compaction" for b in blocks) and not texts:
            continue  # the provider's own compaction: no turn of text
        calls = tuple((b["id"], b["name"], b["input"]) for b in blocks if b["type"] == "tool_use")
        images = sum(b["type"] == "image" for b in blocks)
        results = [b for b in blocks if b["type"] == "tool_result"]
        for result in results:
            inner = result.get("content", "")
            text = inner if isinstance(inner, str) else "".join(b.get("text", "") for b in inner)
            turns.append(SentTurn(role="tool", text=text, result_for=result["tool_use_id"]))
        if texts or calls or images or not results:
            turns.append(
                SentTurn(
                    role=message["role"],
                    text="\n".join(texts),
                    calls=calls,
                    images=images,
                    parts=tuple(texts),
                )
            )
    system = body.get("system")
    if isinstance(system, list):
        system = "".join(b["text"] for b in system)
    choice = body.get("tool_choice") or {}
    edits = (body.get("context_management") or {}).get("edits") or []
    trigger = next(
        (e["trigger"]["value"] for e in edits if e.get("type") == "compact_20260112"), None
    )
    return Sent(
        tools=tuple(t["name"] for t in body.get("tools", ())),
        tool_choice_none=choice.get("type") == "none",
        system=system,
        turns=tuple(turns),
        raw=body,
        headers=headers,
        compaction_trigger=trigger,
    )


def openai_sent(body: dict[str, Any], headers: Mapping[str, str]) -> Sent:
    turns: list[SentTurn] = []
    system = body.get("instructions")
    for item in body.get("messages") or body.get("input") or ():
        kind = item.get("type")
        if kind == "compaction":  # the provider's own, opaque: no turn of text
            continue
        if kind == "function_call":
            turns.append(
                SentTurn(
                    role="assistant",
                    calls=((item["call_id"], item["name"], loads(item["arguments"])),),
                )
            )
            continue
        if kind == "function_call_output":
            output = item["output"]
            text = output if isinstance(output, str) else "".join(p.get("text", "") for p in output)
            turns.append(SentTurn(role="tool", text=text, result_for=item["call_id"]))
            continue
        role = item["role"]
        if role == "system":
            system = item["content"]
            continue
        content = item.get("content")
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        pieces = tuple(
            p["text"]
            for p in parts
            if p.get("type") in ("text", "input_text", "output_text") and p["text"]
        )
        images = sum(p.get("type") in ("image_url", "input_image") for p in parts)
        calls = tuple(
            (c["id"], c["function"]["name"], loads(c["function"]["arguments"]))
            for c in item.get("tool_calls", ())
        )
        turns.append(
            SentTurn(
                role=role,
                text="\n".join(pieces),
                calls=calls,
                result_for=item.get("tool_call_id"),
                images=images,
                parts=pieces,
            )
        )
    tools = tuple(
        t["function"]["name"] if "function" in t else t["name"] for t in body.get("tools", ())
    )
    managed = [m for m in body.get("context_management") or () if m.get("type") == "compaction"]
    return Sent(
        tools=tools,
        tool_choice_none=body.get("tool_choice") == "none",
        system=system,
        turns=tuple(turns),
        raw=body,
        headers=headers,
        compaction_trigger=managed[0].get("compact_threshold") if managed else None,
    )


def loads(text: str) -> Any:
    import json  # noqa: PLC0415

    try:
        return json.loads(text)
    except ValueError:
        return text


__all__ = ["anthropic_raw_arguments", "anthropic_sent", "loads", "openai_sent"]
