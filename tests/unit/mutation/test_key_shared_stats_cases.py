"""What the Key_Shared dispatcher reports (subscription and consumer stats, "what blocks this
hash"), which no ordering check of the simulator reads: each case kills mutants that survived
``make mutate`` (bench/results/mutation/report.md). Expected values come from the scenario (who
was given what, which keys moved), not from the dispatcher's own bookkeeping.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from keyshared.broker.consumer import Consumer, KeySharedMeta
from keyshared.broker.dispatch.key_shared import KeySharedDispatcher
from keyshared.storage.position import Position
from tests.unit.mutation.ks_harness import Harness

KEYS = [f"k{i}" for i in range(40)]


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.close()


def _slot(d: KeySharedDispatcher, key: str) -> int:
    return d.slot_of_key(key.encode())


def _owner(d: KeySharedDispatcher, key: str) -> Consumer | None:
    return d.selector.select(_slot(d, key))


def _moved(h: Harness) -> dict[str, list[str]]:
    """Two consumers hold one entry of each key; a third joins: old owner -> keys it lost."""
    h.join("c1", 100, consumer_id=7)
    h.join("c2", 100, consumer_id=9)
    h.publish(*KEYS)
    holder = {key: name for name in ("c1", "c2") for key, _ in h.received[name]}
    assert sorted(holder) == sorted(KEYS)
    h.join("c3", 100, consumer_id=11)
    d = h.dispatcher
    moved: dict[str, list[str]] = {"c1": [], "c2": []}
    for key in KEYS:
        owner = _owner(d, key)
        assert owner is not None
        if owner.consumer_name == "c3":
            moved[holder[key]].append(key)
    assert moved["c1"] and moved["c2"], "the scenario needs both to lose keys"
    assert len({_slot(d, k) for k in KEYS}) == len(KEYS)
    return moved


def _position_of(h: Harness, name: str, key: str) -> Position:
    (pos,) = [p for k, p in h.received[name] if k == key]
    return pos


def test_subscription_stats_sum_the_draining_hashes_of_every_consumer(h: Harness) -> None:
    moved = _moved(h)
    d = h.dispatcher
    # c1 acks one of the entries that keeps a moved hash draining: that hash is cleared.
    cleared = moved["c1"][0]
    h.ack("c1", [_position_of(h, "c1", cleared)])
    draining = len(moved["c1"]) + len(moved["c2"]) - 1
    st = d.stats()
    assert st["keySharedMode"] == "AUTO_SPLIT"
    assert st["allowOutOfOrderDelivery"] is False
    assert st["drainingHashesCount"] == draining
    assert st["drainingHashesUnackedMessages"] == draining  # one entry per hash
    assert st["drainingHashesClearedTotal"] == 1
    assert st["msgInReplay"] == 0


def test_consumer_stats_name_each_draining_hash(h: Harness) -> None:
    moved = _moved(h)
    d = h.dispatcher
    # A new entry of a key c1 drains, for c3 (which has permits): refused once, queued.
    blocked = moved["c1"][1]
    h.publish(blocked)
    h.ack("c1", [_position_of(h, "c1", moved["c1"][0])])
    c1 = h.consumers["c1"]
    st = d.consumer_stats(c1)
    rows = [
        {"hash": _slot(d, k), "unackMsgs": 1, "blockedAttempts": int(k == blocked)}
        for k in moved["c1"][1:]
    ]
    rows.sort(key=lambda r: r["hash"])
    assert st["drainingHashes"] == rows
    assert st["drainingHashesCount"] == len(rows)
    assert st["drainingHashesUnackedMessages"] == len(rows)
    assert st["drainingHashesClearedTotal"] == 1
    # The ranges are exactly the slots the selector gives c1.
    slots = {s for lo, hi in st["keyHashRangeArrays"] for s in range(lo, hi + 1)}
    sample = range(1, 65536, 7)
    assert {s for s in sample if d.selector.select(s) is c1} == {s for s in sample if s in slots}
    assert st["keyHashRanges"] == [f"[{lo}, {hi}]" for lo, hi in st["keyHashRangeArrays"]]
    assert st["keyHashRangeArrays"]
    # c3 drains nothing: zeros, with its own ranges.
    c3 = d.consumer_stats(h.consumers["c3"])
    assert c3["drainingHashes"] == []
    assert c3["drainingHashesCount"] == 0
    assert c3["drainingHashesClearedTotal"] == 0
    assert c3["drainingHashesUnackedMessages"] == 0
    assert c3["keyHashRangeArrays"] and c3["keyHashRangeArrays"] != st["keyHashRangeArrays"]


def test_consumer_stats_of_a_consumer_that_left_are_empty(h: Harness) -> None:
    _moved(h)
    d = h.dispatcher
    gone = h.consumers["c1"]
    h.leave("c1")
    assert d.consumer_stats(gone) == {
        "keyHashRangeArrays": [],
        "keyHashRanges": [],
        "drainingHashesCount": 0,
        "drainingHashesClearedTotal": 0,
        "drainingHashesUnackedMessages": 0,
        "drainingHashes": [],
    }


def _sticky(ranges: list[tuple[int, int]], *, ooo: bool = False) -> Harness:
    harness = Harness(mode="STICKY")
    harness.join(
        "s1",
        50,
        meta=KeySharedMeta(mode="STICKY", ranges=ranges, allow_out_of_order_delivery=ooo),
        consumer_id=5,
    )
    return harness


@pytest.mark.parametrize("ooo", [False, True])
def test_stats_without_draining_are_zero(ooo: bool) -> None:
    harness = _sticky([(0, 65535)], ooo=ooo)
    try:
        d = harness.dispatcher
        assert d.draining is None
        harness.publish(*KEYS[:5])
        st = d.stats()
        assert st["keySharedMode"] == "STICKY"
        assert st["allowOutOfOrderDelivery"] is ooo
        for field in ("drainingHashesCount", "drainingHashesClearedTotal"):
            assert st[field] == 0
        assert st["drainingHashesUnackedMessages"] == 0
        cs = d.consumer_stats(harness.consumers["s1"])
        assert cs == {
            "keyHashRangeArrays": [[0, 65535]],
            "keyHashRanges": ["[0, 65535]"],
            "drainingHashesCount": 0,
            "drainingHashesClearedTotal": 0,
            "drainingHashesUnackedMessages": 0,
            "drainingHashes": [],
        }
    finally:
        harness.close()


def test_what_blocks_a_draining_hash(h: Harness) -> None:
    moved = _moved(h)
    d = h.dispatcher
    key = moved["c1"][0]
    held = _position_of(h, "c1", key)
    (queued,) = h.publish(key)  # refused for c3 while c1 holds ``held``
    assert d.what_blocks(_slot(d, key)) == {
        "hash": _slot(d, key),
        "consumerName": "c3",
        "consumerId": 11,
        "availablePermits": 100,
        "draining": True,
        "drainingConsumerName": "c1",
        "drainingConsumerId": 7,
        "blockedAttempts": 1,
        "unackedMessageIds": [str(held)],
        "pendingMessageIds": [],
        "replayMessageIds": [str(queued)],
    }


def test_what_blocks_a_hash_its_owner_holds(h: Harness) -> None:
    h.join("c1", 100, consumer_id=3)
    k, j = KEYS[0], KEYS[1]
    p1, _, p3 = h.publish(k, j, k)
    d = h.dispatcher
    assert d.what_blocks(_slot(d, k)) == {
        "hash": _slot(d, k),
        "consumerName": "c1",
        "consumerId": 3,
        "availablePermits": 97,
        "draining": False,
        "drainingConsumerName": None,
        "drainingConsumerId": None,
        "blockedAttempts": 0,
        "unackedMessageIds": [],
        "pendingMessageIds": [str(p1), str(p3)],
        "replayMessageIds": [],
    }


def test_what_blocks_a_hash_nobody_owns() -> None:
    harness = _sticky([(0, 99)])
    try:
        d = harness.dispatcher
        slot = next(s for s in range(100, 65536) if d.selector.select(s) is None)
        assert d.what_blocks(slot) == {
            "hash": slot,
            "consumerName": None,
            "consumerId": None,
            "availablePermits": 0,
            "draining": False,
            "drainingConsumerName": None,
            "drainingConsumerId": None,
            "blockedAttempts": 0,
            "unackedMessageIds": [],
            "pendingMessageIds": [],
            "replayMessageIds": [],
        }
    finally:
        harness.close()


def test_what_blocks_lists_only_the_replayed_entries_of_the_hash(h: Harness) -> None:
    moved = _moved(h)
    d = h.dispatcher
    k, j = moved["c1"][0], moved["c2"][0]
    pk, pj = h.publish(k, j)  # both refused for c3: queued for replay
    assert list(d.replay.iter_positions()) == [pk, pj]
    assert d.what_blocks(_slot(d, k))["replayMessageIds"] == [str(pk)]
    assert d.what_blocks(_slot(d, j))["replayMessageIds"] == [str(pj)]
