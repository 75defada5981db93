"""What an id and a conversation's metadata may be: the bounds every way in checks the same.

A store refuses an id it cannot hold, the REST schemas and the CLI refuse one before asking, an
import refuses one in a document: each reads the bounds here. They sit below the stores and
the server alike (the server's schemas and the runtime's conversations import them without
reaching into a store's private helpers).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from annotated_types import MaxLen

from segue.errors import InvalidMetadataError
from segue.statemachine.state import ConversationConfig

MAX_ID_LENGTH: Final = next(
    rule.max_length
    for rule in ConversationConfig.model_fields["id"].metadata
    if isinstance(rule, MaxLen)
)
"""The longest id a conversation may have (its config says), so the longest a store holds."""
ID_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
"""An id an application chooses (an import's, ``--id``): letters, digits, ``.``, ``_`` and
``-``, so that it reads the same in every address (``/c/{id}``, ``/api/conversations/{id}``)
and on the command line."""


MAX_METADATA_KEYS: Final = 64
MAX_METADATA_KEY: Final = 64
MAX_METADATA_VALUE: Final = 1024
"""Bounds on a conversation's metadata: labels for finding conversations (a user, a title, a
project), not a document store; each pair is an index entry."""


def checked_metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
    """``metadata`` as a plain dict, or ``InvalidMetadataError`` saying what to change: string
    keys and values (no NUL, which PostgreSQL's text cannot hold), at most
    ``MAX_METADATA_KEYS`` keys of ``MAX_METADATA_KEY`` characters, values of at most
    ``MAX_METADATA_VALUE``."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        msg = f"metadata is a mapping of strings to strings, not {type(metadata).__name__}"
        raise InvalidMetadataError(msg)
    if len(metadata) > MAX_METADATA_KEYS:
        msg = f"metadata holds {len(metadata)} keys; at most {MAX_METADATA_KEYS} are kept"
        raise InvalidMetadataError(msg)
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            msg = f"metadata keys and values are strings: {key!r}: {value!r} is not"
            raise InvalidMetadataError(msg)
        if not key or len(key) > MAX_METADATA_KEY:
            msg = f"a metadata key has 1 to {MAX_METADATA_KEY} characters: {key[:80]!r}"
            raise InvalidMetadataError(msg)
        if len(value) > MAX_METADATA_VALUE:
            msg = (
                f"metadata {key!r} has {len(value):,} characters; at most "
                f"{MAX_METADATA_VALUE:,} are kept"
            )
            raise InvalidMetadataError(msg)
        if "\x00" in key or "\x00" in value:
            msg = f"metadata {key!r} holds a NUL character, which no store can keep"
            raise InvalidMetadataError(msg)
    return dict(metadata)


__all__ = [
    "ID_PATTERN",
    "MAX_ID_LENGTH",
    "MAX_METADATA_KEY",
    "MAX_METADATA_KEYS",
    "MAX_METADATA_VALUE",
    "checked_metadata",
]
