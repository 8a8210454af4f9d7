"""``keyshared perf produce | consume``: a load generator shaped like ``pulsar-perf``.

Same options as pulsar-perf where they exist (``-r`` rate, ``-s`` size, ``-m`` messages,
``-time`` duration, ``-n`` producers or consumers, ``-st`` subscription type, ``-b``/``-bm``/``-bb``
batching, ``-z`` compression, ``-mk`` key mode, ``--auth-plugin``/``--auth-params``), through the
official ``pulsar-client``, so it measures what an application sees and runs as well against
Apache Pulsar. While it runs, a live line shows the last interval's rate and latency percentiles
(publish latency: send to broker receipt; consume latency: publish time to receipt, end to end);
at the end a summary, and with ``--json-out FILE`` the same as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

# --- latency histogram ---------------------------------------------------------------------

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
        for name, p in _PERCENTILES:
            out[name] = self.percentile(p) / 1000
        out["max"] = self.max / 1000
        return {k: round(v, 3) for k, v in out.items()}


_PERCENTILES = (
    ("p50", 50.0),
    ("p75", 75.0),
    ("p90", 90.0),
    ("p95", 95.0),
    ("p99", 99.0),
    ("p99.9", 99.9),
    ("p99.99", 99.99),
)


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


# --- command line --------------------------------------------------------------------------


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("topics", nargs="+", metavar="TOPIC", help="persistent://tenant/ns/topic")
    p.add_argument("-u", "--service-url", default="pulsar://localhost:6650", help="broker URL")
    p.add_argument("-t", "--num-topic", dest="num_topics", type=int, default=1, help="topics")
    p.add_argument("--separator", default="-", help="between the topic and its number")
    p.add_argument(
        "-m", "--num-messages", type=int, default=0, help="messages in total (0: no limit)"
    )
    p.add_argument("-time", "--test-duration", type=float, default=0, help="seconds (0: no limit)")
    p.add_argument(
        "-i",
        "--stats-interval-seconds",
        type=float,
        default=0,
        help="seconds between live lines (default 1 on a terminal, 10 otherwise)",
    )
    p.add_argument("--auth-plugin", default="", help="e.g. AuthenticationToken")
    p.add_argument("--auth-params", default="", help="token:<jwt> or file:///path/to/token")
    p.add_argument("--trust-cert-file", default="", help="CA bundle for pulsar+ssl://")
    p.add_argument("--tls-allow-insecure", action="store_true", help="skip TLS verification")
    p.add_argument("-ioThreads", "--num-io-threads", type=int, default=1, help="client IO threads")
    p.add_argument(
        "--json-out", metavar="FILE", help="write the summary as JSON to FILE ('-': stdout)"
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``keyshared perf`` parser."""
    parser = argparse.ArgumentParser(
        prog="keyshared perf", description="Load generator shaped like pulsar-perf."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("produce", help="publish at a rate and measure publish latency")
    _common(p)
    p.add_argument("-r", "--rate", type=float, default=100, help="msg/s across topics (0: max)")
    p.add_argument("-s", "--size", type=int, default=1024, help="message size in bytes")
    p.add_argument("-n", "--num-producers", type=int, default=1, help="producers per topic")
    p.add_argument("-pn", "--producer-name", default=None, help="producer name (one producer)")
    p.add_argument(
        "-o", "--max-outstanding", type=int, default=1000, help="messages in flight at most"
    )
    p.add_argument(
        "-b",
        "--batch-time-window",
        type=float,
        default=1.0,
        help="batch messages for this many ms (0: no batching)",
    )
    p.add_argument("-db", "--disable-batching", action="store_true", help="no batching")
    p.add_argument("-bm", "--batch-max-messages", type=int, default=1000, help="per batch")
    p.add_argument(
        "-bb", "--batch-max-bytes", type=int, default=4 * 1024 * 1024, help="bytes per batch"
    )
    p.add_argument(
        "-z",
        "--compression",
        default="NONE",
        choices=["NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY"],
        type=str.upper,
    )
    p.add_argument(
        "-mk",
        "--message-key-generation-mode",
        choices=["autoIncrement", "random"],
        default=None,
        help="give each message a key",
    )
    p.add_argument(
        "-nk",
        "--num-keys",
        type=int,
        default=0,
        help="with -mk: draw keys from this many (0: unbounded)",
    )
    p.add_argument("-f", "--payload-file", help="payloads: lines of this file, chosen at random")
    p.add_argument("-d", "--delay", type=float, default=0, help="deliver after this many seconds")
    p.add_argument("--send-timeout", type=int, default=0, help="send timeout ms (0: none)")
    p.add_argument("-ef", "--exit-on-failure", action="store_true", help="stop at a failure")

    c = sub.add_parser("consume", help="subscribe and measure end-to-end latency")
    _common(c)
    c.add_argument("-s", "--subscriber-name", default="sub", help="subscription name prefix")
    c.add_argument("-ss", "--subscriptions", nargs="*", default=None, help="subscription names")
    c.add_argument("-ns", "--num-subscriptions", type=int, default=1, help="per topic")
    c.add_argument("-n", "--num-consumers", type=int, default=1, help="per subscription")
    c.add_argument(
        "-st",
        "--subscription-type",
        default="Exclusive",
        choices=["Exclusive", "Shared", "Failover", "Key_Shared"],
    )
    c.add_argument(
        "-sp",
        "--subscription-position",
        default="Latest",
        choices=["Latest", "Earliest"],
    )
    c.add_argument("-r", "--rate", type=float, default=0, help="msg/s at most (0: no limit)")
    c.add_argument("-q", "--receiver-queue-size", type=int, default=1000)
    c.add_argument("--acks-delay-millis", type=int, default=100, help="(accepted, unused)")
    return parser


# --- the client ----------------------------------------------------------------------------


def _client(pulsar: Any, args: argparse.Namespace) -> Any:
    import logging

    auth = None
    params = args.auth_params
    if params or args.auth_plugin:
        if "token" not in args.auth_plugin.lower() and not params.startswith(("token:", "file:")):
            raise SystemExit(f"keyshared perf: unsupported --auth-plugin {args.auth_plugin!r}")
        if params.startswith("token:"):
            auth = pulsar.AuthenticationToken(params[len("token:") :])
        elif params.startswith("file:"):
            path = params[len("file:") :].removeprefix("//")
            with open(path) as f:
                auth = pulsar.AuthenticationToken(f.read().strip())
        else:
            auth = pulsar.AuthenticationToken(params)
    logger = logging.getLogger("keyshared.perf.client")
    logger.setLevel(logging.WARNING)
    return pulsar.Client(
        args.service_url,
        authentication=auth,
        io_threads=args.num_io_threads,
        tls_trust_certs_file_path=args.trust_cert_file or None,
        tls_allow_insecure_connection=args.tls_allow_insecure,
        logger=logger,
    )


def _topics(args: argparse.Namespace) -> list[str]:
    topics: list[str] = list(args.topics)
    if args.num_topics > 1 and len(topics) == 1:
        return [f"{topics[0]}{args.separator}{i}" for i in range(args.num_topics)]
    return topics


class _Deadline:
    """Stop after ``-m`` messages, after ``-time`` seconds, or at Ctrl-C / SIGTERM."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.limit = args.num_messages
        self.end = time.perf_counter() + args.test_duration if args.test_duration > 0 else 0.0
        self.stopped = threading.Event()
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        def handler(_sig: int, _frame: FrameType | None) -> None:
            self.stopped.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, handler)

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def done(self, count: int) -> bool:
        if self.stopped.is_set():
            return True
        if self.limit and count >= self.limit:
            return True
        return bool(self.end) and time.perf_counter() >= self.end


def _interval(args: argparse.Namespace) -> float:
    if args.stats_interval_seconds > 0:
        return float(args.stats_interval_seconds)
    return 1.0 if sys.stderr.isatty() else 10.0


# --- produce -------------------------------------------------------------------------------


def _payloads(args: argparse.Namespace) -> list[bytes]:
    if args.payload_file:
        with open(args.payload_file, encoding="utf-8") as f:
            lines = [line.encode() for line in f.read().splitlines() if line]
        if not lines:
            raise SystemExit(f"keyshared perf: {args.payload_file} has no payload")
        return lines
    return [random.Random(0).randbytes(args.size)]


def _keys(args: argparse.Namespace) -> Callable[[int], str | None]:
    mode, n = args.message_key_generation_mode, args.num_keys
    if mode is None:
        return lambda _i: None
    if mode == "autoIncrement":
        return (lambda i: str(i % n)) if n > 0 else str
    rnd = random.Random()
    if n > 0:
        return lambda _i: str(rnd.randrange(n))
    return lambda _i: str(rnd.getrandbits(63))


def run_produce(pulsar: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Publish as asked; the summary."""
    client = _client(pulsar, args)
    topics = _topics(args)
    batching = not args.disable_batching and args.batch_time_window > 0
    compression = {
        "NONE": pulsar.CompressionType.NONE,
        "LZ4": pulsar.CompressionType.LZ4,
        "ZLIB": pulsar.CompressionType.ZLib,
        "ZSTD": pulsar.CompressionType.ZSTD,
        "SNAPPY": pulsar.CompressionType.SNAPPY,
    }[args.compression]
    producers = [
        client.create_producer(
            t,
            producer_name=args.producer_name,
            batching_enabled=batching,
            batching_max_messages=args.batch_max_messages,
            batching_max_allowed_size_in_bytes=args.batch_max_bytes,
            batching_max_publish_delay_ms=max(1, round(args.batch_time_window)),
            compression_type=compression,
            # Our own semaphore bounds what is in flight; the client's queue never fills.
            max_pending_messages=args.max_outstanding + 1,
            block_if_queue_full=False,
            send_timeout_millis=args.send_timeout,
        )
        for t in topics
        for _ in range(args.num_producers)
    ]
    payloads = _payloads(args)
    key_of = _keys(args)
    recorder = Recorder()
    window = threading.BoundedSemaphore(args.max_outstanding)
    stop = _Deadline(args)
    sent = 0
    reporter = Reporter(
        "produce",
        recorder,
        _interval(args),
        pending=lambda: max(sent - recorder.messages - recorder.failed, 0),
    )
    ok = pulsar.Result.Ok
    deliver_after = None
    if args.delay > 0:
        import datetime

        deliver_after = datetime.timedelta(seconds=args.delay)

    def done(result: Any, started: int, size: int) -> None:
        if result == ok:
            recorder.ok((time.perf_counter_ns() - started) // 1000, size)
        else:
            recorder.fail()
            if args.exit_on_failure:
                stop.stopped.set()
        window.release()

    def room() -> bool:
        """Wait for a free slot of --max-outstanding (False when told to stop)."""
        while not window.acquire(timeout=0.2):
            if stop.stopped.is_set():
                return False
        return True

    n_producers, n_payloads = len(producers), len(payloads)
    rate = args.rate
    stop.install()
    reporter.start()
    start = time.perf_counter()
    try:
        while not stop.done(sent):
            if rate > 0:
                due = int((time.perf_counter() - start) * rate) + 1 - sent
                if due <= 0:
                    # Sleep until the next message is due (the clock, not a fixed tick).
                    time.sleep(max(0.0, start + sent / rate - time.perf_counter()))
                    continue
            else:
                due = 64
            for _ in range(due):
                if not room():
                    break
                payload = payloads[0] if n_payloads == 1 else random.choice(payloads)
                size = len(payload)
                started = time.perf_counter_ns()
                producers[sent % n_producers].send_async(
                    payload,
                    lambda r, _m, s=started, z=size: done(r, s, z),
                    partition_key=key_of(sent),
                    deliver_after=deliver_after,
                )
                sent += 1
                if stop.done(sent):
                    break
        # Let what is in flight be confirmed (or fail) before the summary: take every slot back.
        drain_until = time.perf_counter() + 30
        for _ in range(args.max_outstanding):
            if not window.acquire(timeout=max(drain_until - time.perf_counter(), 0.001)):
                break
    finally:
        elapsed = time.perf_counter() - start
        stop.restore()
        reporter.stop()
        for p in producers:
            p.close()
        client.close()
    return _summary(
        "produce",
        args,
        topics,
        reporter,
        recorder,
        elapsed,
        {
            "rate": args.rate,
            "size": args.size,
            "numProducers": args.num_producers,
            "maxOutstanding": args.max_outstanding,
            "batching": {
                "enabled": batching,
                "timeWindowMs": args.batch_time_window,
                "maxMessages": args.batch_max_messages,
                "maxBytes": args.batch_max_bytes,
            },
            "compression": args.compression,
            "keyMode": args.message_key_generation_mode,
            "numKeys": args.num_keys,
        },
        extra={"sent": sent},
    )


# --- consume -------------------------------------------------------------------------------


def run_consume(pulsar: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Subscribe as asked and receive until told to stop; the summary."""
    client = _client(pulsar, args)
    topics = _topics(args)
    sub_type = {
        "Exclusive": pulsar.ConsumerType.Exclusive,
        "Shared": pulsar.ConsumerType.Shared,
        "Failover": pulsar.ConsumerType.Failover,
        "Key_Shared": pulsar.ConsumerType.KeyShared,
    }[args.subscription_type]
    position = (
        pulsar.InitialPosition.Earliest
        if args.subscription_position == "Earliest"
        else pulsar.InitialPosition.Latest
    )
    names = args.subscriptions or (
        [args.subscriber_name]
        if args.num_subscriptions == 1
        else [f"{args.subscriber_name}-{i}" for i in range(args.num_subscriptions)]
    )
    consumers = [
        client.subscribe(
            t,
            name,
            consumer_type=sub_type,
            receiver_queue_size=args.receiver_queue_size,
            initial_position=position,
        )
        for t in topics
        for name in names
        for _ in range(args.num_consumers)
    ]
    recorder = Recorder()
    stop = _Deadline(args)
    reporter = Reporter("consume", recorder, _interval(args))
    per_thread_rate = args.rate / len(consumers) if args.rate > 0 else 0.0
    timeout_error = pulsar.Timeout

    def receive_loop(consumer: Any) -> None:
        started = time.perf_counter()
        mine = 0
        while not stop.done(recorder.messages):
            try:
                msg = consumer.receive(timeout_millis=100)
            except timeout_error:
                continue
            except pulsar.PulsarException:  # closed under us: we are stopping
                break
            latency_ms = max(time.time_ns() // 1_000_000 - msg.publish_timestamp(), 0)
            recorder.ok(latency_ms * 1000, len(msg.data()))
            consumer.acknowledge(msg)
            mine += 1
            if per_thread_rate:
                ahead = started + mine / per_thread_rate - time.perf_counter()
                if ahead > 0:
                    time.sleep(ahead)

    stop.install()
    reporter.start()
    start = time.perf_counter()
    threads = [
        threading.Thread(target=receive_loop, args=(c,), name=f"perf-consumer-{i}", daemon=True)
        for i, c in enumerate(consumers)
    ]
    try:
        for th in threads:
            th.start()
        while any(th.is_alive() for th in threads):
            for th in threads:
                th.join(0.1)
            if stop.done(recorder.messages):
                break
        for th in threads:
            th.join(1.0)
    finally:
        elapsed = time.perf_counter() - start
        stop.restore()
        reporter.stop()
        for c in consumers:
            c.close()
        client.close()
    return _summary(
        "consume",
        args,
        topics,
        reporter,
        recorder,
        elapsed,
        {
            "subscriptionType": args.subscription_type,
            "subscriptions": names,
            "numConsumers": args.num_consumers,
            "subscriptionPosition": args.subscription_position,
            "receiverQueueSize": args.receiver_queue_size,
            "rate": args.rate,
        },
    )


# --- summary -------------------------------------------------------------------------------


def _summary(
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


def _print_summary(summary: dict[str, Any]) -> None:
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


def main(argv: Sequence[str]) -> int:
    """Run ``keyshared perf ARGS``; 0 when every message went through, 1 when some failed."""
    args = build_parser().parse_args(list(argv))
    try:
        import pulsar
    except ImportError:
        print(
            "keyshared perf needs the official client: pip install pulsar-client",
            file=sys.stderr,
        )
        return 2
    if args.command == "produce" and args.size <= 0 and not args.payload_file:
        print("keyshared perf: --size must be positive", file=sys.stderr)
        return 2
    try:
        if args.command == "produce":
            summary = run_produce(pulsar, args)
        else:
            summary = run_consume(pulsar, args)
    except pulsar.PulsarException as exc:
        print(f"keyshared perf: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    _print_summary(summary)
    if args.json_out == "-":
        print(json.dumps(summary, indent=2))
    elif args.json_out:
        tmp = f"{args.json_out}.tmp"
        with open(tmp, "w") as f:
            json.dump(summary, f, indent=2)
            f.write("\n")
        os.replace(tmp, args.json_out)
    return 1 if summary["failed"] else 0
