"""keyshared perf's latency histogram: fixed buckets, percentiles within 0.2 %."""

from __future__ import annotations

_LINEAR = 1024  # exact below this many microseconds
_SUB = 512  # then 512 buckets per power of two: better than 0.2 % relative precision


def _bucket(value: int) -> int:
    if value < _LINEAR:
        return max(value, 0)
    shift = value.bit_length() - 10
    return _LINEAR + (shift - 1) * _SUB + ((value >> shift) - _SUB)


def _bucket_value(index: int) -> float:
    """The middle of the values that fall in bucket ``index``."""
    if index < _LINEAR:
        return float(index)
    shift = (index - _LINEAR) // _SUB + 1
    mantissa = (index - _LINEAR) % _SUB + _SUB
    return ((mantissa << shift) + ((mantissa + 1) << shift) - 1) / 2


class LatencyHistogram:
    """Latencies in microseconds, in log-linear buckets (HdrHistogram's idea, in small)."""

    __slots__ = ("_counts", "count", "max", "min", "total")

    def __init__(self) -> None:
        self._counts: list[int] = []
        self.count = 0
        self.total = 0
        self.min = 0
        self.max = 0

    def record(self, micros: int) -> None:
        """Count one latency."""
        i = _bucket(micros)
        counts = self._counts
        if i >= len(counts):
            counts.extend([0] * (i + 1 - len(counts)))
        counts[i] += 1
        if self.count == 0 or micros < self.min:
            self.min = micros
        if micros > self.max:
            self.max = micros
        self.count += 1
        self.total += micros

    def merge(self, other: LatencyHistogram) -> None:
        """Add ``other``'s counts to this one."""
        if other.count == 0:
            return
        if len(other._counts) > len(self._counts):
            self._counts.extend([0] * (len(other._counts) - len(self._counts)))
        for i, n in enumerate(other._counts):
            if n:
                self._counts[i] += n
        self.min = other.min if self.count == 0 else min(self.min, other.min)
        self.max = max(self.max, other.max)
        self.count += other.count
        self.total += other.total

    def percentile(self, p: float) -> float:
        """The latency (µs) at or below which ``p`` percent of the recorded ones are."""
        if self.count == 0:
            return 0.0
        if p >= 100.0:
            return float(self.max)
        rank = max(1, int(self.count * p / 100.0 + 0.999999))
        seen = 0
        for i, n in enumerate(self._counts):
            seen += n
            if seen >= rank:
                return min(max(_bucket_value(i), float(self.min)), float(self.max))
        return float(self.max)

    @property
    def mean(self) -> float:
        """Mean latency (µs)."""
        return self.total / self.count if self.count else 0.0

    def summary_ms(self) -> dict[str, float]:
        """Mean, min, percentiles and max in milliseconds, as in the JSON summary."""
        out = {"mean": self.mean / 1000, "min": self.min / 1000}
        for name, p in PERCENTILES:
            out[name] = self.percentile(p) / 1000
        out["max"] = self.max / 1000
        return {k: round(v, 3) for k, v in out.items()}


PERCENTILES = (
    ("p50", 50.0),
    ("p75", 75.0),
    ("p90", 90.0),
    ("p95", 95.0),
    ("p99", 99.0),
    ("p99.9", 99.9),
    ("p99.99", 99.99),
)
