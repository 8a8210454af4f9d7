"""PendingAcksMap: order, handlers, bulk removal, closing, the per-hash query, memory."""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

from ks_dispatch_helpers import FakeConsumer

from keyshared.broker.dispatch.pending_acks import PendingAck, PendingAcksMap
from keyshared.storage.position import Position

Map = PendingAcksMap[FakeConsumer, tuple[int, int]]


class RecordingHandler:
    """Records remove-handler calls, including batch brackets."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def handle_removing(
        self, consumer: FakeConsumer, position: Any, sticky_hash: int, closing: bool
    ) -> None:
        self.events.append((position, sticky_hash, closing))

    def start_batch(self) -> None:
        self.events.append("start")

    def end_batch(self) -> None:
        self.events.append("end")


def test_add_get_remove_and_handler_calls() -> None:
    handler = RecordingHandler()
    pending = Map(FakeConsumer("c"), remove_handler=handler)
    assert pending.add_pending_ack_if_allowed((1, 1), 10, 777)
    assert pending.add_pending_ack_if_allowed((1, 2), 1, 65535)
    assert pending.get((1, 1)) == (10, 777) and (1, 2) in pending and len(pending) == 2
    assert pending.unacked_messages() == 11
    assert pending.remove((1, 1)) and not pending.remove((1, 1))
    assert handler.events == [((1, 1), 777, False)]
    assert pending.get((1, 1)) is None


def test_add_handler_can_refuse_and_closed_map_refuses() -> None:
    refused: list[tuple[int, int]] = []

    def allow_even(consumer: FakeConsumer, position: Any, sticky_hash: int) -> bool:
        if sticky_hash % 2:
            refused.append(position)
            return False
        return True

    pending = Map(FakeConsumer("c"), add_handler=allow_even)
    assert pending.add_pending_ack_if_allowed((1, 1), 1, 2)
    assert not pending.add_pending_ack_if_allowed((1, 2), 1, 3)
    assert refused == [(1, 2)] and len(pending) == 1
    pending.for_each_and_close()
    assert pending.closed and not pending.add_pending_ack_if_allowed((1, 3), 1, 2)


def test_iteration_is_in_position_order_after_out_of_order_adds() -> None:
    pending = Map(FakeConsumer("c"))
    for pos in [(2, 5), (2, 6), (1, 9), (3, 0), (2, 5), (1, 1)]:
        pending.add_pending_ack_if_allowed(pos, 1, 5)
    assert pending.positions() == [(1, 1), (1, 9), (2, 5), (2, 6), (3, 0)]
    pending.add_pending_ack_if_allowed((1, 5), 2, 8)
    assert list(pending) == [
        PendingAck((1, 1), 1, 5),
        PendingAck((1, 5), 2, 8),
        PendingAck((1, 9), 1, 5),
        PendingAck((2, 5), 1, 5),
        PendingAck((2, 6), 1, 5),
        PendingAck((3, 0), 1, 5),
    ]


def test_remove_all_up_to_is_inclusive_and_batched() -> None:
    handler = RecordingHandler()
    pending = Map(FakeConsumer("c"), remove_handler=handler)
    for entry in (5, 1, 3, 7):
        pending.add_pending_ack_if_allowed((1, entry), 1, 100 + entry)
    assert pending.remove_all_up_to((1, 3)) == 2
    assert handler.events == ["start", ((1, 1), 101, False), ((1, 3), 103, False), "end"]
    assert pending.positions() == [(1, 5), (1, 7)]
    handler.events.clear()
    assert pending.remove_all_up_to((0, 99)) == 0 and handler.events == []
    assert pending.remove_all_up_to((9, 0)) == 2 and len(pending) == 0


def test_for_each_and_close_hands_back_in_order_with_closing_flag() -> None:
    handler = RecordingHandler()
    pending = Map(FakeConsumer("c"), remove_handler=handler)
    for entry in (3, 1, 2):
        pending.add_pending_ack_if_allowed((1, entry), 1, entry * 10)
    seen: list[PendingAck[tuple[int, int]]] = []
    acks = pending.for_each_and_close(seen.append)
    assert [a.position for a in acks] == [(1, 1), (1, 2), (1, 3)] and seen == acks
    assert handler.events == [
        "start",
        ((1, 1), 10, True),
        ((1, 2), 20, True),
        ((1, 3), 30, True),
        "end",
    ]
    assert len(pending) == 0


def test_positions_for_sticky_hash_stops_at_limit() -> None:
    pending = Map(FakeConsumer("c"))
    for entry in range(20):
        pending.add_pending_ack_if_allowed((1, 19 - entry), 1, 42 if entry % 3 == 0 else 7)
    all_42 = pending.positions_for_sticky_hash(42)
    assert all_42 == sorted(all_42) and len(all_42) == 7
    assert pending.positions_for_sticky_hash(42, limit=2) == all_42[:2]
    assert pending.positions_for_sticky_hash(42, limit=0) == []
    assert pending.positions_for_sticky_hash(5) == []
    assert sorted(pending.sticky_hashes()) == sorted([42] * 7 + [7] * 13)


def measure_bytes_per_entry(n: int = 50_000) -> float:
    """Bytes the map adds per pending entry (positions exist already: storage made them)."""
    positions = [Position(7, i) for i in range(n)]
    hashes = [(i * 7919) % 65535 + 1 for i in range(n)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        pending = PendingAcksMap[FakeConsumer, Position](FakeConsumer("c"))
        for pos, h in zip(positions, hashes, strict=True):
            pending.add_pending_ack_if_allowed(pos, 1, h)
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(pending) == n
    return (after - before) / n


def test_memory_per_pending_ack_is_small() -> None:
    per_entry = measure_bytes_per_entry()
    # A dict slot plus one packed int; a tuple value or a per-hash index would cost far more.
    assert per_entry < 120, per_entry
