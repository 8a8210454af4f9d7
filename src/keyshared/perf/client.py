"""The official client as keyshared perf drives it: topics, payloads, keys, pacing."""

from __future__ import annotations

import argparse
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any


def make_client(pulsar: Any, args: argparse.Namespace) -> Any:
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


def topic_names(args: argparse.Namespace) -> list[str]:
    topics: list[str] = list(args.topics)
    if args.num_topics > 1 and len(topics) == 1:
        return [f"{topics[0]}{args.separator}{i}" for i in range(args.num_topics)]
    return topics


class Deadline:
    """Stop after ``-m`` messages, after ``-time`` seconds, or at Ctrl-C / SIGTERM."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.limit = args.num_messages
        self.duration = max(args.test_duration, 0)
        self.end = 0.0
        self.stopped = threading.Event()
        self._old: dict[int, Any] = {}

    def install(self, start: float) -> None:
        """Take Ctrl-C and SIGTERM as "stop"; ``-time`` counts from ``start``, the run's own
        clock, so set-up (connecting, creating producers) does not eat into it."""
        if self.duration:
            self.end = start + self.duration

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


def send_interval(args: argparse.Namespace) -> float:
    if args.stats_interval_seconds > 0:
        return float(args.stats_interval_seconds)
    return 1.0 if sys.stderr.isatty() else 10.0


def make_payloads(args: argparse.Namespace) -> list[bytes]:
    if args.payload_file:
        with open(args.payload_file, encoding="utf-8") as f:
            lines = [line.encode() for line in f.read().splitlines() if line]
        if not lines:
            raise SystemExit(f"keyshared perf: {args.payload_file} has no payload")
        return lines
    return [random.Random(0).randbytes(args.size)]


def make_key_chooser(args: argparse.Namespace) -> Callable[[int], str | None]:
    mode, n = args.message_key_generation_mode, args.num_keys
    if mode is None:
        return lambda _i: None
    if mode == "autoIncrement":
        return (lambda i: str(i % n)) if n > 0 else str
    rnd = random.Random()
    if n > 0:
        return lambda _i: str(rnd.randrange(n))
    return lambda _i: str(rnd.getrandbits(63))
