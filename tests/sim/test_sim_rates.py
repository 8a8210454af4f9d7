"""Dispatch rate limits under the simulation: a fifth of the seeds run with a subscription
dispatch rate (``simulator.dispatch_rate``), on the virtual clock. These tests show that those
seeds are really throttled, keep every property, and that a throttle that forgot to retry would
be caught."""

from __future__ import annotations

import pytest

from keyshared.broker.dispatch.base import Dispatcher
from tests.sim.simulator import SimFailure, Simulation, dispatch_rate

SEEDS = [s for s in range(400) if (r := dispatch_rate(s)) is not None and r.limited][:40]


def test_rated_seeds_are_throttled_and_keep_every_property() -> None:
    assert len(SEEDS) >= 30
    for seed in SEEDS:
        sim = Simulation(seed, trace=False).run()
        throttle = sim.sub.dispatch_throttle
        assert throttle is not None
        assert sum(throttle.msg_events.values()) + sum(throttle.byte_events.values()) > 0, seed


def test_a_throttle_that_never_retries_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_retry(self: Dispatcher, wanted: int) -> int:
        throttle = self.subscription.dispatch_throttle
        return wanted if throttle is None else throttle.budget(wanted)

    monkeypatch.setattr(Dispatcher, "rate_budget", no_retry)
    for seed in SEEDS:
        try:
            Simulation(seed, trace=False).run()
        except SimFailure as failure:
            assert "stuck" in failure.message
            return
    raise AssertionError("no rated seed noticed that throttled reads are never retried")
