"""A stored entry as Pulsar's admin API returns it from peek, examine and get-message-by-id.

The body is the entry's payload, uncompressed (for a batch: the whole batch body, which the
admin client splits itself); the metadata travels in ``X-Pulsar-*`` headers with the names the
Java admin client reads (``TopicsImpl``). Header values that HTTP cannot carry (non-Latin-1 or
control characters) are left out of the per-field headers; the properties are also sent whole as
ASCII JSON in ``X-Pulsar-PROPERTY``, as newer brokers do.
"""

from __future__ import annotations

import base64
import json
import re
import time

from fastapi.responses import Response

from keyshared.protocol import pulsar_api_pb2 as pb
from keyshared.protocol.errors import MalformedFrame, UnsupportedCompression
from keyshared.protocol.metadata import decompress, split_payload
from keyshared.storage.entry import Entry

_TOKEN = re.compile(r"^[-!#$%&'*+.^_`|~0-9A-Za-z]+$")
_FORBIDDEN = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def pulsar_time(ms: int) -> str:
    """Pulsar's ``DateFormatter.format``: ISO-8601 with milliseconds, here in UTC."""
    seconds, millis = divmod(ms, 1000)
    try:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    except (OverflowError, OSError, ValueError):
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(0))
    return f"{stamp}.{millis:03d}Z"


def _value_ok(value: str) -> bool:
    if _FORBIDDEN.search(value):
        return False
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


class _Headers:
    def __init__(self) -> None:
        self.items: dict[str, str] = {}

    def add(self, name: str, value: object) -> None:
        text = str(value)
        if _TOKEN.match(name) and _value_ok(text):
            self.items[name] = text


def entry_response(entry: Entry) -> Response:
    """The HTTP response for ``entry``: uncompressed payload and ``X-Pulsar-*`` headers."""
    h = _Headers()
    h.add("X-Pulsar-Message-ID", f"{entry.position.ledger_id}:{entry.position.entry_id}")
    try:
        md, payload = split_payload(entry.data)
    except MalformedFrame:
        # Not a Pulsar payload (cannot happen for entries a producer stored): give the bytes.
        return Response(bytes(entry.data), media_type="application/octet-stream", headers=h.items)
    _metadata_headers(h, md, len(payload))
    try:
        body = decompress(md, payload)
    except (UnsupportedCompression, MalformedFrame):
        # The client decodes it itself from the compression headers.
        body = bytes(payload)
        h.add("X-Pulsar-compression", pb.CompressionType.Name(md.compression))
        h.add("X-Pulsar-uncompressed-size", md.uncompressed_size)
    return Response(body, media_type="application/octet-stream", headers=h.items)


def _metadata_headers(h: _Headers, md: pb.MessageMetadata, payload_size: int) -> None:
    props = {kv.key: kv.value for kv in md.properties}
    for key, value in props.items():
        h.add(f"X-Pulsar-PROPERTY-{key}", value)
    if props:
        h.add("X-Pulsar-PROPERTY", json.dumps(props, ensure_ascii=True))
    h.add("X-Pulsar-publish-time", pulsar_time(md.publish_time))
    if md.HasField("event_time") and md.event_time:
        h.add("X-Pulsar-event-time", pulsar_time(md.event_time))
    if md.HasField("deliver_at_time"):
        h.add("X-Pulsar-deliver-at-time", pulsar_time(md.deliver_at_time))
    if md.HasField("num_messages_in_batch"):
        h.add("X-Pulsar-num-batch-message", md.num_messages_in_batch)
        h.add("X-Pulsar-batch-size", payload_size)
    h.add("X-Pulsar-producer-name", md.producer_name)
    h.add("X-Pulsar-sequence-id", md.sequence_id)
    if md.HasField("highest_sequence_id"):
        h.add("X-Pulsar-highest-sequence-id", md.highest_sequence_id)
    if md.HasField("replicated_from"):
        h.add("X-Pulsar-replicated-from", md.replicated_from)
    if md.HasField("partition_key"):
        h.add("X-Pulsar-partition-key", md.partition_key)
        if md.partition_key_b64_encoded:
            h.add("X-Pulsar-partition-key-b64-encoded", "true")
    if md.HasField("ordering_key"):
        h.add("X-Pulsar-Base64-ordering-key", base64.b64encode(md.ordering_key).decode())
    if md.HasField("null_value") and md.null_value:
        h.add("X-Pulsar-null-value", "true")
    if md.encryption_keys:
        h.add("X-Pulsar-Is-Encrypted", "true")
    if md.HasField("uuid"):
        h.add("X-Pulsar-uuid", md.uuid)
    if md.HasField("num_chunks_from_msg"):
        h.add("X-Pulsar-num-chunks-from-msg", md.num_chunks_from_msg)
        h.add("X-Pulsar-total-chunk-msg-size", md.total_chunk_msg_size)
        h.add("X-Pulsar-chunk-id", md.chunk_id)
