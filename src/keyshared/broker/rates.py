"""Per-second rates of growing counters, over a short sliding window, sampled when read.

The hot paths only increment plain integer counters (messages and bytes in and out, acks,
redeliveries). A :class:`RateMeter` turns those counters into Pulsar's ``msgRateIn``,
``msgThroughputOut``, ... when stats are read, so nobody pays for rates while nobody looks: no
timer, no per-message work. Each read keeps a sample (at most one per half second) and the rate is
the counters' growth since the oldest sample still inside the window. When reads are further apart
than the window, the rate is the average since the previous read.
"""

from __future__ import annotations

import time
from collections import deque

WINDOW_SECONDS = 5.0
"""Length of the sliding window: long enough to smooth batching, short enough for a live view."""

_MIN_SPACING = 0.5


class RateMeter:
    """Rates of a fixed number of counters, all starting at zero when the meter is made."""

    __slots__ = ("_samples",)

    def __init__(self, width: int = 2, now: float | None = None) -> None:
        t = time.monotonic() if now is None else now
        self._samples: deque[tuple[float, tuple[int, ...]]] = deque([(t, (0,) * width)])

    def rates(self, *counters: int, now: float | None = None) -> tuple[float, ...]:
        """Per-second growth of ``counters`` (same order and number as the meter's width)."""
        t = time.monotonic() if now is None else now
        samples = self._samples
        # Keep one sample at or before the window's start, so that the whole window is covered.
        while len(samples) > 1 and t - samples[1][0] >= WINDOW_SECONDS:
            samples.popleft()
        t0, base = samples[0]
        if t - samples[-1][0] >= _MIN_SPACING:
            samples.append((t, counters))
        dt = t - t0
        if dt <= 0.0:
            return tuple(0.0 for _ in counters)
        return tuple(max(c - b, 0) / dt for c, b in zip(counters, base, strict=True))
