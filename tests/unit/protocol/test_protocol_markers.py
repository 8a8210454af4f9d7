"""Replicated-subscription markers: the hand-written codec against protobuf's own encoding.

The reference classes are built at run time from a descriptor with Pulsar's field numbers and
types (``PulsarMarkers.proto``), so the bytes the broker writes are the bytes an Apache Pulsar
broker writes and parses.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from hypothesis import given
from hypothesis import strategies as st

from keyshared.protocol import split_payload
from keyshared.protocol.markers import (
    MARKER_PRODUCER_NAME,
    ClusterPosition,
    Marker,
    MarkerError,
    MarkerType,
    Snapshot,
    SnapshotRequest,
    SnapshotResponse,
    SubscriptionUpdate,
    decode_marker,
    encode_marker,
    marker_entry,
    marker_type_of,
)

_F = descriptor_pb2.FieldDescriptorProto


def _reference() -> dict[str, Any]:
    f = descriptor_pb2.FileDescriptorProto(
        name="keyshared_test_markers.proto", package="ktm", syntax="proto2"
    )

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        m = f.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            fd = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                fd.type_name = f".ktm.{type_name}"

    req, opt, rep = _F.LABEL_REQUIRED, _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
    s, u64, msg = _F.TYPE_STRING, _F.TYPE_UINT64, _F.TYPE_MESSAGE
    message("MessageIdData", ("ledger_id", 1, u64, req, ""), ("entry_id", 2, u64, req, ""))
    message(
        "ClusterMessageId",
        ("cluster", 1, s, req, ""),
        ("message_id", 2, msg, req, "MessageIdData"),
    )
    message(
        "ReplicatedSubscriptionsSnapshotRequest",
        ("snapshot_id", 1, s, req, ""),
        ("source_cluster", 2, s, opt, ""),
    )
    message(
        "ReplicatedSubscriptionsSnapshotResponse",
        ("snapshot_id", 1, s, req, ""),
        ("cluster", 2, msg, opt, "ClusterMessageId"),
    )
    message(
        "ReplicatedSubscriptionsSnapshot",
        ("snapshot_id", 1, s, req, ""),
        ("local_message_id", 2, msg, opt, "MessageIdData"),
        ("clusters", 3, msg, rep, "ClusterMessageId"),
    )
    message(
        "ReplicatedSubscriptionsUpdate",
        ("subscription_name", 1, s, req, ""),
        ("clusters", 2, msg, rep, "ClusterMessageId"),
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return {
        m.name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"ktm.{m.name}"))
        for m in f.message_type
    }


REF = _reference()

names = st.text(min_size=1, max_size=12)
ids = st.integers(min_value=0, max_value=2**63 - 1)
clusters = st.builds(ClusterPosition, names, ids, ids)
markers: st.SearchStrategy[Marker] = st.one_of(
    st.builds(SnapshotRequest, names, st.one_of(st.just(""), names)),
    st.builds(SnapshotResponse, names, st.one_of(st.none(), clusters)),
    st.builds(
        Snapshot,
        names,
        st.one_of(st.none(), st.tuples(ids, ids)),
        st.lists(clusters, max_size=4).map(tuple),
    ),
    st.builds(SubscriptionUpdate, names, st.lists(clusters, max_size=4).map(tuple)),
)


def _ref_cluster(msg: Any, c: ClusterPosition) -> None:
    msg.cluster = c.cluster
    msg.message_id.ledger_id = c.ledger_id
    msg.message_id.entry_id = c.entry_id


def _reference_bytes(marker: Marker) -> bytes:
    if isinstance(marker, SnapshotRequest):
        m = REF["ReplicatedSubscriptionsSnapshotRequest"](snapshot_id=marker.snapshot_id)
        if marker.source_cluster:
            m.source_cluster = marker.source_cluster
    elif isinstance(marker, SnapshotResponse):
        m = REF["ReplicatedSubscriptionsSnapshotResponse"](snapshot_id=marker.snapshot_id)
        if marker.cluster is not None:
            _ref_cluster(m.cluster, marker.cluster)
    elif isinstance(marker, Snapshot):
        m = REF["ReplicatedSubscriptionsSnapshot"](snapshot_id=marker.snapshot_id)
        if marker.local is not None:
            m.local_message_id.ledger_id, m.local_message_id.entry_id = marker.local
        for c in marker.clusters:
            _ref_cluster(m.clusters.add(), c)
    else:
        m = REF["ReplicatedSubscriptionsUpdate"](subscription_name=marker.subscription_name)
        for c in marker.clusters:
            _ref_cluster(m.clusters.add(), c)
    return bytes(m.SerializeToString())


@given(markers)
def test_encoding_is_protobufs_and_round_trips(marker: Marker) -> None:
    data = encode_marker(marker)
    assert data == _reference_bytes(marker)
    assert decode_marker(marker_type_of(marker), data) == marker


@given(markers)
def test_decoding_what_protobuf_wrote(marker: Marker) -> None:
    assert decode_marker(marker_type_of(marker), _reference_bytes(marker)) == marker


def test_marker_entry_metadata_is_pulsars() -> None:
    update = SubscriptionUpdate("sub", (ClusterPosition("b", 3, 4),))
    md, payload = split_payload(marker_entry(update, publish_time_ms=99))
    assert md.producer_name == MARKER_PRODUCER_NAME and md.sequence_id == 0
    assert md.marker_type == MarkerType.REPLICATED_SUBSCRIPTION_UPDATE == 13
    assert md.publish_time == 99 and list(md.replicate_to) == []
    assert decode_marker(md.marker_type, payload) == update
    req = SnapshotResponse("s", ClusterPosition("b", 1, 2))
    md, _ = split_payload(marker_entry(req, publish_time_ms=1, replicate_to=["a"]))
    assert md.marker_type == 11 and list(md.replicate_to) == ["a"]


def test_unknown_types_and_bad_payloads() -> None:
    assert decode_marker(20, b"") is None  # a transaction marker: not ours
    data = encode_marker(SnapshotRequest("abc", "src"))
    with pytest.raises(MarkerError):
        decode_marker(MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT_REQUEST, data[:-1])
    with pytest.raises(MarkerError):  # snapshot_id is required
        decode_marker(MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT_REQUEST, b"")
    with pytest.raises(MarkerError):  # a ClusterMessageId without its message id
        decode_marker(MarkerType.REPLICATED_SUBSCRIPTION_UPDATE, b"\n\x01s\x12\x03\n\x01c")


@given(st.binary(max_size=64), st.sampled_from(list(MarkerType)))
def test_garbage_never_crashes(data: bytes, marker_type: MarkerType) -> None:
    with contextlib.suppress(MarkerError):
        decode_marker(marker_type, data)
