"""Dispatch tells marker entries from messages through the metadata cache."""

from __future__ import annotations

from keyshared.broker.entry_meta import EntryMetaCache
from keyshared.protocol import encode_payload_section, pb
from keyshared.protocol.markers import MarkerType, SnapshotRequest, marker_entry
from keyshared.storage.entry import Entry
from keyshared.storage.position import Position


def test_markers_are_told_apart_cached_or_not() -> None:
    message = encode_payload_section(
        pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1), b"x"
    )
    marker = marker_entry(SnapshotRequest("s", "a"), publish_time_ms=1)
    cache = EntryMetaCache()
    plain = [Entry(Position(1, i), message, 0) for i in range(3)]
    assert not cache.has_marker(plain)  # parsed and cached on the way
    assert not cache.has_marker(plain)
    mixed = [*plain, Entry(Position(1, 3), marker, 0)]
    assert cache.has_marker(mixed)
    assert (
        cache.marker_type(Position(1, 3), marker)
        == MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT_REQUEST
    )
    assert cache.marker_type(Position(1, 0), message) == 0
    assert cache.get(Position(1, 3), marker).marker_type == 10
