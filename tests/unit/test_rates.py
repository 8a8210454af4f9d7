"""RateMeter: per-second rates over a sliding window, sampled when read."""

from __future__ import annotations

import pytest

from keyshared.broker.rates import WINDOW_SECONDS, RateMeter


def test_first_read_is_the_average_since_the_meter_was_made() -> None:
    m = RateMeter(2, now=100.0)
    assert m.rates(50, 5000, now=102.0) == pytest.approx((25.0, 2500.0))


def test_steady_counters_give_their_rate_and_idle_ones_decay_to_zero() -> None:
    m = RateMeter(1, now=0.0)
    t, count = 0.0, 0
    for _ in range(40):  # 100 msg/s, read every 250 ms
        t += 0.25
        count += 25
        (rate,) = m.rates(count, now=t)
    assert rate == pytest.approx(100.0)
    # Nothing more arrives: once a whole window has passed, the rate is zero.
    for _ in range(int(WINDOW_SECONDS / 0.25) + 2):
        t += 0.25
        (rate,) = m.rates(count, now=t)
    assert rate == 0.0


def test_window_follows_a_change_of_rate() -> None:
    m = RateMeter(1, now=0.0)
    t, count = 0.0, 0
    for _ in range(int(3 * WINDOW_SECONDS)):  # 10/s for a while, read every second
        t += 1.0
        count += 10
        m.rates(count, now=t)
    for _ in range(int(WINDOW_SECONDS) + 1):  # then 1000/s
        t += 1.0
        count += 1000
        (rate,) = m.rates(count, now=t)
    assert rate == pytest.approx(1000.0)


def test_sparse_reads_give_the_average_since_the_previous_read() -> None:
    m = RateMeter(1, now=0.0)
    m.rates(600, now=60.0)
    (rate,) = m.rates(1800, now=120.0)
    assert rate == pytest.approx(20.0)


def test_same_instant_and_counter_reset_never_give_nonsense() -> None:
    m = RateMeter(1, now=5.0)
    assert m.rates(10, now=5.0) == (0.0,)
    m.rates(100, now=6.0)
    (rate,) = m.rates(0, now=7.0)
    assert rate == 0.0
