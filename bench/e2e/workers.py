"""Client code of the benchmark; each function runs in its own spawned worker process.

The same code drives every broker. Loops are kept lean on purpose: the Python client costs
~5 us per ``receive()+acknowledge()`` and ~30 us per ``send_async``, so every extra operation in
a loop measures the client more than the broker. Times are ``time.perf_counter()``, which on
Linux is ``CLOCK_MONOTONIC`` and therefore comparable across processes on the same machine.
"""

from __future__ import annotations

import contextlib
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pulsar

from .stats import percentile

SEQ = struct.Struct("<I")
CLIENT_OPERATION_TIMEOUT_S = 5
SEND_TIMEOUT_MS = 30_000


def new_client(url: str) -> Any:
    """A client with quiet logging and bounded operation timeouts."""
    return pulsar.Client(
        url,
        operation_timeout_seconds=CLIENT_OPERATION_TIMEOUT_S,
        io_threads=1,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )


def payload_tail(size: int) -> bytes:
    """Filler after the 4-byte sequence number, so each payload is exactly ``size`` bytes."""
    return b"x" * (size - SEQ.size)


@dataclass(frozen=True)
class ProduceSpec:
    """One producer's share of a throughput run."""

    url: str
    topic: str
    first_seq: int
    count: int
    size: int
    batching: bool
    key_based: bool
    batch_delay_ms: int
    max_pending: int
    key_space: int


@dataclass(frozen=True)
class ConsumeSpec:
    """The consumer of a throughput run; it expects sequence numbers ``0 .. expected - 1``."""

    url: str
    topic: str
    subscription: str
    key_shared: bool
    expected: int
    idle_timeout_ms: int
    first_timeout_ms: int
    grace_ms: int
    receiver_queue_size: int
    # One of several consumers: it cannot know when its share is complete, so it stops after
    # ``grace_ms`` without a message once it had one, and returns its bitmap for the parent
    # to merge; ``last_receive`` is still the time of its last message.
    shared: bool = False


@dataclass(frozen=True)
class LatencySpec:
    """A paced, non-batched producer measuring publish latency."""

    url: str
    topic: str
    size: int
    rate: float
    duration_s: float
    warmup_s: float
    key_space: int


ABORT_POLL_S = 0.05


class Control(Protocol):
    """The worker's line to the parent process."""

    def ready(self) -> None:
        """Tell the parent this worker is connected and set up."""

    def wait_go(self) -> None:
        """Block until the parent says start."""

    def report(self, result: dict[str, Any]) -> None:
        """Send the run's figures; cleanup happens after this."""

    def aborted(self) -> bool:
        """True once the parent asked this run to give up (the broker stalled)."""


def _wait_done(done: threading.Event, control: Control, timeout_s: float) -> bool:
    # Poll so the parent can abort us; a stalled broker would otherwise hold us until the
    # client's send timeout.
    deadline = time.perf_counter() + timeout_s
    while not done.wait(ABORT_POLL_S):
        if control.aborted() or time.perf_counter() > deadline:
            return False
    return True


def _quietly(close: Callable[[], None]) -> None:
    # Cleanup after the figures were reported: a stalled broker must not turn into a failed
    # run here, and the parent stops the broker right after, which ends any wait.
    with contextlib.suppress(Exception):
        close()


def run_producer(spec: ProduceSpec, control: Control) -> None:
    """Send ``spec.count`` keyed messages with ``send_async``; time first send to last ack."""
    client = new_client(spec.url)
    try:
        batching_type = (
            pulsar.BatchingType.KeyBased if spec.key_based else pulsar.BatchingType.Default
        )
        producer = client.create_producer(
            spec.topic,
            batching_enabled=spec.batching,
            batching_type=batching_type,
            batching_max_messages=1000,
            batching_max_publish_delay_ms=spec.batch_delay_ms,
            max_pending_messages=spec.max_pending,
            block_if_queue_full=True,
            send_timeout_millis=SEND_TIMEOUT_MS,
        )
        keys = [f"key-{k}" for k in range(spec.key_space)]
        tail = payload_tail(spec.size)
        pack = SEQ.pack
        count = spec.count
        done = threading.Event()
        state = {"acked": 0, "failed": 0, "last": 0.0}
        ok = pulsar.Result.Ok

        def on_sent(result: Any, _msg_id: Any) -> None:
            # Called on the client's single IO thread, so these updates do not race.
            if result == ok:
                state["acked"] += 1
            else:
                state["failed"] += 1
            state["last"] = time.perf_counter()
            if state["acked"] + state["failed"] == count:
                done.set()

        send = producer.send_async
        control.ready()
        control.wait_go()
        first = time.perf_counter()
        seq = spec.first_seq
        key_space = spec.key_space
        for i in range(seq, seq + count):
            send(pack(i) + tail, on_sent, partition_key=keys[i % key_space])
        loop_end = time.perf_counter()
        # No flush(): the batch timer sends the last batch within batch_delay_ms, and waiting
        # on our own event keeps the wait abortable.
        finished = _wait_done(done, control, SEND_TIMEOUT_MS / 1000 + 5)
        control.report(
            {
                "first_send": first,
                "loop_end": loop_end,
                "last_ack": state["last"],
                "acked": state["acked"],
                "failed": state["failed"],
                "complete": finished,
            }
        )
        _quietly(producer.close)
    finally:
        _quietly(client.close)


def run_consumer(spec: ConsumeSpec, control: Control) -> None:
    """Receive and ack until every expected sequence number arrived; count dups and missing."""
    client = new_client(spec.url)
    try:
        consumer_type = (
            pulsar.ConsumerType.KeyShared if spec.key_shared else pulsar.ConsumerType.Exclusive
        )
        consumer = client.subscribe(
            spec.topic,
            spec.subscription,
            consumer_type=consumer_type,
            initial_position=pulsar.InitialPosition.Earliest,
            receiver_queue_size=spec.receiver_queue_size,
        )
        expected = spec.expected
        seen = bytearray(expected)
        receive = consumer.receive
        acknowledge = consumer.acknowledge
        unpack = SEQ.unpack_from
        timeout = spec.idle_timeout_ms
        first_timeout = spec.first_timeout_ms
        unique = 0
        received = 0
        foreign = 0
        timed_out = False
        first_receive = 0.0
        control.ready()
        if spec.shared:
            _consume_share(consumer, spec, control)
            return
        try:
            msg = receive(first_timeout)
            first_receive = time.perf_counter()
            while True:
                received += 1
                seq = unpack(msg.data())[0]
                if seq < expected:
                    if not seen[seq]:
                        seen[seq] = 1
                        unique += 1
                else:
                    foreign += 1
                acknowledge(msg)
                if unique == expected:
                    break
                msg = receive(timeout)
        except pulsar.Timeout:
            timed_out = True
        last_receive = time.perf_counter()
        # Anything arriving after the full set is a duplicate; collect it without timing it.
        extra = 0
        if not timed_out:
            try:
                while True:
                    msg = receive(spec.grace_ms)
                    extra += 1
                    acknowledge(msg)
            except pulsar.Timeout:
                pass
        received += extra
        control.report(
            {
                "first_receive": first_receive,
                "last_receive": last_receive,
                "received": received,
                "unique": unique,
                "duplicates": received - unique - foreign,
                "missing": expected - unique,
                "foreign": foreign,
                "timed_out": timed_out,
            }
        )
        _quietly(consumer.close)
    finally:
        _quietly(client.close)


def _consume_share(consumer: Any, spec: ConsumeSpec, control: Control) -> None:
    """One of several consumers: receive and ack until idle, report the bitmap."""
    seen = bytearray(spec.expected)
    receive = consumer.receive
    acknowledge = consumer.acknowledge
    unpack = SEQ.unpack_from
    expected = spec.expected
    received = unique = foreign = 0
    first_receive = last_receive = 0.0
    timeout = spec.first_timeout_ms
    try:
        while True:
            msg = receive(timeout)
            last_receive = time.perf_counter()
            if not received:
                first_receive = last_receive
                timeout = spec.grace_ms
            received += 1
            seq = unpack(msg.data())[0]
            if seq < expected:
                if not seen[seq]:
                    seen[seq] = 1
                    unique += 1
            else:
                foreign += 1
            acknowledge(msg)
    except pulsar.Timeout:
        pass
    control.report(
        {
            "first_receive": first_receive,
            "last_receive": last_receive,
            "received": received,
            "unique": unique,
            "foreign": foreign,
            "seen": bytes(seen),
        }
    )
    _quietly(consumer.close)


def run_latency(spec: LatencySpec, control: Control) -> None:
    """Publish at a fixed rate without batching; latency = ack callback time - send time."""
    client = new_client(spec.url)
    try:
        producer = client.create_producer(
            spec.topic,
            batching_enabled=False,
            max_pending_messages=10_000,
            block_if_queue_full=True,
            send_timeout_millis=SEND_TIMEOUT_MS,
        )
        warmup = int(spec.rate * spec.warmup_s)
        total = warmup + int(spec.rate * spec.duration_s)
        sent_at = [0.0] * total
        acked_at = [0.0] * total
        failed = [0]
        done = threading.Event()
        remaining = [total]
        ok = pulsar.Result.Ok
        tail = payload_tail(spec.size)
        keys = [f"key-{k}" for k in range(spec.key_space)]

        def callback_for(i: int) -> Callable[[Any, Any], None]:
            def on_sent(result: Any, _msg_id: Any) -> None:
                acked_at[i] = time.perf_counter()
                if result != ok:
                    failed[0] += 1
                remaining[0] -= 1
                if remaining[0] == 0:
                    done.set()

            return on_sent

        control.ready()
        control.wait_go()
        interval = 1.0 / spec.rate
        start = time.perf_counter()
        for i in range(total):
            target = start + i * interval
            delay = target - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            payload = SEQ.pack(i) + tail
            callback = callback_for(i)
            sent_at[i] = time.perf_counter()
            producer.send_async(payload, callback, partition_key=keys[i % spec.key_space])
        loop_end = time.perf_counter()
        complete = _wait_done(done, control, SEND_TIMEOUT_MS / 1000 + 5)
        samples = sorted(
            (acked_at[i] - sent_at[i]) * 1000.0 for i in range(warmup, total) if acked_at[i] > 0
        )
        measured = total - warmup
        control.report(
            {
                "messages": measured,
                "acked": len(samples),
                "failed": failed[0],
                "complete": complete,
                "achieved_rate": measured / max(loop_end - (start + warmup * interval), 1e-9),
                "p50_ms": percentile(samples, 0.50),
                "p99_ms": percentile(samples, 0.99),
                "p999_ms": percentile(samples, 0.999),
                "max_ms": samples[-1] if samples else float("nan"),
                "mean_ms": sum(samples) / len(samples) if samples else float("nan"),
            }
        )
        _quietly(producer.close)
    finally:
        _quietly(client.close)


def time_first_producer(url: str, topic: str) -> float:
    """Create a client and a producer on ``url``; return the ``perf_counter`` when it exists."""
    client = new_client(url)
    try:
        producer = client.create_producer(topic)
        created = time.perf_counter()
        _quietly(producer.close)
        return created
    finally:
        _quietly(client.close)
