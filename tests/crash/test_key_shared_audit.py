"""The crash audits of test_crash_key_shared.py flag what they must, on fabricated logs."""

from __future__ import annotations

from dataclasses import dataclass

from keyshared.storage.position import Position
from keyshared.storage.range_set import RangeSet
from tests.crash.key_shared_load import Crash, PersistedAcks, audit_crashes
from tests.ordering import ConsumptionRecorder, Delivery

T = "persistent://public/default/t"


@dataclass
class FakeId:
    ledger: int
    entry: int
    batch: int = -1

    def ledger_id(self) -> int:
        return self.ledger

    def entry_id(self) -> int:
        return self.entry

    def batch_index(self) -> int:
        return self.batch


@dataclass
class FakeMsg:
    mid: FakeId

    def message_id(self) -> FakeId:
        return self.mid

    def partition_key(self) -> str:
        return "k"

    def ordering_key(self) -> str:
        return ""

    def redelivery_count(self) -> int:
        return 0

    def topic_name(self) -> str:
        return T


class Log:
    """A recorder on a hand-driven clock."""

    def __init__(self) -> None:
        self.t = 0.0
        self.rec = ConsumptionRecorder(clock=lambda: self.t)

    def deliver(self, at: float, consumer: str, *pos: int, acked: float | None = None) -> Delivery:
        self.t = at
        d = self.rec.received(consumer, FakeMsg(FakeId(*pos)), topic=T)
        if acked is not None:
            self.t = acked
            self.rec.acking(d)
        return d

    def audit(self, *crashes: Crash, entry_acks: bool = False) -> list[str]:
        report = audit_crashes(
            self.rec.deliveries(), self.rec.expected(), list(crashes), [T] if entry_acks else []
        )
        return report.problems


def persisted(mdp: int, ranges: tuple[int, int] | None = None, batch: int | None = None) -> Crash:
    """Killed at 10, restarted at 11: entries up to 1:mdp acked, 1:first..1:last acked, and
    index 0 of the batch at 1:batch acked (index 1 not)."""
    rs = RangeSet([(Position(1, ranges[0]), Position(1, ranges[1]))] if ranges else [])
    batches = {Position(1, batch): 0b10} if batch is not None else {}
    return Crash(10.0, 11.0, {T: PersistedAcks(Position(1, mdp), rs, batches)})


def test_a_clean_log_passes() -> None:
    log = Log()
    log.deliver(1, "a", 1, 0, acked=2)
    log.deliver(1, "a", 1, 1)  # held at the kill: comes back
    log.deliver(1, "a", 1, 2, acked=9.5)  # acked, not persisted: may come back
    log.rec.closing("a", at=10.5)
    log.deliver(12, "b", 1, 1, acked=13)
    log.deliver(12, "b", 1, 2, acked=13)
    assert log.audit(persisted(0)) == []


def test_a_persisted_ack_delivered_after_the_restart_is_flagged() -> None:
    log = Log()
    log.deliver(1, "a", 1, 6, acked=2)
    log.deliver(12, "b", 1, 6, acked=13)
    problems = log.audit(persisted(-1, ranges=(6, 7)))
    assert len(problems) == 1 and "acked and persisted before restart 1" in problems[0]


def test_a_persisted_batch_index_delivered_after_the_restart_is_flagged() -> None:
    log = Log()
    log.deliver(1, "a", 1, 9, 0, acked=2)
    log.deliver(1, "a", 1, 9, 1)
    log.rec.closing("a", at=10.5)
    log.deliver(12, "b", 1, 9, 1, acked=13)  # the unacked index: fine
    assert log.audit(persisted(-1, batch=9)) == []
    log.deliver(12, "b", 1, 9, 0, acked=13)  # the persisted one: not fine
    problems = log.audit(persisted(-1, batch=9))
    assert len(problems) == 1 and "1:9:0" in problems[0]


def test_an_ack_persisted_without_an_application_ack_is_flagged() -> None:
    log = Log()
    log.deliver(1, "a", 1, 0, acked=10.5)  # acked only after the kill
    problems = log.audit(persisted(0))
    assert len(problems) == 1 and "no consumer acked it before the kill" in problems[0]
    log.rec.expect("k", FakeId(1, 1), topic=T)  # confirmed, never delivered, persisted acked
    problems = log.audit(persisted(1))
    assert any("1:1 on" in p and "no consumer acked" in p for p in problems)


def test_persisted_acks_going_back_are_flagged() -> None:
    log = Log()
    log.deliver(1, "a", 1, 0, acked=2)
    log.deliver(1, "a", 1, 1, acked=2)
    second = Crash(20.0, 21.0, persisted(0).acks)
    problems = log.audit(persisted(1), second)
    assert problems == [f"kill 2: 1:1 on {T} acked at kill 1, not now"]


def test_a_redelivery_after_an_ack_in_the_same_broker_lifetime_is_flagged() -> None:
    log = Log()
    log.deliver(1, "a", 1, 0, acked=2)
    log.deliver(3, "b", 1, 0, acked=4)
    problems = log.audit()
    assert len(problems) == 1 and "after its ack reached the same broker" in problems[0]
    log = Log()
    log.deliver(1, "a", 1, 0)
    log.deliver(3, "b", 1, 0, acked=4)
    problems = log.audit()
    assert len(problems) == 1 and "while held" in problems[0]


def test_entry_acks_excuse_a_redelivered_index_of_a_partly_acked_batch() -> None:
    log = Log()
    log.deliver(1, "a", 1, 0, 0, acked=2)
    log.deliver(1, "a", 1, 0, 1)
    log.rec.closing("a", at=3)
    log.deliver(4, "b", 1, 0, 0, acked=5)
    log.deliver(4, "b", 1, 0, 1, acked=5)
    assert log.audit(entry_acks=True) == []
    assert "after its ack reached the same broker" in log.audit()[0]
