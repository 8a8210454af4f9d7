"""The per-consumer pending-acks map: what ``make mutate`` found no test saying of it
(bench/results/mutation/report.md)."""

from __future__ import annotations

from keyshared.broker.dispatch.pending_acks import PendingAcksMap


def test_a_limit_of_one_finds_the_first_position_of_the_hash() -> None:
    pending = PendingAcksMap[str, tuple[int, int]]("c")
    for entry, h in ((4, 9), (2, 7), (3, 9), (1, 9)):
        pending.add_pending_ack_if_allowed((1, entry), 1, h)
    assert pending.positions_for_sticky_hash(9, limit=1) == [(1, 1)]
    assert pending.positions_for_sticky_hash(7, limit=1) == [(1, 2)]


def test_the_add_handler_is_asked_about_the_maps_own_consumer() -> None:
    asked: list[tuple[str, tuple[int, int], int]] = []

    def allow(consumer: str, position: tuple[int, int], sticky_hash: int) -> bool:
        asked.append((consumer, position, sticky_hash))
        return consumer == "c1"

    mine = PendingAcksMap[str, tuple[int, int]]("c1", add_handler=allow)
    other = PendingAcksMap[str, tuple[int, int]]("c2", add_handler=allow)
    assert mine.add_pending_ack_if_allowed((1, 1), 1, 5)
    assert not other.add_pending_ack_if_allowed((1, 2), 1, 6)
    assert asked == [("c1", (1, 1), 5), ("c2", (1, 2), 6)]
    assert len(mine) == 1 and len(other) == 0
