"""Producer names expire (brokerDeduplicationProducerInactivityTimeoutMinutes) and are bounded
per topic (brokerDeduplicationMaxNumberOfProducers)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from keyshared.broker.dedup import Deduplication, DedupState
from keyshared.broker.sequence_ids import SendIds
from keyshared.config import BrokerConfig, ConfigError, load_config
from keyshared.storage.memory import InMemoryLedger
from keyshared.storage.metadata import MetadataStore
from keyshared.storage.position import Position
from tests.unit.test_dedup_state import single_entry


def wrote(state: DedupState[Any], name: str, seq: int = 0) -> None:
    state.persisted(name, SendIds(seq, (seq,)), Position(1, seq))


def test_a_name_idle_past_the_timeout_is_forgotten() -> None:
    state: DedupState[Any] = DedupState()
    for name in ("a", "b", "c"):
        state.producer_added(name)
        wrote(state, name)
    state.producer_removed("a", now=100.0)
    state.producer_removed("b", now=150.0)
    assert state.purge_inactive(now=200.0, timeout=60.0) == ["a"]
    assert sorted(state.producers) == ["b", "c"]
    assert state.last_sequence_id("a") == -1
    # c never left: kept however long it has been.
    assert state.purge_inactive(now=10_000.0, timeout=60.0) == ["b"]
    assert list(state.producers) == ["c"]


def test_reconnecting_before_the_timeout_keeps_the_name() -> None:
    state: DedupState[Any] = DedupState()
    state.producer_added("a")
    wrote(state, "a", 7)
    state.producer_removed("a", now=0.0)
    state.producer_added("a")
    assert state.purge_inactive(now=1000.0, timeout=60.0) == []
    state.producer_removed("a", now=1000.0)
    assert state.purge_inactive(now=1059.0, timeout=60.0) == []
    assert state.last_sequence_id("a") == 7
    assert state.purge_inactive(now=1061.0, timeout=60.0) == ["a"]


def test_max_producers_forgets_the_longest_idle_never_a_connected_one() -> None:
    state: DedupState[Any] = DedupState()
    for i, name in enumerate(("a", "b", "c", "d", "e")):
        state.producer_added(name)
        wrote(state, name)
        if name in ("b", "a", "d"):
            state.producer_removed(name, now=float(i))
    # Idle since: a 0, b 1, d 3; c and e connected. Bound 3: the two idle longest go.
    assert state.purge_inactive(now=5.0, timeout=1e9, max_producers=3) == ["a", "b"]
    assert sorted(state.producers) == ["c", "d", "e"]
    # Bound 1: only d is idle; c and e stay although that is over the bound.
    assert state.purge_inactive(now=5.0, timeout=1e9, max_producers=1) == ["d"]
    assert sorted(state.producers) == ["c", "e"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_recovered_names_are_idle_from_recovery_and_a_purge_is_snapshotted() -> None:
    async def main() -> None:
        ledger = InMemoryLedger()
        metadata = MetadataStore(":memory:")
        clock = Clock()
        for name in ("old", "live"):
            for seq in range(3):
                ledger.add_entry(single_entry(name, seq))

        def dedup() -> Deduplication:
            return Deduplication(
                "t", cast(Any, ledger), metadata, inactivity_timeout=60.0, clock=clock
            )

        first = dedup()
        first.producer_added("live")  # connected while recovery runs
        await first.recover()
        assert first.last_sequence_id("old") == 2
        clock.now += 59.0
        assert first.purge_inactive() == []
        clock.now += 2.0
        assert first.purge_inactive() == ["old"]
        assert first.last_sequence_id("old") == -1
        assert first.last_sequence_id("live") == 2
        # The purge wrote a snapshot: a restart does not bring the name back from the log.
        again = dedup()
        await again.recover()
        assert again.last_sequence_id("old") == -1
        assert again.last_sequence_id("live") == 2
        metadata.close()

    asyncio.run(main())


def test_leaving_over_the_bound_purges_at_once() -> None:
    async def main() -> None:
        ledger = InMemoryLedger()
        metadata = MetadataStore(":memory:")
        clock = Clock()
        d = Deduplication("t", cast(Any, ledger), metadata, max_producers=2, clock=clock)
        await d.recover()
        for name in ("a", "b", "c"):
            d.producer_added(name)
            d.state.persisted(name, SendIds(0, (0,)), Position(1, 0))
        d.producer_removed("a")
        assert sorted(d.state.producers) == ["b", "c"]
        metadata.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    "key",
    [
        "brokerDeduplicationProducerInactivityTimeoutMinutes",
        "brokerDeduplicationMaxNumberOfProducers",
    ],
)
@pytest.mark.parametrize("raw", ["0", "-5"])
def test_zero_or_negative_settings_are_refused(key: str, raw: str) -> None:
    with pytest.raises(ConfigError, match=key):
        load_config(overrides={key: raw})


def test_defaults_are_pulsars() -> None:
    cfg = BrokerConfig()
    assert cfg.brokerDeduplicationProducerInactivityTimeoutMinutes == 360
    assert cfg.brokerDeduplicationMaxNumberOfProducers == 10000
    assert load_config(
        overrides={"brokerDeduplicationProducerInactivityTimeoutMinutes": "0.5"}
    ).brokerDeduplicationProducerInactivityTimeoutMinutes == pytest.approx(0.5)


def test_a_name_with_writes_in_flight_is_kept_until_they_end() -> None:
    state: DedupState[Any] = DedupState()
    state.producer_added("a")
    send = SendIds(0, (0,))
    state.pushed("a", send, "write-0")
    state.producer_removed("a", now=0.0)
    assert state.purge_inactive(now=100.0, timeout=60.0, max_producers=0) == []
    state.persisted("a", send, Position(1, 0), "write-0")
    assert state.purge_inactive(now=100.0, timeout=60.0) == ["a"]
