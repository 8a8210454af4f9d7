"""The ordering checker itself: each rule passes a good log and catches a bad one."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.ordering import ConsumptionRecorder, Delivery, MsgPos, OrderingViolation, check


@dataclass
class FakeId:
    """Stands in for ``pulsar.MessageId``."""

    entry: int
    batch: int = -1

    def ledger_id(self) -> int:
        return 7

    def entry_id(self) -> int:
        return self.entry

    def batch_index(self) -> int:
        return self.batch


@dataclass
class FakeMsg:
    """Stands in for ``pulsar.Message``."""

    key: str
    entry: int
    redeliveries: int = 0
    ordering: str = ""

    def message_id(self) -> FakeId:
        return FakeId(self.entry)

    def partition_key(self) -> str:
        return self.key

    def ordering_key(self) -> str:
        return self.ordering

    def redelivery_count(self) -> int:
        return self.redeliveries

    def topic_name(self) -> str:
        return "t"


class Clock:
    """A hand-driven clock: every reading advances it by one tick."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def recorder_expecting(*entries: tuple[str, int]) -> ConsumptionRecorder:
    rec = ConsumptionRecorder(clock=Clock())
    for key, entry in entries:
        rec.expect(key, FakeId(entry))
    return rec


def consume(
    rec: ConsumptionRecorder, consumer: str, key: str, entry: int, redeliveries: int = 0
) -> Delivery:
    d = rec.received(consumer, FakeMsg(key, entry, redeliveries))
    rec.acking(d)
    return d


def test_good_log_passes_and_counts() -> None:
    rec = recorder_expecting(("a", 1), ("b", 2), ("a", 3), ("b", 4))
    consume(rec, "c1", "a", 1)
    consume(rec, "c2", "b", 2)
    consume(rec, "c1", "a", 3)
    consume(rec, "c2", "b", 4)
    report = check(rec)
    assert report.ok and report.deliveries == 4 and report.keys == 2 and report.consumers == 2


def test_key_moves_after_ack_is_fine() -> None:
    rec = recorder_expecting(("a", 1), ("a", 2))
    consume(rec, "c1", "a", 1)
    consume(rec, "c2", "a", 2)
    check(rec)


def test_two_consumers_holding_one_key_is_caught() -> None:
    rec = recorder_expecting(("a", 1), ("a", 2))
    d1 = rec.received("c1", FakeMsg("a", 1))
    d2 = rec.received("c2", FakeMsg("a", 2))
    rec.acking(d1)
    rec.acking(d2)
    with pytest.raises(OrderingViolation, match="exclusivity"):
        check(rec)
    check(rec, exclusive=False)


def test_release_at_close_ends_the_hold() -> None:
    rec = recorder_expecting(("a", 1), ("a", 2))
    rec.received("c1", FakeMsg("a", 1))
    rec.closing("c1")
    consume(rec, "c2", "a", 1)  # the redelivery of what c1 held
    consume(rec, "c2", "a", 2)
    report = check(rec)
    assert report.duplicates == 1


def test_order_regression_on_one_consumer_is_caught() -> None:
    rec = recorder_expecting(("a", 1), ("a", 2))
    consume(rec, "c1", "a", 2)
    consume(rec, "c1", "a", 1)
    with pytest.raises(OrderingViolation, match="order on c1"):
        check(rec)


def test_redelivery_may_go_back() -> None:
    rec = recorder_expecting(("a", 1), ("a", 2))
    d1 = rec.received("c1", FakeMsg("a", 1))
    rec.releasing(d1)  # negative ack
    consume(rec, "c1", "a", 2)
    consume(rec, "c1", "a", 1, redeliveries=1)
    check(rec)


def test_key_order_across_consumers_is_caught() -> None:
    # c2 processes entry 2 and c1 entry 1 afterwards: no overlap in holds, but the key's
    # first deliveries went backwards.
    rec = recorder_expecting(("a", 1), ("a", 2))
    consume(rec, "c2", "a", 2)
    consume(rec, "c1", "a", 1)
    with pytest.raises(OrderingViolation, match="key order"):
        check(rec)


def test_lost_message_is_caught() -> None:
    rec = recorder_expecting(("a", 1), ("a", 2))
    consume(rec, "c1", "a", 1)
    rec.received("c1", FakeMsg("a", 2))  # received, never acked
    with pytest.raises(OrderingViolation, match="lost: 1"):
        check(rec, exclusive=False)
    assert rec.missing() == [("", MsgPos(7, 2))]


def test_duplicate_after_ack_is_caught_unless_allowed() -> None:
    rec = recorder_expecting(("a", 1))
    consume(rec, "c1", "a", 1)
    consume(rec, "c1", "a", 1)
    with pytest.raises(OrderingViolation, match="duplicate after ack"):
        check(rec)
    assert check(rec, duplicates_after_ack=True).duplicates == 1


def test_ordering_key_wins_over_partition_key() -> None:
    rec = ConsumptionRecorder(clock=Clock())
    d = rec.received("c1", FakeMsg("any key", 1, ordering="k7"))
    assert d.key == "k7"
