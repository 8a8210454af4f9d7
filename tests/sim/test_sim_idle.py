"""The no-idle-stall probe (:mod:`tests.sim.idle`) sees a broker that waits for a client action.

A dispatcher that does not read when a consumer sends FLOW only delays delivery: the next ack,
nack or publish makes it read, and the final phase flows and acks until everything is done. The
probe, run when the clients go quiet, must report it as an idle stall, on a seed of a small
budget (the seeds are fixed, so this is deterministic).
"""

from __future__ import annotations

import pytest

from keyshared.broker.consumer import Consumer
from keyshared.broker.dispatch.base import Dispatcher
from tests.sim.test_sim_oracle import first_failure


def test_a_dispatcher_that_ignores_flow_is_an_idle_stall(monkeypatch: pytest.MonkeyPatch) -> None:
    def ignore_flow(self: Dispatcher, consumer: Consumer, permits: int) -> None:
        return None

    monkeypatch.setattr(Dispatcher, "consumer_flow", ignore_flow)
    failure = first_failure("idle stall", budget=300)
    assert "deliverable now to a consumer with permits" in failure.message
