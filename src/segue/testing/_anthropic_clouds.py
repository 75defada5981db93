"""Claude on Amazon Bedrock and Google Vertex AI as the fake Anthropic server answers them: the
same Messages API under the clouds' paths (the model named in the path), and Bedrock's stream
as AWS event-stream frames (what ``botocore.eventstream`` parses for the SDK's Bedrock client).
"""

from __future__ import annotations

import base64
import json
import re
import struct
import zlib
from typing import Any, Final
from urllib.parse import unquote

_BEDROCK: Final = re.compile(
    r"^/model/(?P<model>[^/]+)/(?P<how>invoke|invoke-with-response-stream)$"
)
_VERTEX: Final = re.compile(
    r"^(?:/v1)?/projects/[^/]+/locations/[^/]+/publishers/anthropic/models/"
    r"(?P<model>[^/:]+):(?P<how>rawPredict|streamRawPredict)$"
)


def cloud_call(path: str) -> tuple[str, bool, bool] | None:
    """``(model, stream, bedrock)`` of a Bedrock or Vertex AI Messages call, else None."""
    if (bedrock := _BEDROCK.match(path)) is not None:
        return unquote(bedrock["model"]), bedrock["how"] != "invoke", True
    if (vertex := _VERTEX.match(path)) is not None:
        return unquote(vertex["model"]), vertex["how"] == "streamRawPredict", False
    return None


_BEDROCK_NAME: Final = re.compile(
    r"^(?:.*/)?(?:[a-z]{2,6}\.)?anthropic\.(?P<name>.+?)(?:-v\d+(?::\d+)?)?$"
)


def served(model: str, *, bedrock: bool) -> tuple[str, str]:
    """``(id prefix, model)`` of a cloud's answer: Bedrock's message ids begin ``msg_bdrk_``
    and Vertex AI's ``msg_vrtx_``; both name the model as the Messages API does
    (``anthropic.claude-3-5-sonnet-20241022-v2:0`` answers as ``claude-3-5-sonnet-20241022``,
    ``claude-sonnet-4-5@20250929`` as ``claude-sonnet-4-5-20250929``)."""
    if bedrock:
        named = _BEDROCK_NAME.match(model)
        return "msg_bdrk_", named["name"] if named is not None else model
    return "msg_vrtx_", model.replace("@", "-")


def _aws_header(name: str, value: str) -> bytes:
    key, text = name.encode(), value.encode()
    return struct.pack(">B", len(key)) + key + b"\x07" + struct.pack(">H", len(text)) + text


def aws_frame(event: dict[str, Any]) -> bytes:
    """One AWS event-stream message (prelude, headers, payload, CRC32s) carrying ``event``
    as Bedrock carries a Messages API event."""
    payload = json.dumps({"bytes": base64.b64encode(json.dumps(event).encode()).decode()})
    headers = b"".join(
        _aws_header(name, value)
        for name, value in (
            (":event-type", "chunk"),
            (":content-type", "application/json"),
            (":message-type", "event"),
        )
    )
    total = 12 + len(headers) + len(payload) + 4
    prelude = struct.pack(">II", total, len(headers))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + headers + payload.encode()
    return message + struct.pack(">I", zlib.crc32(message))


__all__ = ["aws_frame", "cloud_call", "served"]
