"""Peek / examine answers (payload plus ``X-Pulsar-*`` headers) as JSON-ready messages.

A batch entry arrives as the whole uncompressed batch body with ``X-Pulsar-num-batch-message``;
it is split into its messages here, as Pulsar's admin client does, each with id
``ledger:entry:index``.
"""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

from keyshared.admin_cli.http import HttpResult

_U32 = struct.Struct(">I")


def decode_messages(result: HttpResult) -> list[dict[str, Any]]:
    """The messages of one entry returned by peek, examine or get-message-by-id."""
    h = result.headers
    base: dict[str, Any] = {
        "messageId": h.get("x-pulsar-message-id", ""),
        "publishTime": h.get("x-pulsar-publish-time"),
        "producerName": h.get("x-pulsar-producer-name"),
        "sequenceId": _int(h.get("x-pulsar-sequence-id")),
    }
    props = _properties(h)
    count = _int(h.get("x-pulsar-num-batch-message"))
    if count is None or h.get("x-pulsar-is-encrypted") == "true":
        msg = dict(base, key=h.get("x-pulsar-partition-key"), properties=props)
        msg.update(_payload(result.data))
        return [msg]
    from keyshared.protocol import pulsar_api_pb2 as pb

    out: list[dict[str, Any]] = []
    view = memoryview(result.data)
    pos = 0
    for index in range(count):
        if len(view) - pos < 4:
            break
        size = _U32.unpack_from(view, pos)[0]
        pos += 4
        single = pb.SingleMessageMetadata()
        single.ParseFromString(bytes(view[pos : pos + size]))
        pos += size
        payload = bytes(view[pos : pos + single.payload_size])
        pos += single.payload_size
        msg = dict(base, messageId=f"{base['messageId']}:{index}")
        msg["key"] = single.partition_key if single.HasField("partition_key") else None
        msg["properties"] = {**props, **{kv.key: kv.value for kv in single.properties}}
        if single.HasField("sequence_id"):
            msg["sequenceId"] = single.sequence_id
        msg.update(_payload(payload))
        out.append(msg)
    return out


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _properties(headers: dict[str, str]) -> dict[str, str]:
    whole = headers.get("x-pulsar-property")
    if whole:
        try:
            parsed = json.loads(whole)
            if isinstance(parsed, dict):
                return {str(k): str(v) for k, v in parsed.items()}
        except ValueError:
            pass
    prefix = "x-pulsar-property-"
    return {k[len(prefix) :]: v for k, v in headers.items() if k.startswith(prefix)}


def _payload(data: bytes) -> dict[str, Any]:
    try:
        return {"payload": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"payloadBase64": base64.b64encode(data).decode()}
