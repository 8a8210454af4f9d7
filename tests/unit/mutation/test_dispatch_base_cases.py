"""The dispatchers' shared machinery on its own: what ``make mutate`` found no test saying of
``broker/dispatch/base.py`` (bench/results/mutation/report.md)."""

from __future__ import annotations

import asyncio

import pytest

from keyshared.broker.dispatch.base import Backoff, LoopScheduler


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
