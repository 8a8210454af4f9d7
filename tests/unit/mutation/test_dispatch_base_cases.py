"""The dispatchers' shared machinery on its own: what ``make mutate`` found no test saying of
``broker/dispatch/base.py`` (bench/results/mutation/report.md)."""

from __future__ import annotations

import asyncio

import pytest

from keyshared.broker.consumer import Consumer, SubType
from keyshared.broker.dispatch.base import Backoff, LoopScheduler
from keyshared.broker.subscription import AckItem
from keyshared.broker.throttle import DispatchThrottle, Rate, SharedDispatchLimiters
from keyshared.config import BrokerConfig
from keyshared.storage.position import Position
from tests.sim.world import payload
from tests.unit.mutation.ks_harness import Harness


@pytest.mark.parametrize(
    ("initial", "cap", "delays"),
    [
        (1, 10, [0.001, 0.002, 0.004, 0.008, 0.01, 0.01]),
        (3, 5, [0.003, 0.005, 0.005]),
        # No initial delay: the first retry is at once, then straight to the cap.
        (0, 40, [0.0, 0.04, 0.04]),
        (-7, -1, [0.0, 0.0, 0.0]),
    ],
)
def test_the_retry_backoff_doubles_from_initial_to_the_cap(
    initial: int, cap: int, delays: list[float]
) -> None:
    b = Backoff(initial, cap)
    assert b.initial == max(initial, 0) / 1000 and b.max == max(cap, 0) / 1000
    assert [b.next() for _ in delays] == pytest.approx(delays)
    b.reset()
    assert b.next() == pytest.approx(delays[0])


def test_the_loop_scheduler_runs_on_the_given_loop_or_the_running_one() -> None:
    ran: list[str] = []

    async def main() -> None:
        sched = LoopScheduler()
        loop = asyncio.get_running_loop()
        assert sched.loop is loop
        sched.call_later(0.001, lambda: ran.append("later"))
        sched.call_soon(lambda: ran.append("soon"))
        cancelled = sched.call_soon(lambda: ran.append("cancelled"))
        cancelled.cancel()
        await asyncio.sleep(0.02)

    asyncio.run(main())
    assert ran == ["soon", "later"]
    loop = asyncio.new_event_loop()
    try:
        sched = LoopScheduler(loop)
        assert sched.loop is loop
        sched.call_soon(lambda: ran.append("given"))
        loop.run_until_complete(asyncio.sleep(0))
    finally:
        loop.close()
    assert ran[-1] == "given"


def test_only_a_read_the_cursor_still_holds_is_cancelled() -> None:
    h = Harness(sub_type=SubType.Shared)
    try:
        h.join("c0", 10)
        disp = h.sub.dispatcher
        assert disp is not None
        # Nothing to read: the read waits in the cursor (parked).
        assert disp.have_pending_read and h.cursor.has_pending_read
        gen = disp.read_generation
        assert disp.cancel_parked_read() is True
        # A new generation: the cancelled read's completion is ignored.
        assert disp.read_generation != gen
        gen = disp.read_generation
        assert not disp.have_pending_read and not h.cursor.has_pending_read
        # Nothing in flight now: nothing to cancel, nothing forgotten.
        assert disp.cancel_parked_read() is False
        assert disp.read_generation == gen
        disp.read_more()
        h.settle()
        assert disp.have_pending_read and h.cursor.has_pending_read
        # A read the cursor has finished, its completion still queued: left alone, so its
        # entries still go out.
        pos = h.ledger.add_entry(payload("k", 1, False))
        h.keys[pos] = "k"
        while h.cursor.has_pending_read:
            assert h.loop.run_one()
        assert disp.have_pending_read
        assert disp.cancel_parked_read() is False
        assert disp.read_generation == gen
        h.settle()
        assert h.got("c0") == [pos]
    finally:
        h.close()


def test_a_retry_after_the_backoff_is_armed_once_and_never_when_closed() -> None:
    h = Harness(sub_type=SubType.Shared)
    try:
        h.join("c0", 0)
        disp = h.sub.dispatcher
        assert disp is not None and not h.loop.has_timer()
        start = h.loop.time()
        disp.read_more_with_backoff()
        disp.read_more_with_backoff()  # one is pending already: not a second
        assert h.loop.next_timer_at() == start + 0.001  # the initial backoff, 1 ms
        assert h.loop.fire_next_timer()
        assert not h.loop.has_timer()
        disp.close()
        disp.read_more_with_backoff()
        assert not h.loop.has_timer()
    finally:
        h.close()


def test_what_is_sent_is_counted_in_messages_and_bytes() -> None:
    config = BrokerConfig()
    config.dispatcherMinReadBatchSize = 10
    h = Harness(config, sub_type=SubType.Exclusive)
    try:
        (single,) = h.publish("k")
        (batch,) = h.publish("k", batch=3)
        c0 = h.join("c0", 10)  # one read, one send of both
        assert h.got("c0") == [single, batch] and len(h.sent["c0"]) == 2
        nbytes = len(payload("k", 1, False)) + len(payload("k", 3, False))
        assert c0.msg_out_counter == 4 and c0.bytes_out_counter == nbytes
        assert h.topic.msg_out_counter == 4 and h.topic.bytes_out_counter == nbytes
    finally:
        h.close()


def test_a_redelivered_entry_goes_out_with_its_redelivery_count() -> None:
    h = Harness(sub_type=SubType.Shared)
    try:
        c0 = h.join("c0", 10)
        sent = h.publish("a", "b")
        disp = h.sub.dispatcher
        assert disp is not None
        disp.redeliver(c0, [sent[1]])
        h.settle()
        counts = [(m.entry.position, m.redelivery_count) for m in h.sent["c0"]]
        assert counts == [(sent[0], 0), (sent[1], 0), (sent[1], 1)]
    finally:
        h.close()


def _throttle_messages(h: Harness, msgs: int) -> DispatchThrottle:
    """Give ``h``'s subscription a dispatch throttle of ``msgs`` messages a second (no byte
    limit) on the harness's virtual clock."""
    clock = h.loop.time
    throttle = DispatchThrottle(
        clock, lambda: (Rate(msgs=msgs), Rate()), SharedDispatchLimiters(clock), "sim"
    )
    h.sub.dispatch_throttle = throttle
    return throttle


def _redeliver_with_indexes_1_and_2_acked(h: Harness, c0: Consumer, batch: Position) -> None:
    """Ack indexes 1 and 2 of the three-message ``batch`` ``c0`` holds, then redeliver it."""
    h.sub.acknowledge(c0, False, [AckItem(batch, [0b110])])
    disp = h.sub.dispatcher
    assert disp is not None
    disp.redeliver(c0, None)
    h.settle()


def test_indexes_acked_before_a_send_are_not_counted_as_sent() -> None:
    h = Harness(sub_type=SubType.Exclusive)
    try:
        c0 = h.join("c0", 10)
        before = c0.avg_messages_per_entry
        (batch,) = h.publish("k", batch=3)
        # One entry of three messages: the average moves a tenth of the way to 3.
        assert c0.avg_messages_per_entry == pytest.approx(0.9 * before + 0.3)
        _redeliver_with_indexes_1_and_2_acked(h, c0, batch)
        assert [m.ack_set for m in h.sent["c0"]] == [None, [0b110]]
        # Sent again with index 0 acked: two messages go out, not three.
        assert c0.msg_out_counter == 5 and h.topic.msg_out_counter == 5
    finally:
        h.close()


def test_a_read_within_the_limits_arms_no_retry_and_a_cancelled_read_is_ignored() -> None:
    h = Harness(sub_type=SubType.Shared)
    try:
        _throttle_messages(h, 5)
        h.join("c0", 0)
        disp = h.sub.dispatcher
        assert disp is not None
        assert disp.rate_budget(1) == 1 and not h.loop.has_timer()
        fut = h.loop.create_future()
        fut.cancel()
        disp.have_pending_read = True
        assert disp.read_outcome(fut, disp.read_generation, replay=False) is None
        assert not disp.have_pending_read
    finally:
        h.close()


def test_indexes_acked_before_a_send_are_not_counted_against_the_dispatch_rate() -> None:
    h = Harness(sub_type=SubType.Exclusive)
    try:
        throttle = _throttle_messages(h, 100)
        c0 = h.join("c0", 10)
        (batch,) = h.publish("k", batch=3)
        assert throttle.budget(1000) == 97
        _redeliver_with_indexes_1_and_2_acked(h, c0, batch)
        # Sent again with index 0 acked: two messages more, not three or four.
        assert throttle.budget(1000) == 95
    finally:
        h.close()
