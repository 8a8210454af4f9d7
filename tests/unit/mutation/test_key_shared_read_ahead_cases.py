"""A read whose entries all wait (another consumer still drains their hash) reads on at once for
the consumers it did not reach, instead of retrying after the dispatcher's backoff. The
simulator only sees the delivery, not its delay: each case kills mutants that survived ``make
mutate`` (bench/results/mutation/report.md).
"""

from __future__ import annotations

import pytest

from keyshared.config import BrokerConfig
from tests.unit.mutation.ks_harness import Harness

KEYS = [f"k{i}" for i in range(40)]


@pytest.mark.parametrize("c2_permits", [0, 100])
def test_a_read_of_held_back_entries_reads_on_without_a_backoff(c2_permits: int) -> None:
    config = BrokerConfig()
    config.dispatcherMaxReadBatchSize = 2
    h = Harness(config)
    try:
        c1 = h.join("c1", 100)
        h.publish(*KEYS)
        c2 = h.join("c2", c2_permits)
        d = h.dispatcher
        owner = {k: d.selector.select(d.slot_of_key(k.encode())) for k in KEYS}
        # c1 still holds its entry: it drains; without permits c2 could not take it anyway.
        drained = next(k for k in KEYS if owner[k] is c2)
        mine = next(k for k in KEYS if owner[k] is c1)
        before = len(h.got("c1"))
        for key in (drained, drained, mine):
            pos = h.ledger.add_entry(h_payload(key))
            h.keys[pos] = key
        t0 = h.loop.now
        h.loop.run_ready()  # no timer fires: no backoff retry
        assert h.loop.now == t0
        assert h.got("c2") == []
        assert h.got("c1")[before:] == [pos]
    finally:
        h.close()


@pytest.mark.parametrize("c2_permits", [1, 100])
def test_a_consumer_whose_entries_wait_reads_on_for_its_other_keys(c2_permits: int) -> None:
    config = BrokerConfig()
    config.dispatcherMaxReadBatchSize = 2
    h = Harness(config)
    try:
        h.join("c1", len(KEYS))  # all its permits go on KEYS: it takes nothing after
        h.publish(*KEYS)
        c2 = h.join("c2", c2_permits)
        d = h.dispatcher
        owner = {k: d.selector.select(d.slot_of_key(k.encode())) for k in KEYS}
        moved = [k for k in KEYS if owner[k] is c2]
        drained = moved[0]
        fresh = (f"fresh{i}" for i in range(1000))
        other = next(k for k in fresh if d.selector.select(d.slot_of_key(k.encode())) is c2)
        for key in (drained, drained, other):
            pos = h.ledger.add_entry(h_payload(key))
            h.keys[pos] = key
        t0 = h.loop.now
        h.loop.run_ready()  # no timer fires: no backoff retry
        assert h.loop.now == t0
        assert h.got("c2") == [pos]
    finally:
        h.close()


def h_payload(key: str) -> bytes:
    from tests.sim.world import payload

    return payload(key, 1, False)
