"""UTF-8 validation of protobuf string fields after parsing.

proto2 does not validate UTF-8 when parsing, and the upb runtime then hands out a ``bytes``
object where the type says ``str``. Code that trusts the type (``topic.startswith(...)``) would
crash far from the socket, so the decoder rejects such commands up front. Which fields of which
message types can hold strings is computed once from the descriptors, so commands without string
fields (SEND, FLOW, MESSAGE, most ACKs) cost nothing.
"""

from __future__ import annotations

from functools import cache

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

# (field name, is a string field, is repeated) for every field that can hold a string; a field
# that is not a string field is a message field whose type can.
_Plan = tuple[tuple[str, bool, bool], ...]

_TYPE_STRING = FieldDescriptor.TYPE_STRING
_TYPE_MESSAGE = FieldDescriptor.TYPE_MESSAGE


@cache
def _plan(descriptor: Descriptor) -> _Plan:
    return tuple(_build_plan(descriptor, frozenset()))


def _build_plan(descriptor: Descriptor, visiting: frozenset[str]) -> list[tuple[str, bool, bool]]:
    visiting = visiting | {descriptor.full_name}
    plan: list[tuple[str, bool, bool]] = []
    for field in descriptor.fields:
        if field.type == _TYPE_STRING:
            plan.append((field.name, True, field.is_repeated))
        elif field.type == _TYPE_MESSAGE and field.message_type is not None:
            sub = field.message_type
            # A recursive type (MessageIdData.first_chunk_message_id) holds strings only if its
            # own fields do; the plan for that type covers the rest.
            holds_strings = (
                any(f.type == _TYPE_STRING for f in sub.fields)
                if sub.full_name in visiting
                else bool(_build_plan(sub, visiting))
            )
            if holds_strings:
                plan.append((field.name, False, field.is_repeated))
    return plan


def invalid_string_field(message: Message) -> str | None:
    """Dotted path of the first string field holding invalid UTF-8, or None if all are valid."""
    for name, is_string, repeated in _plan(message.DESCRIPTOR):
        if is_string:
            if repeated:
                if any(isinstance(v, bytes) for v in getattr(message, name)):
                    return name
            elif message.HasField(name) and isinstance(getattr(message, name), bytes):
                return name
        elif repeated:
            for item in getattr(message, name):
                bad = invalid_string_field(item)
                if bad is not None:
                    return f"{name}.{bad}"
        elif message.HasField(name):
            bad = invalid_string_field(getattr(message, name))
            if bad is not None:
                return f"{name}.{bad}"
    return None


def has_string_fields(message: Message, field: str | None = None) -> bool:
    """Whether messages of this type (or of the type of its message field ``field``) can hold a
    string anywhere inside."""
    if field is not None:
        message = getattr(message, field)
    return bool(_plan(message.DESCRIPTOR))
