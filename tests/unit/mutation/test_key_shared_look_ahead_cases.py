"""The Key_Shared look-ahead limit on the replay queue (Pulsar's
getEffectiveLookAheadLimit): per consumer times consumers, capped by the per-subscription value;
the per-subscription value alone when the per-consumer one is off; the unacked limits in force
when both are off. The simulator draws these settings, but a wrong limit only delays delivery
there, which no ordering check sees: each case kills mutants that survived ``make mutate``.
"""

from __future__ import annotations

import pytest

from keyshared.config import BrokerConfig
from tests.unit.mutation.ks_harness import Harness

UNLIMITED = 1 << 62


@pytest.mark.parametrize(
    ("per_consumer", "per_sub", "unacked_sub", "unacked_consumer", "limit"),
    [
        (10, 0, 0, 0, 30),  # 3 consumers
        (10, 25, 0, 0, 25),
        (10, 50, 0, 0, 30),
        (10, 0, 7, 5, 30),  # the unacked limits only when both look-ahead values are off
        (0, 7, 0, 0, 7),
        (0, 7, 100, 2, 7),
        (-1, 9, 100, 2, 9),
        (0, 0, 100, 20, 60),  # min(per subscription, consumers x per consumer)
        (0, 0, 50, 20, 50),
        (0, 0, 0, 20, 60),
        (0, 0, 40, 0, 40),
        (0, 0, 0, 0, UNLIMITED),
        (0, -1, 0, 4, 12),
        # A value of 1 is a limit like any other (no off-by-one at the "off" boundary).
        (1, 0, 0, 0, 3),
        (10, 1, 0, 0, 1),
        (0, 1, 0, 0, 1),
        (0, 0, 1, 0, 1),
        (0, 0, 0, 1, 3),
    ],
)
def test_effective_look_ahead_limit(
    per_consumer: int, per_sub: int, unacked_sub: int, unacked_consumer: int, limit: int
) -> None:
    config = BrokerConfig()
    config.keySharedLookAheadMsgInReplayThresholdPerConsumer = per_consumer
    config.keySharedLookAheadMsgInReplayThresholdPerSubscription = per_sub
    config.maxUnackedMessagesPerSubscription = unacked_sub
    config.maxUnackedMessagesPerConsumer = unacked_consumer
    h = Harness(config)
    try:
        for name in ("c1", "c2", "c3"):
            h.join(name, 0)
        assert h.dispatcher.look_ahead_limit() == limit
    finally:
        h.close()


def test_a_read_ahead_never_passes_the_limit() -> None:
    config = BrokerConfig()
    config.keySharedLookAheadMsgInReplayThresholdPerConsumer = 0
    config.keySharedLookAheadMsgInReplayThresholdPerSubscription = 5
    h = Harness(config)
    try:
        h.join("c1", 0)
        d = h.dispatcher
        assert d.max_normal_read(100) == 5
        assert d.max_normal_read(3) == 3
        for i in range(3):
            d.add_to_replay(h.ledger.add_entry(b"x"), 100 + i)
        assert d.max_normal_read(100) == 2
        assert d.max_normal_read(1) == 1
        for i in range(3):
            d.add_to_replay(h.ledger.add_entry(b"x"), 200 + i)
        # At or over the limit a read still takes one entry (Pulsar's max(..., 1)).
        assert d.max_normal_read(100) == 1
    finally:
        h.close()


def test_normal_reads_stop_at_the_limit_or_without_permits() -> None:
    config = BrokerConfig()
    config.keySharedLookAheadMsgInReplayThresholdPerConsumer = 0
    config.keySharedLookAheadMsgInReplayThresholdPerSubscription = 2
    h = Harness(config)
    try:
        h.join("c1", 0)
        h.join("c2", 0)
        d = h.dispatcher
        assert not d.normal_read_allowed()  # nobody has permits
        h.consumers["c2"].add_permits(1)
        assert d.normal_read_allowed()
        d.add_to_replay(h.ledger.add_entry(b"x"), 101)
        assert d.normal_read_allowed()
        d.add_to_replay(h.ledger.add_entry(b"x"), 102)
        assert not d.normal_read_allowed()  # the replay queue holds the limit
    finally:
        h.close()
