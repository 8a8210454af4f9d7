"""Dispatcher cases the simulator cannot see: each kills a mutant that survived ``make mutate``
(bench/results/mutation/report.md)."""

from __future__ import annotations

import pytest

from keyshared.protocol.hashing import slot_of_hash
from tests.sim.simulator import Simulation


def _dispatcher_of(seed: int, *, consistent: bool, sticky: bool) -> Simulation:
    sim = Simulation(seed, trace=False)
    sim.params.mode = "STICKY" if sticky else "AUTO_SPLIT"
    sim.params.classic = False
    sim.config.subscriptionKeySharedUseConsistentHashing = consistent
    with sim.loop.installed():
        sim.act_join()
    assert sim.dispatcher is not None
    return sim


@pytest.mark.parametrize(("consistent", "sticky"), [(True, False), (False, False), (False, True)])
def test_the_dispatchers_slot_of_a_hash_is_pulsars(consistent: bool, sticky: bool) -> None:
    # The selector's slot of a hash must be the one a Pulsar client computes for STICKY ranges
    # and the one the stats' "what blocks this hash" name; exclusivity alone would hold for any
    # consistent mapping, so the simulator cannot tell a wrong one apart.
    disp = _dispatcher_of(0, consistent=consistent, sticky=sticky).dispatcher
    assert disp is not None
    start, end = disp.selector.key_hash_range
    for h in (0, 1, 2, end - 1, end, end + 1, 65535, 65536, 65537, 2**31 - 1, 123_456_789):
        assert disp.slot_of_hash(h) == slot_of_hash(h, start, end), h


@pytest.mark.parametrize("mode", ["STICKY", "AUTO_SPLIT_OOO"])
def test_no_draining_where_nothing_is_held_back(mode: str) -> None:
    # STICKY ranges never move under a consumer, and allowOutOfOrderDelivery gives up the order
    # draining keeps: neither may hold a moved hash back (a tracker there only delays delivery,
    # which no ordering check sees).
    sim = Simulation(0, trace=False)
    sim.params.mode = mode
    sim.keyed = mode != "AUTO_SPLIT_OOO"
    sim.params.classic = False
    with sim.loop.installed():
        sim.act_join()
    assert sim.dispatcher is not None
    assert sim.dispatcher.draining is None
    auto = _dispatcher_of(0, consistent=True, sticky=False).dispatcher
    assert auto is not None and auto.draining is not None
