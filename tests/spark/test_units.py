"""Pure parts of the Spark side: position arithmetic, options, routing, sequence ids, audit rules.

No SparkSession, no broker.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from keyshared.spark.audit import audit_events
from keyshared.spark.options import OptionError, SinkOptions, SourceOptions
from keyshared.spark.positions import (
    BEFORE_ALL,
    AckedRanges,
    LedgerInfo,
    advance,
    count_between,
    first_entry,
    last_entry,
    next_entry,
    parse_acked_ranges,
    parse_pos,
    split_range,
)
from keyshared.spark.sink import java_string_hash, partition_for_key, position_sequence_id

LEDGERS = [LedgerInfo(3, 5), LedgerInfo(7, 0), LedgerInfo(9, 4), LedgerInfo(12, 3)]
ALL = [(3, e) for e in range(5)] + [(9, e) for e in range(4)] + [(12, e) for e in range(3)]


def test_position_arithmetic_matches_enumeration() -> None:
    starts = [BEFORE_ALL, *ALL, (7, -1), (9, 10)]
    for start, end in itertools.product(starts, [*ALL, BEFORE_ALL]):
        expect = [p for p in ALL if start < p <= end]
        assert count_between(LEDGERS, start, end) == len(expect), (start, end)
        nxt = next_entry(LEDGERS, start)
        assert nxt == next((p for p in ALL if p > start), None), start
    latest = last_entry(LEDGERS)
    assert latest == (12, 2) and first_entry(LEDGERS) == (3, 0)
    for start in starts:
        after = [p for p in ALL if p > start]
        for n in range(0, 14):
            end = advance(LEDGERS, start, n, latest)
            got = [p for p in ALL if start < p <= end]
            assert got == after[:n], (start, n, end)
    # An end on a ledger's last entry is written as the start of the next non-empty ledger.
    assert advance(LEDGERS, BEFORE_ALL, 5, latest) == (9, -1)
    assert advance(LEDGERS, (9, 0), 3, latest) == (12, -1)
    assert advance(LEDGERS, (9, 0), 3, (9, 3)) == (9, 3)
    # A range cut in pieces covers it exactly, in order, with near-equal counts.
    for pieces in (1, 2, 3, 5, 20):
        ends = split_range(LEDGERS, BEFORE_ALL, latest, pieces)
        lo = BEFORE_ALL
        sizes = []
        for hi in ends:
            sizes.append(count_between(LEDGERS, lo, hi))
            lo = hi
        assert ends[-1] == latest and sum(sizes) == len(ALL)
        assert max(sizes) - min(sizes) <= 1
    # Without a ledger list: exact inside the latest ledger, else the whole rest.
    assert advance(None, (12, 0), 1, (12, 2)) == (12, 1)
    assert advance(None, (12, 0), 9, (12, 2)) == (12, 2)
    assert advance(None, (9, 1), 2, (12, 2)) == (12, 2)
    assert advance(None, (12, 2), 5, (12, 2)) == (12, 2)
    assert last_entry([LedgerInfo(4, 0)]) == BEFORE_ALL and first_entry([]) is None


def test_acked_ranges_parse_and_membership() -> None:
    text = "[(3:4..3:7], (3:9..3:10], (9:-1..9:0]]"
    ranges = parse_acked_ranges(text)
    assert ranges == [((3, 4), (3, 7)), ((3, 9), (3, 10)), ((9, -1), (9, 0))]
    acked = AckedRanges(ranges)
    probe = [(3, e) for e in range(12)] + [(9, 0), (9, 1)]
    got = [p for p in probe if acked.contains(p)]
    assert got == [(3, 5), (3, 6), (3, 7), (3, 10), (9, 0)]
    assert not AckedRanges(parse_acked_ranges("[]"))
    assert parse_pos("5:6:-1") == (5, 6)
    with pytest.raises(ValueError):
        parse_pos("5")


def test_options() -> None:
    base = {"service.url": "pulsar://h:1", "topic": "t"}
    o = SourceOptions.parse(base, streaming=True)
    assert o.starting_offsets == "latest" and o.ending_offsets == "latest"
    assert SourceOptions.parse(base, streaming=False).starting_offsets == "earliest"
    o = SourceOptions.parse(
        {
            **base,
            "maxoffsetspertrigger": "50",
            "startingoffsets": '{"persistent://public/default/t": "3:4"}',
            "pulsar.client.operationtimeoutseconds": "7",
            "pulsar.reader.receiverqueuesize": "10",
            "failondataloss": "false",
        },
        streaming=True,
    )
    assert o.max_records_per_batch == 50 and not o.fail_on_data_loss
    assert o.starting_offsets == {"persistent://public/default/t": "3:4"}
    assert o.client_kwargs == {"operation_timeout_seconds": 7}
    assert o.reader_kwargs == {"receiver_queue_size": 10}
    bad: list[dict[str, str]] = [
        {"topic": "t"},
        {"service.url": "u"},
        {**base, "topics": "a,b"},
        {**base, "topicspattern": "x.*"},
        {**base, "endingoffsets": "earliest"},
        {**base, "maxrecordsperbatch": "0"},
        {**base, "subscription": "s"},
        {**base, "startingoffsets": "[1]"},
        {**base, "failondataloss": "maybe"},
    ]
    for opts in bad:
        with pytest.raises(OptionError):
            SourceOptions.parse(opts, streaming=False)
    with pytest.raises(OptionError):
        SourceOptions.parse({**base, "subscription": "s", "admin.url": "h"}, streaming=True)
    with pytest.raises(OptionError):
        SinkOptions.parse({"service.url": "u", "exactlyonce": "true"})
    s = SinkOptions.parse({"service.url": "u", "exactlyonce": "true", "producername": "p"})
    assert s.exactly_once and s.producer_name == "p" and s.chunk_rows == 10_000


def test_routing_and_sequence_ids() -> None:
    # Java: "hello".hashCode() == 99162322; "polygenelubricants".hashCode() == MIN_VALUE.
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("") == 0
    assert java_string_hash("polygenelubricants") == -2147483648
    assert java_string_hash("\U0001f600") == 0xD83D * 31 + 0xDE00  # a surrogate pair
    assert all(0 <= partition_for_key(f"k{i}", 3) < 3 for i in range(100))
    assert partition_for_key("polygenelubricants", 7) == 0
    rng = random.Random(5)
    positions = sorted(
        {
            (rng.randrange(1, 1 << 20), rng.randrange(0, 1 << 24), rng.randrange(-1, 1000))
            for _ in range(2000)
        }
    )
    seqs = [position_sequence_id(*p) for p in positions]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert max(seqs) < 1 << 63
    with pytest.raises(ValueError):
        position_sequence_id(1 << 23, 0, -1)


def _ev(ev: str, ts: float, consumer: str, **kw: Any) -> dict[str, Any]:
    return {"ev": ev, "ts": ts, "consumer": consumer, "subscription": "s", "topic": "t", **kw}


def _msg(ev: str, ts: float, consumer: str, key: str, entry: int, **kw: Any) -> dict[str, Any]:
    return _ev(ev, ts, consumer, key=key, ledger=1, entry=entry, batch=-1, **kw)


def test_audit_rules() -> None:
    # A clean hand-over: c1 holds k until it acks; c2 gets k afterwards; c1 leaves with m3
    # unacked, which c2 then receives (redelivery count unchanged) before anything newer.
    clean = [
        _ev("join", 0, "c1"),
        _ev("join", 0, "c2"),
        _msg("recv", 1, "c1", "k", 1, redelivery=0),
        _msg("ack", 2, "c1", "k", 1),
        _msg("recv", 3, "c2", "k", 2, redelivery=0),
        _msg("ack", 4, "c2", "k", 2),
        _msg("recv", 5, "c1", "k", 3, redelivery=0),
        _ev("leave", 6, "c1"),
        _msg("recv", 7, "c2", "k", 3, redelivery=0),
        _msg("ack", 8, "c2", "k", 3),
        _msg("recv", 9, "c2", "j", 4, redelivery=0),
        _msg("ack", 10, "c2", "j", 4),
    ]
    ids = [("t", 1, e, -1) for e in range(1, 5)]
    r = audit_events(clean, ids)
    assert r.ok, r.summary()
    assert (r.received, r.acked, r.redelivered, r.lost, r.topic_messages) == (5, 4, 1, 0, 4)
    assert r.consumers == ["c1", "c2"]

    # Every rule broken once.
    bad = [
        _ev("join", 0, "c1", ranges=[[0, 100]]),
        _ev("join", 0, "c2"),
        _msg("recv", 1, "c1", "k", 2, redelivery=0),  # key "k": slot outside [0, 100]
        _msg("recv", 2, "c2", "k", 1, redelivery=0),  # first delivery of 1 after 2; c1 holds k
        _msg("ack", 3, "c2", "k", 1),
        _msg("ack", 4, "c2", "k", 1),  # acked twice
        _msg("ack", 5, "c1", "k", 2),
    ]
    r = audit_events(bad, [*ids, ("t", 1, 9, -1)])
    assert not r.ok
    assert r.order_violations == 1 and r.samples["order"][0]["kind"] == "first"
    assert r.overlaps == 1 and r.samples["overlap"][0]["consumers"] == ["c1", "c2"]
    assert r.duplicates == 1 and r.sticky_violations == 1
    assert r.lost == 3  # entries 3, 4 and 9 were never acknowledged

    # A consumer getting a newer message before a handed-over older one is out of order.
    handover = [
        _msg("recv", 1, "c1", "k", 1, redelivery=0),
        _ev("leave", 2, "c1"),
        _msg("recv", 3, "c2", "k", 2, redelivery=0),
        _msg("recv", 4, "c2", "k", 1, redelivery=0),
        _msg("ack", 5, "c2", "k", 2),
        _msg("ack", 6, "c2", "k", 1),
    ]
    r = audit_events(handover)
    assert r.order_violations == 1 and r.samples["order"][0]["kind"] == "consumer"
    # ... unless it is a redelivery (negative ack, ack timeout).
    handover[3] = _msg("recv", 4, "c2", "k", 1, redelivery=1)
    assert audit_events(handover).ok
