"""Small, dependency-free statistics for benchmark samples."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Return the nearest-rank percentile of already sorted values (``fraction`` in [0, 1])."""
    if not sorted_values:
        return math.nan
    rank = math.ceil(fraction * len(sorted_values))
    index = min(max(rank - 1, 0), len(sorted_values) - 1)
    return float(sorted_values[index])


def summary(values: Sequence[float]) -> dict[str, float]:
    """Return min, median and max of ``values`` (NaN for each when there are none)."""
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return {"min": math.nan, "median": math.nan, "max": math.nan}
    return {
        "min": min(finite),
        "median": float(statistics.median(finite)),
        "max": max(finite),
    }


def ratio(numerator: float, denominator: float) -> float:
    """Return ``numerator / denominator``, or NaN when either side is missing or zero."""
    if math.isnan(numerator) or math.isnan(denominator) or denominator == 0:
        return math.nan
    return numerator / denominator
