"""Helpers for the Key_Shared scenarios: consumers, stats, receive loops, churn workers.

Python counterparts of the helpers of Pulsar's KeySharedSubscriptionTest
(``createConsumer``, ``receiveAndCheckDistribution``, ``receiveAndCheck``,
``BrokerTestUtil.receiveMessagesInThreads``) plus the worker threads the churn scenarios use.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mmh3
import pulsar

from tests.broker_process import BrokerProcess
from tests.ordering import ConsumptionRecorder, Delivery

SUB = "key_shared"
RANGE_SIZE = 65536


# --- hashes -----------------------------------------------------------------------------------
def pulsar_hash(key: bytes) -> int:
    """Pulsar's Murmur3_32Hash.makeHash (seed 0, non-negative)."""
    result: int = mmh3.hash(key, 0, signed=False)
    return result & 0x7FFFFFFF


def consistent_slot(key: bytes) -> int:
    """The consistent-hashing selector's sticky key hash: ``hash % 65535 + 1``."""
    return pulsar_hash(key) % (RANGE_SIZE - 1) + 1


def range_slot(key: bytes) -> int:
    """The auto-split / sticky selectors' slot: ``hash % 65536``, 0 becoming 1."""
    slot = pulsar_hash(key) % RANGE_SIZE
    return slot or 1


def owner_by_ranges(slot: int, ranges: dict[str, list[list[int]]]) -> str | None:
    """The consumer whose ``keyHashRangeArrays`` contain ``slot``."""
    for name, rs in ranges.items():
        for start, end in rs:
            if start <= slot <= end:
                return name
    return None


# --- the environment of one scenario ---------------------------------------------------------
@dataclass
class KeySharedEnv:
    """A broker, a client and a fresh topic for one scenario."""

    broker: BrokerProcess
    client: pulsar.Client
    impl: str
    topic: str = field(default_factory=lambda: f"persistent://public/default/ks-{uuid.uuid4().hex}")
    clients: list[pulsar.Client] = field(default_factory=list)

    @property
    def classic(self) -> bool:
        """Whether the broker runs the classic dispatcher."""
        return self.impl == "classic"

    @property
    def path(self) -> str:
        """The topic's admin path."""
        return "/admin/v2/persistent/" + self.topic[len("persistent://") :]

    def new_client(self) -> pulsar.Client:
        """Another client on the broker (closed at the end of the test)."""
        from tests.integration.conftest import make_client

        c = make_client(self.broker.service_url)
        self.clients.append(c)
        return c

    def consumer(
        self,
        name: str | None = None,
        *,
        sub: str = SUB,
        topic: str | None = None,
        queue: int = 1000,
        sticky: Sequence[tuple[int, int]] | None = None,
        allow_ooo: bool = False,
        listener: Callable[[pulsar.Consumer, pulsar.Message], None] | None = None,
        client: pulsar.Client | None = None,
        **kwargs: Any,
    ) -> pulsar.Consumer:
        """A Key_Shared consumer (AUTO_SPLIT unless ``sticky`` ranges are given)."""
        policy = pulsar.ConsumerKeySharedPolicy(
            key_shared_mode=pulsar.KeySharedMode.Sticky
            if sticky
            else pulsar.KeySharedMode.AutoSplit,
            allow_out_of_order_delivery=allow_ooo,
            sticky_ranges=list(sticky) if sticky else None,
        )
        return (client or self.client).subscribe(
            topic or self.topic,
            sub,
            consumer_type=pulsar.ConsumerType.KeyShared,
            consumer_name=name,
            receiver_queue_size=queue,
            key_shared_policy=policy,
            message_listener=listener,
            initial_position=pulsar.InitialPosition.Earliest,
            **kwargs,
        )

    def producer(self, batch: bool = False, **kwargs: Any) -> pulsar.Producer:
        """Batching off, or key-based batching (the only batching that keeps keys apart)."""
        if batch:
            kwargs.setdefault("batching_enabled", True)
            kwargs.setdefault("batching_type", pulsar.BatchingType.KeyBased)
            kwargs.setdefault("batching_max_publish_delay_ms", 1)
        else:
            kwargs.setdefault("batching_enabled", False)
        kwargs.setdefault("max_pending_messages", 2001)
        kwargs.setdefault("block_if_queue_full", True)
        return self.client.create_producer(self.topic, **kwargs)

    # --- admin ---------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Topic stats."""
        status, body = self.broker.admin("GET", self.path + "/stats")
        assert status == 200, body
        assert isinstance(body, dict)
        return body

    def sub_stats(self, sub: str = SUB) -> dict[str, Any]:
        """One subscription's stats."""
        subs: dict[str, Any] = self.stats()["subscriptions"]
        return dict(subs[sub])

    def consumer_stats(self, sub: str = SUB) -> dict[str, dict[str, Any]]:
        """Consumer stats by consumer name (names must be unique)."""
        return {c["consumerName"]: c for c in self.sub_stats(sub)["consumers"]}

    def cursor(self, sub: str = SUB) -> dict[str, Any]:
        """The subscription's cursor in the internal stats."""
        status, body = self.broker.admin("GET", self.path + "/internalStats")
        assert status == 200, body
        return dict(body["cursors"][sub])

    def last_confirmed(self) -> tuple[int, int]:
        """The topic's last add-confirmed position."""
        status, body = self.broker.admin("GET", self.path + "/internalStats")
        assert status == 200, body
        return parse_position(body["lastConfirmedEntry"])

    def ranges(self, sub: str = SUB) -> dict[str, list[list[int]]]:
        """keyHashRangeArrays by consumer name."""
        return {n: c.get("keyHashRangeArrays", []) for n, c in self.consumer_stats(sub).items()}

    def owner(
        self, key: str, sub: str = SUB, *, ranges: dict[str, list[list[int]]] | None = None
    ) -> str | None:
        """The consumer the consistent-hashing selector picks for ``key``."""
        return owner_by_ranges(consistent_slot(key.encode()), ranges or self.ranges(sub))

    def close(self) -> None:
        """Close the extra clients."""
        for c in self.clients:
            c.close()


def parse_position(text: str) -> tuple[int, int]:
    """``"ledger:entry"`` as a tuple."""
    ledger, entry = text.split(":")[:2]
    return int(ledger), int(entry)


def wait_until(pred: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    """Poll ``pred`` until true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def receive_none(consumer: pulsar.Consumer, timeout_ms: int) -> pulsar.Message | None:
    """``receive`` that returns None on timeout (Java's ``receive(t, unit)``)."""
    try:
        return consumer.receive(timeout_millis=timeout_ms)
    except pulsar.Timeout:
        return None


def key_of(msg: pulsar.Message) -> str:
    """The key a message is routed by: its ordering key, else its partition key."""
    ok: str = msg.ordering_key()
    if ok:
        return ok
    pk: str = msg.partition_key()
    return pk


def value(msg: pulsar.Message) -> int:
    """The integer payload the scenarios send."""
    return int(msg.data())


# --- receive loops -------------------------------------------------------------------------------
def receive_in_threads(
    consumers: Sequence[pulsar.Consumer],
    handler: Callable[[int, pulsar.Consumer, pulsar.Message], None],
    *,
    idle_ms: int = 250,
    limit_s: float = 20.0,
) -> None:
    """Receive on every consumer in its own thread until each has been idle for ``idle_ms``.

    ``handler(index, consumer, message)`` runs in the consumer's thread; an exception there
    stops that thread and is raised here.
    """
    errors: list[BaseException] = []
    deadline = time.monotonic() + limit_s

    def run(i: int, c: pulsar.Consumer) -> None:
        try:
            while time.monotonic() < deadline:
                msg = receive_none(c, idle_ms)
                if msg is None:
                    return
                handler(i, c, msg)
        except BaseException as exc:  # re-raised in the caller
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=(i, c), daemon=True) for i, c in enumerate(consumers)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(limit_s + 5)
    if errors:
        raise errors[0]


def receive_and_check_distribution(
    consumers: Sequence[pulsar.Consumer], expected_total: int, *, tolerance: float = 0.40
) -> dict[int, int]:
    """Receive everything (acking), check the total, key affinity and an even spread."""
    lock = threading.Lock()
    key_owner: dict[str, int] = {}
    per_consumer: dict[int, int] = defaultdict(int)
    problems: list[str] = []

    def handle(i: int, c: pulsar.Consumer, msg: pulsar.Message) -> None:
        c.acknowledge(msg)
        key = key_of(msg)
        with lock:
            per_consumer[i] += 1
            if key:
                owner = key_owner.setdefault(key, i)
                if owner != i:
                    problems.append(f"key {key!r} went to consumers {owner} and {i}")

    receive_in_threads(consumers, handle)
    total = sum(per_consumer.values())
    assert not problems, problems[:5]
    assert total == expected_total, f"received {total}, expected {expected_total}"
    mean = total / len(consumers)
    for i in range(len(consumers)):
        n = per_consumer.get(i, 0)
        assert abs(n - mean) <= mean * tolerance, (
            f"consumer {i} got {n}, mean {mean:.0f}: {dict(per_consumer)}"
        )
    return dict(per_consumer)


def receive_and_check(
    env: KeySharedEnv, checks: Iterable[tuple[pulsar.Consumer, int]], *, timeout_ms: int = 5000
) -> None:
    """Pulsar's receiveAndCheck: per consumer receive the expected count, ack the even ones,
    keys in order; the odd ones come back (asked for with ``redeliver_unacknowledged_messages``
    instead of a 3 s ack timeout, which the C++ client does not allow), in order, and nothing
    more; no key on two consumers."""
    consumer_keys: list[set[str]] = []
    for consumer, expected in checks:
        keys: set[str] = set()
        last: dict[str, int] = {}
        for i in range(expected):
            msg = consumer.receive(timeout_millis=timeout_ms)
            if i % 2 == 0:
                consumer.acknowledge(msg)
            key, v = key_of(msg), value(msg)
            assert v > last.get(key, -1), f"key {key!r}: {v} after {last.get(key)}"
            last[key] = v
            if key:
                keys.add(key)
        # The client sends acks grouped (100 ms): wait until the broker has them, else it
        # redelivers acked messages too (Pulsar's 3 s ack timeout hides this).
        name, left = consumer.consumer_name(), expected // 2

        def acks_arrived(name: str = name, left: int = left) -> bool:
            return bool(env.consumer_stats()[name]["unackedMessages"] == left)

        wait_until(acks_arrived, 5, f"{name}'s acks to reach the broker")
        consumer.redeliver_unacknowledged_messages()
        last = {}
        for _ in range(expected // 2):
            msg = consumer.receive(timeout_millis=timeout_ms)
            consumer.acknowledge(msg)
            key, v = key_of(msg), value(msg)
            assert msg.redelivery_count() >= 1, f"{msg.message_id()} not marked as redelivered"
            assert v > last.get(key, -1), f"redelivered key {key!r}: {v} after {last.get(key)}"
            last[key] = v
        assert receive_none(consumer, 100) is None, "redelivered too many messages"
        consumer_keys.append(keys)
    seen: set[str] = set()
    for keys in consumer_keys:
        assert not (keys & seen), f"keys on two consumers: {keys & seen}"
        seen |= keys


# --- churn workers ---------------------------------------------------------------------------
class Worker:
    """A consumer loop in a thread: receive, record, work for a random while, ack.

    ``delay`` gives this consumer's processing time per message (uneven speeds make an
    ordering bug visible); with ``ack_after`` the loop goes on at once and a timer acks the
    message later (a listener that acks asynchronously). ``hold(msg)`` true keeps a message
    unacked until :meth:`release_held`. ``limit`` stops receiving after that many messages.
    ``nack()`` true negatively acknowledges the message instead (it comes back later).
    ``blocking`` is for a zero-queue consumer (``receiver_queue_size=0``, Pulsar's nearest to
    ``startPaused``): it receives without a timeout and can only be stopped by closing it.
    Closing records the release of everything held, then closes.
    """

    def __init__(
        self,
        consumer: pulsar.Consumer,
        label: str,
        recorder: ConsumptionRecorder,
        *,
        delay: Callable[[], float] = lambda: 0.0,
        ack_after: Callable[[], float] | None = None,
        hold: Callable[[pulsar.Message], bool] = lambda _m: False,
        limit: int | None = None,
        blocking: bool = False,
        nack: Callable[[], bool] = lambda: False,
    ) -> None:
        self.consumer = consumer
        self.label = label
        self.recorder = recorder
        self.delay = delay
        self.ack_after = ack_after
        self.hold = hold
        self.limit = limit
        self.blocking = blocking
        self.nack = nack
        self.held: list[tuple[pulsar.Message, Delivery]] = []
        self.received = 0
        self.errors: list[BaseException] = []
        self.last_receive = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._closed = False
        self._timers: list[threading.Timer] = []
        self._thread = threading.Thread(target=self._run, name=f"worker-{label}", daemon=True)

    def start(self) -> Worker:
        """Start the loop."""
        self._thread.start()
        return self

    def _receive(self) -> pulsar.Message | None:
        try:
            if self.blocking:
                return self.consumer.receive()
            return self.consumer.receive(timeout_millis=50)
        except pulsar.Timeout:
            return None

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self.limit is not None and self.received >= self.limit:
                    self._stop.wait(0.05)
                    continue
                try:
                    msg = self._receive()
                except pulsar.AlreadyClosed:
                    return
                if msg is None:
                    continue
                d = self.recorder.received(self.label, msg)
                self.received += 1
                self.last_receive = time.monotonic()
                with self._lock:
                    if self.hold(msg):
                        self.held.append((msg, d))
                        continue
                self._process(msg, d)
        except BaseException as exc:  # reported by check_errors
            self.errors.append(exc)

    def _process(self, msg: pulsar.Message, d: Delivery) -> None:
        if self.nack():
            self.recorder.releasing(d)
            self.consumer.negative_acknowledge(msg)
            return
        if self.ack_after is not None:
            timer = threading.Timer(self.ack_after(), self._ack, args=(msg, d))
            timer.daemon = True
            self._timers.append(timer)
            timer.start()
            return
        pause = self.delay()
        if pause > 0:
            time.sleep(pause)
        if not self._stop.is_set():  # stopped mid-message: it stays unacked (released at close)
            self._ack(msg, d)

    def _ack(self, msg: pulsar.Message, d: Delivery) -> None:
        with self._lock:
            if self._closed:
                return
            self.recorder.acking(d)
            with contextlib.suppress(pulsar.AlreadyClosed):
                self.consumer.acknowledge(msg)

    def release_held(self, *, process: bool = False) -> None:
        """Ack (or with ``process``, handle as if just received) every held message."""
        with self._lock:
            held, self.held = self.held, []
            self.hold = lambda _m: False
        for msg, d in held:
            if process:
                self._process(msg, d)
            else:
                self._ack(msg, d)

    def close(self) -> None:
        """Stop the loop and close the consumer; what it holds goes back to the broker."""
        if self._closed:
            return
        self._stop.set()
        if not self.blocking:
            self._thread.join(10)
        with self._lock:
            at = self.recorder.now()
            self._closed = True
            for t in self._timers:
                t.cancel()
            self.consumer.close()
        self._thread.join(10)
        self.recorder.closing(self.label, at=at)

    def check_errors(self) -> None:
        """Raise the first exception the loop hit."""
        if self.errors:
            raise self.errors[0]


def wait_idle(
    workers: Sequence[Worker],
    done: Callable[[], bool],
    *,
    idle_s: float = 1.0,
    limit_s: float = 20.0,
) -> None:
    """Wait until ``done()`` or every worker has received nothing for ``idle_s``."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if done():
            return
        now = time.monotonic()
        if all(now - w.last_receive > idle_s for w in workers):
            return
        time.sleep(0.05)


def uneven(rng: random.Random, mean_s: float) -> Callable[[], float]:
    """A processing-time distribution: mostly quick, sometimes slow (exponential)."""
    return lambda: rng.expovariate(1.0 / mean_s) if mean_s > 0 else 0.0


def chance(rng: random.Random, p: float) -> Callable[[], bool]:
    """True with probability ``p`` on each call."""
    return lambda: rng.random() < p
