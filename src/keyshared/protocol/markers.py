"""Replicated-subscription markers: the server-only entries Pulsar writes into a topic.

A marker is an entry whose ``MessageMetadata`` carries ``marker_type`` (producer
``pulsar.marker``, sequence id 0); its payload is one of the messages of Pulsar's
``PulsarMarkers.proto``, encoded here by hand: they are five small proto2 messages and the
committed ``pulsar_api`` module stays the subset of ``PulsarApi.proto`` it is. Field numbers and
wire types are Pulsar's, so markers cross to and from Apache Pulsar clusters unchanged (a unit
test checks the bytes against protoc's own encoding of the same schema).

Sans-IO like the rest of :mod:`keyshared.protocol`: bytes in, values out, and back.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from keyshared.protocol import pb
from keyshared.protocol.metadata import encode_payload_section

MARKER_PRODUCER_NAME = "pulsar.marker"
"""The producer name Pulsar gives marker entries."""


class MarkerType(enum.IntEnum):
    """Pulsar's ``MarkerType`` (the replicated-subscription ones)."""

    UNKNOWN_MARKER = 0
    REPLICATED_SUBSCRIPTION_SNAPSHOT_REQUEST = 10
    REPLICATED_SUBSCRIPTION_SNAPSHOT_RESPONSE = 11
    REPLICATED_SUBSCRIPTION_SNAPSHOT = 12
    REPLICATED_SUBSCRIPTION_UPDATE = 13


class MarkerError(ValueError):
    """A marker payload that does not parse."""


@dataclass(frozen=True, slots=True)
class ClusterPosition:
    """``ClusterMessageId``: an entry position in the named cluster's copy of the topic."""

    cluster: str
    ledger_id: int
    entry_id: int


@dataclass(frozen=True, slots=True)
class SnapshotRequest:
    """``ReplicatedSubscriptionsSnapshotRequest``: the source cluster asks for positions."""

    snapshot_id: str
    source_cluster: str = ""


@dataclass(frozen=True, slots=True)
class SnapshotResponse:
    """``ReplicatedSubscriptionsSnapshotResponse``: one cluster's position for a snapshot."""

    snapshot_id: str
    cluster: ClusterPosition | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """``ReplicatedSubscriptionsSnapshot``: the local position ``(ledger, entry)`` at which
    every listed remote position is known to be covered (stored locally only)."""

    snapshot_id: str
    local: tuple[int, int] | None = None
    clusters: tuple[ClusterPosition, ...] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True)
class SubscriptionUpdate:
    """``ReplicatedSubscriptionsUpdate``: where each cluster's copy of a subscription may move."""

    subscription_name: str
    clusters: tuple[ClusterPosition, ...] = field(default_factory=tuple)


Marker = SnapshotRequest | SnapshotResponse | Snapshot | SubscriptionUpdate


# --- proto2 wire format (varint and length-delimited fields only) ----------------------------
def _varint(value: int) -> bytes:
    if value < 0:
        value &= (1 << 64) - 1  # proto's two's complement for negative int64
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


def _uint(number: int, value: int) -> bytes:
    return _key(number, 0) + _varint(value)


def _bytes(number: int, value: bytes) -> bytes:
    return _key(number, 2) + _varint(len(value)) + value


def _str(number: int, value: str) -> bytes:
    return _bytes(number, value.encode())


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise MarkerError("truncated or overlong varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value & ((1 << 64) - 1), i
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of each field; unknown wire types 1 and 5 are skipped."""
    i = 0
    n = len(buf)
    while i < n:
        key, i = _read_varint(buf, i)
        number, wt = key >> 3, key & 7
        if wt == 0:
            value, i = _read_varint(buf, i)
            yield number, value
        elif wt == 2:
            size, i = _read_varint(buf, i)
            if i + size > n:
                raise MarkerError("truncated field")
            yield number, bytes(buf[i : i + size])
            i += size
        elif wt == 1:
            i += 8
        elif wt == 5:
            i += 4
        else:
            raise MarkerError(f"unsupported wire type {wt}")
    if i != n:
        raise MarkerError("truncated field")


def _text(value: int | bytes) -> str:
    if not isinstance(value, bytes):
        raise MarkerError("expected a string")
    try:
        return value.decode()
    except UnicodeDecodeError as exc:
        raise MarkerError("string is not UTF-8") from exc


def _sub(value: int | bytes) -> bytes:
    if not isinstance(value, bytes):
        raise MarkerError("expected a message")
    return value


def _message_id(ledger_id: int, entry_id: int) -> bytes:
    return _uint(1, ledger_id) + _uint(2, entry_id)


def _parse_message_id(buf: bytes) -> tuple[int, int]:
    ledger = entry = None
    for number, value in _fields(buf):
        if isinstance(value, int):
            if number == 1:
                ledger = value
            elif number == 2:
                entry = value
    if ledger is None or entry is None:
        raise MarkerError("MessageIdData without ledger_id or entry_id")
    return ledger, entry


def _cluster(c: ClusterPosition) -> bytes:
    return _str(1, c.cluster) + _bytes(2, _message_id(c.ledger_id, c.entry_id))


def _parse_cluster(buf: bytes) -> ClusterPosition:
    name: str | None = None
    mid: tuple[int, int] | None = None
    for number, value in _fields(buf):
        if number == 1:
            name = _text(value)
        elif number == 2:
            mid = _parse_message_id(_sub(value))
    if name is None or mid is None:
        raise MarkerError("ClusterMessageId without cluster or message_id")
    return ClusterPosition(name, mid[0], mid[1])


def encode_marker(marker: Marker) -> bytes:
    """The payload bytes of ``marker``."""
    if isinstance(marker, SnapshotRequest):
        out = _str(1, marker.snapshot_id)
        return out + _str(2, marker.source_cluster) if marker.source_cluster else out
    if isinstance(marker, SnapshotResponse):
        out = _str(1, marker.snapshot_id)
        return out + _bytes(2, _cluster(marker.cluster)) if marker.cluster else out
    if isinstance(marker, Snapshot):
        out = _str(1, marker.snapshot_id)
        if marker.local is not None:
            out += _bytes(2, _message_id(*marker.local))
        return out + b"".join(_bytes(3, _cluster(c)) for c in marker.clusters)
    out = _str(1, marker.subscription_name)
    return out + b"".join(_bytes(2, _cluster(c)) for c in marker.clusters)


def marker_type_of(marker: Marker) -> MarkerType:
    """The ``marker_type`` an entry carrying ``marker`` has."""
    if isinstance(marker, SnapshotRequest):
        return MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT_REQUEST
    if isinstance(marker, SnapshotResponse):
        return MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT_RESPONSE
    if isinstance(marker, Snapshot):
        return MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT
    return MarkerType.REPLICATED_SUBSCRIPTION_UPDATE


def decode_marker(marker_type: int, payload: bytes | memoryview) -> Marker | None:
    """The marker of type ``marker_type`` in ``payload`` (None for a type this broker does not
    know, e.g. a transaction marker). Raises :class:`MarkerError` if it does not parse."""
    buf = bytes(payload)
    fields = list(_fields(buf))
    first: dict[int, int | bytes] = {}
    for number, value in fields:
        first.setdefault(number, value)
    if marker_type == MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT_REQUEST:
        return SnapshotRequest(_required_text(first, 1), _text(first.get(2, b"")))
    if marker_type == MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT_RESPONSE:
        c = first.get(2)
        return SnapshotResponse(
            _required_text(first, 1), _parse_cluster(_sub(c)) if c is not None else None
        )
    if marker_type == MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT:
        local = first.get(2)
        return Snapshot(
            _required_text(first, 1),
            _parse_message_id(_sub(local)) if local is not None else None,
            tuple(_parse_cluster(_sub(v)) for n, v in fields if n == 3),
        )
    if marker_type == MarkerType.REPLICATED_SUBSCRIPTION_UPDATE:
        return SubscriptionUpdate(
            _required_text(first, 1),
            tuple(_parse_cluster(_sub(v)) for n, v in fields if n == 2),
        )
    return None


def _required_text(first: dict[int, int | bytes], number: int) -> str:
    value = first.get(number)
    if value is None:
        raise MarkerError(f"required field {number} missing")
    return _text(value)


def marker_entry(
    marker: Marker, *, publish_time_ms: int, replicate_to: Sequence[str] = ()
) -> bytes:
    """The stored entry (payload section) for ``marker``, as Pulsar's ``Markers`` builds it:
    ``replicate_to`` empty means every cluster of the topic."""
    md = pb.MessageMetadata(
        producer_name=MARKER_PRODUCER_NAME,
        sequence_id=0,
        publish_time=publish_time_ms,
        marker_type=int(marker_type_of(marker)),
    )
    md.replicate_to.extend(replicate_to)
    return encode_payload_section(md, encode_marker(marker))


def clusters_of(positions: Iterable[tuple[str, tuple[int, int]]]) -> tuple[ClusterPosition, ...]:
    """``ClusterMessageId`` values from ``(cluster, (ledger, entry))`` pairs, sorted by cluster
    (Pulsar writes them from a sorted map)."""
    return tuple(ClusterPosition(c, p[0], p[1]) for c, p in sorted(positions))
