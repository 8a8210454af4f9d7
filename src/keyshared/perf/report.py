"""What keyshared perf records while it runs, the live line, and the final summary."""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from keyshared.perf.histogram import LatencyHistogram


class Recorder:
    """What the client's threads record, and what the reporter takes every interval."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._interval = LatencyHistogram()
        self.total = LatencyHistogram()
        self.messages = 0
        self.bytes = 0
        self.failed = 0

    def ok(self, micros: int, nbytes: int) -> None:
        """A message done (sent and confirmed, or received) after ``micros``."""
        with self._lock:
            self._interval.record(micros)
            self.messages += 1
            self.bytes += nbytes

    def fail(self) -> None:
        """A send that failed."""
        with self._lock:
            self.failed += 1

    def take(self) -> tuple[LatencyHistogram, int, int, int]:
        """The interval's histogram (folded into the total) and the running counts."""
        with self._lock:
            interval, self._interval = self._interval, LatencyHistogram()
            counts = (self.messages, self.bytes, self.failed)
        self.total.merge(interval)
        return interval, *counts


# --- reporting -----------------------------------------------------------------------------


@dataclass
class Interval:
    """One reporting interval."""

    at: float
    rate: float
    mbit: float
    latency: LatencyHistogram

    def to_json(self) -> dict[str, Any]:
        """The interval in the JSON summary."""
        return {
            "t": round(self.at, 3),
            "msgPerSec": round(self.rate, 1),
            "mbitPerSec": round(self.mbit, 3),
            "latencyMs": {
                "p50": round(self.latency.percentile(50) / 1000, 3),
                "p99": round(self.latency.percentile(99) / 1000, 3),
                "max": round(self.latency.max / 1000, 3),
            },
        }


@dataclass
class Reporter:
    """Prints the live line (rich) every interval and keeps the intervals for the summary."""

    kind: str
    recorder: Recorder
    interval: float
    pending: Callable[[], int] = lambda: 0
    intervals: list[Interval] = field(default_factory=list)

    def __post_init__(self) -> None:
        from rich.console import Console

        self.console = Console(stderr=True, highlight=False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="perf-reporter", daemon=True)
        self.started = time.perf_counter()
        self._last = (self.started, 0, 0)
        self._live: Any = None

    def start(self) -> None:
        """Start reporting."""
        if self.console.is_terminal:
            from rich.live import Live

            self._live = Live(
                self._line(None), console=self.console, refresh_per_second=4, transient=False
            )
            self._live.start()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.tick()

    def tick(self) -> None:
        """Close an interval: rate and latency since the previous one."""
        now = time.perf_counter()
        hist, messages, nbytes, _ = self.recorder.take()
        t0, m0, b0 = self._last
        dt = max(now - t0, 1e-9)
        iv = Interval(now - self.started, (messages - m0) / dt, (nbytes - b0) * 8 / dt / 1e6, hist)
        self._last = (now, messages, nbytes)
        self.intervals.append(iv)
        line = self._line(iv)
        if self._live is not None:
            self._live.update(line)
        else:
            self.console.print(line, soft_wrap=True)

    def _line(self, iv: Interval | None) -> Any:
        from rich.text import Text

        r = self.recorder
        text = Text()
        text.append(f"{self.kind:<8}", style="bold cyan")
        text.append(f"{r.messages:>12,} msgs  ")
        if iv is None:
            text.append("starting…", style="dim")
            return text
        text.append(f"{iv.rate:>10,.1f} msg/s", style="bold green")
        text.append(f"  {iv.mbit:>8.2f} Mbit/s")
        if r.failed:
            text.append(f"  failed {r.failed:,}", style="bold red")
        pending = self.pending()
        if pending:
            text.append(f"  pending {pending:,}", style="dim")
        h = iv.latency
        if h.count == 0:
            text.append("  │ latency -", style="dim")
            return text
        text.append("  │ latency ms ", style="dim")
        for name, value in (
            ("mean", h.mean),
            ("p50", h.percentile(50)),
            ("p95", h.percentile(95)),
            ("p99", h.percentile(99)),
            ("p99.9", h.percentile(99.9)),
            ("max", float(h.max)),
        ):
            text.append(f" {name} ", style="dim")
            text.append(f"{value / 1000:.2f}", style="yellow")
        return text

    def stop(self) -> None:
        """Stop the thread, close the last interval, end the live display."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.tick()
        if self._live is not None:
            self._live.stop()


# --- summary -------------------------------------------------------------------------------


def make_summary(
    kind: str,
    args: argparse.Namespace,
    topics: list[str],
    reporter: Reporter,
    recorder: Recorder,
    elapsed: float,
    config: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    elapsed = max(elapsed, 1e-9)
    out: dict[str, Any] = {
        "tool": "keyshared perf",
        "command": kind,
        "serviceUrl": args.service_url,
        "topics": topics,
        "config": config
        | {"numMessages": args.num_messages, "testDurationSeconds": args.test_duration},
        "durationSeconds": round(elapsed, 3),
        "messages": recorder.messages,
        "bytes": recorder.bytes,
        "failed": recorder.failed,
        "msgPerSec": round(recorder.messages / elapsed, 1),
        "mbitPerSec": round(recorder.bytes * 8 / elapsed / 1e6, 3),
        "latencyKind": "publish" if kind == "produce" else "end-to-end",
        "latencyMs": recorder.total.summary_ms(),
        "intervals": [iv.to_json() for iv in reporter.intervals],
    }
    if extra:
        out.update(extra)
    return out


def print_summary(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True, highlight=False)
    lat = summary["latencyMs"]
    table = Table(
        title=f"keyshared perf {summary['command']} · {summary['durationSeconds']:.1f} s",
        title_justify="left",
        show_header=False,
        box=None,
        padding=(0, 2),
    )
    table.add_column(style="dim")
    table.add_column(justify="right", style="bold")
    table.add_column(style="dim")
    table.add_column(justify="right", style="bold yellow")
    names = ("mean", "p50", "p95", "p99", "p99.9", "p99.99", "max")
    left = (
        ("messages", f"{summary['messages']:,}"),
        ("msg/s", f"{summary['msgPerSec']:,.1f}"),
        ("Mbit/s", f"{summary['mbitPerSec']:.2f}"),
        ("failed", f"{summary['failed']:,}"),
    )
    for i, name in enumerate(names):
        k, v = left[i] if i < len(left) else ("", "")
        label = f"{summary['latencyKind']} latency {name}" if i == 0 else name
        table.add_row(k, v, label, f"{lat[name]:.2f} ms")
    console.print(table)
    console.print(f"[dim]topics: {', '.join(summary['topics'])}[/dim]", soft_wrap=True)
