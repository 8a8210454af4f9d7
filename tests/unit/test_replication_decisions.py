"""The replicator's pure decisions: names, what is forwarded and how, dedup keys, back-off."""

from __future__ import annotations

from typing import Any

from keyshared.broker.dedup import DUPLICATE, NEW, DedupState
from keyshared.broker.replication.decisions import (
    LOCAL_ONLY,
    Backoff,
    dedup_producer_name,
    forward_section,
    inbound_cluster,
    is_replicator_producer,
    remote_clusters,
    replicator_cursor_name,
    replicator_producer_name,
    should_forward,
)
from keyshared.broker.replication.topic_replication import merge_replication_stats
from keyshared.broker.sequence_ids import send_ids
from keyshared.protocol import encode_batch, encode_payload_section, pb, split_payload
from keyshared.storage.position import Position


def _md(**fields: object) -> pb.MessageMetadata:
    md = pb.MessageMetadata(producer_name="app", sequence_id=7, publish_time=1234)
    for k, v in fields.items():
        if isinstance(v, list):
            getattr(md, k).extend(v)
        else:
            setattr(md, k, v)
    return md


def test_names_are_pulsars() -> None:
    assert replicator_cursor_name("east") == "pulsar.repl.east"
    assert replicator_producer_name("west", "east") == "pulsar.repl.west-->east"
    assert is_replicator_producer("pulsar.repl.west-->east")
    assert not is_replicator_producer("west-1-0")
    assert inbound_cluster("pulsar.repl.west-->east", "east") == "west"
    assert inbound_cluster("pulsar.repl.west-->north", "east") is None
    assert inbound_cluster("app", "east") is None


def test_remote_clusters_leave_out_the_local_one() -> None:
    assert remote_clusters(["b", "a", "local", "b"], "local") == ["a", "b"]
    assert remote_clusters(["local"], "local") == []
    assert remote_clusters(None, "local") == []


def test_what_is_forwarded() -> None:
    assert should_forward(_md(), "east")
    # Replicated here from elsewhere: never forwarded again (no loops among clusters).
    assert not should_forward(_md(replicated_from="west"), "east")
    # The producer's own choice: replication_clusters, disable_replication.
    assert should_forward(_md(replicate_to=["east", "west"]), "east")
    assert not should_forward(_md(replicate_to=["west"]), "east")
    assert not should_forward(_md(replicate_to=[LOCAL_ONLY]), "east")


def test_forwarded_entry_keeps_everything_but_gains_replicated_from() -> None:
    md = _md(
        partition_key="k",
        ordering_key=b"o",
        event_time=99,
        properties=[pb.KeyValue(key="a", value="1")],
        num_messages_in_batch=2,
    )
    body = encode_batch(
        [
            (pb.SingleMessageMetadata(payload_size=1, sequence_id=7), b"x"),
            (pb.SingleMessageMetadata(payload_size=1, sequence_id=8), b"y"),
        ]
    )
    section = forward_section(md, body, "west")
    out, payload = split_payload(section)
    assert bytes(payload) == body  # the same batch, not re-batched
    assert out.replicated_from == "west"
    out.ClearField("replicated_from")
    assert out == md
    assert not md.HasField("replicated_from")  # the original is left alone


def test_remote_deduplicates_a_replicator_by_the_original_producer() -> None:
    state: DedupState[int] = DedupState()
    a = encode_payload_section(_md(producer_name="app-a", sequence_id=0, replicated_from="w"))
    b = encode_payload_section(_md(producer_name="app-b", sequence_id=0, replicated_from="w"))
    repl = replicator_producer_name("w", "e")
    for data, token in ((a, 1), (b, 2)):
        name = dedup_producer_name(repl, data)
        ids = send_ids(data)
        # Same sequence id, other original producer: new, not a duplicate.
        assert state.check(name, ids).kind == NEW
        state.pushed(name, ids, token)
        state.persisted(name, ids, Position(1, token), token)
    # The replicator resends both after a failure: both recognised.
    for data in (a, b):
        assert state.check(dedup_producer_name(repl, data), send_ids(data)).kind == DUPLICATE
    # A producer that is not a replicator keeps its own name.
    assert dedup_producer_name("app-c", a) == "app-c"
    # Unparseable data from a replicator: its own name (the entry is refused later anyway).
    assert dedup_producer_name(repl, b"\x00") == repl


def test_backoff_doubles_to_a_minute_and_resets() -> None:
    backoff = Backoff()
    delays = [backoff.next() for _ in range(12)]
    assert delays[:4] == [0.1, 0.2, 0.4, 0.8]
    assert delays[-1] == 60.0 and max(delays) == 60.0
    backoff.reset()
    assert backoff.next() == 0.1


def test_partitioned_stats_merge_replication_as_pulsar() -> None:
    def part(backlog: int, connected: bool, delay: int) -> dict[str, Any]:
        return {
            "east": {
                "msgRateOut": 1.5,
                "msgOutCount": 10,
                "replicationBacklog": backlog,
                "connected": connected,
                "replicationDelayInSeconds": delay,
            }
        }

    merged = merge_replication_stats([part(1, True, 3), part(2, True, 7)])["east"]
    assert merged["msgRateOut"] == 3.0 and merged["msgOutCount"] == 20
    assert merged["replicationBacklog"] == 3 and merged["connected"] is True
    assert merged["replicationDelayInSeconds"] == 7
    merged = merge_replication_stats([part(0, True, 0), part(0, False, 0)])["east"]
    assert merged["connected"] is False
    assert merge_replication_stats([{}, {}]) == {}
