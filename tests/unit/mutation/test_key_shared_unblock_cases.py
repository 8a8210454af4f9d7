"""When draining hashes clear, one re-read is scheduled keySharedUnblockingIntervalMs later
for all of them (Pulsar coalesces it), and none once the dispatcher is closed. The acks that
clear a hash kick dispatch themselves, so the simulator's delivery checks cannot tell: each case
kills mutants that survived ``make mutate`` (bench/results/mutation/report.md).
"""

from __future__ import annotations

from keyshared.broker.subscription import AckItem
from keyshared.config import BrokerConfig
from keyshared.storage.position import Position
from tests.unit.mutation.ks_harness import Harness

KEYS = [f"k{i}" for i in range(40)]


def _blocked(interval_ms: int) -> tuple[Harness, list[tuple[str, Position, Position]]]:
    """c1 holds an entry of each key; c2 joins; a new entry of each key c2 took is held back.

    Returns the harness and, per moved key, (key, the entry c1 holds, the entry held back)."""
    config = BrokerConfig()
    config.keySharedUnblockingIntervalMs = interval_ms
    h = Harness(config)
    h.join("c1", 100)
    h.publish(*KEYS)
    h.join("c2", 100)
    d = h.dispatcher
    c2 = h.consumers["c2"]
    moved = [k for k in KEYS if d.selector.select(d.slot_of_key(k.encode())) is c2]
    assert len(moved) >= 2
    queued = h.publish(*moved)
    assert h.got("c2") == []
    held = {k: p for k, p in h.received["c1"]}
    return h, [(k, held[k], q) for k, q in zip(moved, queued, strict=True)]


def _ack_without_timers(h: Harness, pos: Position) -> None:
    consumer = h.consumers["c1"]
    h.sub.acknowledge(consumer, False, [AckItem(pos)])
    h.loop.run_ready()


def test_hashes_cleared_one_after_the_other_share_one_timer() -> None:
    h, moved = _blocked(100)
    try:
        before = h.loop.pending_timers()
        _ack_without_timers(h, moved[0][1])
        assert h.loop.pending_timers() == before + 1
        _ack_without_timers(h, moved[1][1])
        assert h.loop.pending_timers() == before + 1
        h.settle()
        assert sorted(h.got("c2")) == sorted([moved[0][2], moved[1][2]])
    finally:
        h.close()


def test_no_unblocking_read_after_the_dispatcher_closed() -> None:
    h, moved = _blocked(100)
    try:
        before = h.loop.pending_timers()
        h.dispatcher.close()
        _ack_without_timers(h, moved[0][1])
        assert h.loop.pending_timers() == before
    finally:
        h.close()


def _timers(h: Harness) -> list[float]:
    return sorted(when for when, _, handle in h.loop._timers if not handle.cancelled)


def test_the_re_read_is_due_one_interval_after_the_hash_cleared() -> None:
    h, moved = _blocked(250)
    try:
        before = _timers(h)
        t0 = h.loop.now
        _ack_without_timers(h, moved[0][1])
        assert _timers(h) == sorted([*before, t0 + 0.25])
    finally:
        h.close()


def test_without_an_interval_the_re_read_takes_no_timer() -> None:
    h, moved = _blocked(0)
    try:
        before = _timers(h)
        _ack_without_timers(h, moved[0][1])
        assert _timers(h) == before
    finally:
        h.close()


def test_a_hash_cleared_after_the_re_read_ran_schedules_another() -> None:
    h, moved = _blocked(100)
    try:
        _ack_without_timers(h, moved[0][1])
        h.settle()  # the re-read ran
        before = h.loop.pending_timers()
        _ack_without_timers(h, moved[1][1])
        assert h.loop.pending_timers() == before + 1
    finally:
        h.close()


def test_a_drainer_leaving_schedules_no_unblocking_read() -> None:
    # Its leaving gives its entries back for replay (which reads at once): the hashes it
    # drained are released without the unblocking re-read (Pulsar's closing=true).
    h, _ = _blocked(100)
    try:
        h.loop.run_ready()
        before = _timers(h)
        h.sub.remove_consumer(h.consumers.pop("c1"))
        h.loop.run_ready()
        assert _timers(h) == before
    finally:
        h.close()
