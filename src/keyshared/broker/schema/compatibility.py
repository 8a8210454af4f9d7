"""Pulsar's schema compatibility strategies, checked on schema definitions.

AVRO and JSON schemas carry an Avro record definition (Pulsar's clients send Avro JSON for
both); they are checked with Apache Avro's reader/writer rules. Every other type is compatible
with a schema of the same type (Pulsar's default checker) and never with another type.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from keyshared.config import SCHEMA_STRATEGIES

if TYPE_CHECKING:
    import avro.schema

# Apache Avro is imported where a definition is first checked, not with the broker: it takes
# ~15 ms of a start-up whose target is 0.5 s to listening, and most topics carry no Avro schema.

STRATEGIES = SCHEMA_STRATEGIES
"""Pulsar's ``SchemaCompatibilityStrategy`` values (``UNDEFINED`` means "not set")."""

# Schema.Type numbers of the types whose definitions are Avro records.
AVRO_TYPES = frozenset({2, 4})  # JSON, AVRO


TYPE_NAMES = [
    "NONE",
    "STRING",
    "JSON",
    "PROTOBUF",
    "AVRO",
    "BOOLEAN",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FLOAT",
    "DOUBLE",
    "DATE",
    "TIME",
    "TIMESTAMP",
    "KEY_VALUE",
    "INSTANT",
    "LOCAL_DATE",
    "LOCAL_TIME",
    "LOCAL_DATE_TIME",
    "PROTOBUF_NATIVE",
]
"""Pulsar's ``SchemaType`` names by wire number (``Schema.Type``); NONE is BYTES."""


def type_name(number: int) -> str:
    """Pulsar's name of a schema type number (BYTES for NONE)."""
    if number == 0:
        return "BYTES"
    return TYPE_NAMES[number] if 0 <= number < len(TYPE_NAMES) else str(number)


@dataclass(frozen=True, slots=True)
class Definition:
    """What the compatibility rules look at: the type and the definition bytes."""

    type: int
    data: bytes


class IncompatibleSchemaError(Exception):
    """The schema breaks the strategy; the message says why (sent to the client)."""


def _parse(data: bytes, *, named_as: bytes | None = None) -> avro.schema.Schema:
    """The Avro schema of ``data``; with ``named_as``, its top-level record takes that
    definition's name: Pulsar checks with Avro's resolving grammar, which matches the top-level
    records whatever their names (clients name them after their classes, User1 then User2)."""
    import avro.errors
    import avro.schema

    try:
        text = data.decode()
        if named_as is not None:
            tree, other = json.loads(text), json.loads(named_as)
            if isinstance(tree, dict) and isinstance(other, dict):
                for key in ("name", "namespace"):
                    if key in other:
                        tree[key] = other[key]
                    else:
                        tree.pop(key, None)
                text = json.dumps(tree)
        return avro.schema.parse(text)
    except (UnicodeDecodeError, avro.errors.AvroException, ValueError) as exc:
        raise IncompatibleSchemaError(f"Invalid schema definition: {exc}") from None


def _can_read(reader: Definition, writer: Definition) -> str | None:
    """None when ``reader`` can read data written with ``writer``, else the reason."""
    if reader.type != writer.type:
        return (
            f"Incompatible schema: exists schema type {type_name(writer.type)}, "
            f"new schema type {type_name(reader.type)}"
        )
    if reader.type not in AVRO_TYPES or reader.data == writer.data:
        return None
    import avro.compatibility

    checker = avro.compatibility.ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]
    result = checker.get_compatibility(
        _parse(reader.data, named_as=writer.data), _parse(writer.data)
    )
    if result.compatibility is avro.compatibility.SchemaCompatibilityType.compatible:
        return None
    detail = "; ".join(sorted(str(m) for m in result.messages))
    return f"Unable to read schema: {writer.data.decode()} using schema: {reader.data.decode()}" + (
        f" ({detail})" if detail else ""
    )


def check_compatible(new: Definition, existing: Sequence[Definition], strategy: str) -> None:
    """Raise :class:`IncompatibleSchemaError` unless ``new`` may follow ``existing`` (oldest
    first) under ``strategy``."""
    if strategy not in STRATEGIES:
        raise IncompatibleSchemaError(f"Unknown schema compatibility strategy {strategy}")
    if not existing or strategy == "ALWAYS_COMPATIBLE":
        if new.type in AVRO_TYPES:
            _parse(new.data)
        return
    if strategy == "ALWAYS_INCOMPATIBLE":
        raise IncompatibleSchemaError(
            "Schema evolution is refused: the compatibility strategy is ALWAYS_INCOMPATIBLE"
        )
    if new.type in AVRO_TYPES:
        _parse(new.data)
    against = existing if strategy.endswith("_TRANSITIVE") else existing[-1:]
    base = strategy.removesuffix("_TRANSITIVE")
    for old in reversed(against):
        reasons = []
        if base in ("BACKWARD", "FULL"):
            reasons.append(_can_read(new, old))
        if base in ("FORWARD", "FULL"):
            reasons.append(_can_read(old, new))
        for reason in reasons:
            if reason is not None:
                raise IncompatibleSchemaError(f"{strategy} compatibility check failed: {reason}")
