"""keyshared perf's latency histogram: percentiles within its precision of the exact ones."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyshared.perf import LatencyHistogram


def exact(values: list[int], p: float) -> int:
    ordered = sorted(values)
    rank = max(1, math.ceil(len(ordered) * p / 100))
    return ordered[rank - 1]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=10**9), min_size=1, max_size=400),
    st.sampled_from([0.0, 1.0, 50.0, 90.0, 99.0, 99.9, 100.0]),
)
def test_percentiles_are_within_precision(values: list[int], p: float) -> None:
    h = LatencyHistogram()
    for v in values:
        h.record(v)
    want = exact(values, p) if p > 0 else min(values)
    got = h.percentile(p)
    assert abs(got - want) <= max(1.0, want * 0.002), (got, want)
    assert h.count == len(values) and h.max == max(values) and h.min == min(values)
    assert h.mean == sum(values) / len(values)


@given(st.lists(st.integers(0, 10**7), max_size=100), st.lists(st.integers(0, 10**7), max_size=100))
def test_merge_equals_recording_everything_in_one(a: list[int], b: list[int]) -> None:
    ha, hb, both = LatencyHistogram(), LatencyHistogram(), LatencyHistogram()
    for v in a:
        ha.record(v)
        both.record(v)
    for v in b:
        hb.record(v)
        both.record(v)
    ha.merge(hb)
    assert (ha.count, ha.total, ha.min, ha.max) == (both.count, both.total, both.min, both.max)
    for p in (50.0, 99.0, 99.99):
        assert ha.percentile(p) == both.percentile(p)


def test_empty_and_summary_in_milliseconds() -> None:
    h = LatencyHistogram()
    assert h.percentile(99) == 0.0 and h.mean == 0.0
    for v in (1000, 2000, 3000, 4000):
        h.record(v)
    s = h.summary_ms()
    assert s["min"] == 1.0 and s["max"] == 4.0 and s["mean"] == 2.5
    assert s["p50"] == pytest.approx(2.0, rel=0.002)
    assert s["p99"] == pytest.approx(4.0, rel=0.002)
