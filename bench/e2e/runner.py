"""One measurement at a time: start-up, a throughput run, a latency run.

Every run starts a fresh broker in a fresh directory and stops it afterwards, so brokers never
run at the same time and never inherit each other's data or background work.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import brokers
from .pool import WorkerError, WorkerPool
from .workers import ConsumeSpec, LatencySpec, ProduceSpec, time_first_producer
from .workloads import KEY_SPACE, Workload

READY_TIMEOUT_S = 30.0
# The consumer is ready before the producers are created; allow for that before the first message.
PRODUCERS_START_MS = 5_000
ABORT_GRACE_S = 5.0
LOG_TAIL_LINES = 15
DUPLICATE_GRACE_MS = 300
# With several consumers, each stops after this long without a message (it cannot know when
# its share is complete); the rate still ends at the last message received.
SHARE_IDLE_END_MS = 5_000


@dataclass(frozen=True)
class Settings:
    """Knobs shared by every run of one invocation."""

    batch_delay_ms: int = 5
    max_pending: int = 10_000
    receiver_queue_size: int = 1000
    latency_rate: float = 1000.0
    latency_duration_s: float = 5.0
    latency_warmup_s: float = 0.5
    # A consumer that gets nothing for this long declares the rest of the messages missing.
    idle_timeout_ms: int = 10_000


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded."""
    return [round(value, 2) for value in os.getloadavg()]


def _topic(prefix: str) -> str:
    return f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:12]}"


def measure_startup(name: str, scratch: Path) -> dict[str, float]:
    """Start ``name`` once; seconds from ``Popen`` to TCP listening and to a created producer."""
    broker = brokers.start(name, scratch)
    try:
        producer_at = time_first_producer(broker.url, _topic("startup"))
        return {"listen_s": broker.listen_s, "producer_s": producer_at - broker.popen_at}
    except Exception as error:
        raise RuntimeError(f"{error}; broker output:\n{broker.log_tail(LOG_TAIL_LINES)}") from error
    finally:
        brokers.stop(broker)


def _run_deadline_s(workload: Workload, settings: Settings) -> float:
    # Generous: the slowest combination seen on the peer is ~3k msg/s; this only bounds hangs.
    return 30.0 + settings.idle_timeout_ms / 1000 + workload.messages / 500.0


def throughput_run(
    pool: WorkerPool, name: str, workload: Workload, settings: Settings, scratch: Path
) -> dict[str, Any]:
    """One run of ``workload`` against a fresh ``name`` broker; returns every figure.

    Each worker's answer is collected on its own, so a stalled consumer still leaves the
    producers' figures; ``errors`` lists what went wrong. When the consumer reports a stall,
    the broker is stopped at once and the producers are told to give up, so a stuck broker
    costs the consumer's idle timeout and not the client's send timeout.
    """
    record: dict[str, Any] = {"broker": name, "loadavg_before": load_average()}
    broker = brokers.start(name, scratch)
    record["listen_s"] = broker.listen_s
    record["ready_s"] = brokers.wait_ready(broker)
    cpu_before = broker.cpu_seconds()
    topic = _topic("e2e")
    with_consumer = workload.subscription != "none"
    consumer_slots = list(range(workload.consumers)) if with_consumer else []
    first_producer = max(len(consumer_slots), 1)
    slots = list(range(first_producer, first_producer + workload.producers))
    errors: list[str] = []
    produced: list[dict[str, Any]] = []
    consumed: dict[str, Any] | None = None
    restart = False
    stopped = False

    def stop_broker() -> None:
        nonlocal stopped
        if not stopped:
            record["broker_cpu_s"] = broker.cpu_seconds() - cpu_before
            record["broker_log_tail"] = broker.log_tail(LOG_TAIL_LINES)
            stop_began = time.perf_counter()
            record["broker_exit"] = brokers.stop(broker)
            record["stop_s"] = time.perf_counter() - stop_began
            stopped = True

    try:
        spec = _consume_spec(broker.url, topic, workload, settings)
        for slot in consumer_slots:
            pool.send(slot, "consume", spec)
            # The subscription must exist before the first message is produced.
            pool.expect(slot, "ready", READY_TIMEOUT_S)
        share = workload.messages // workload.producers
        for n, slot in enumerate(slots):
            pool.send(
                slot, "produce", _produce_spec(broker.url, topic, workload, settings, n * share)
            )
        for slot in slots:
            pool.expect(slot, "ready", READY_TIMEOUT_S)
        for slot in slots:
            pool.send(slot, "go")
        deadline = time.perf_counter() + _run_deadline_s(workload, settings)
        give_up = False
        if with_consumer:
            shares = []
            for slot in consumer_slots:
                try:
                    shares.append(pool.expect(slot, "result", _left(deadline)))
                except WorkerError as error:
                    errors.append(str(error))
                    restart = True
            if len(shares) == len(consumer_slots):
                consumed = shares[0] if len(shares) == 1 else _merge_shares(shares, workload)
            give_up = consumed is None or consumed["missing"] > 0
        for slot in slots:
            if give_up:
                stop_broker()
                for other in slots:
                    if not pool.answered(other):
                        pool.send(other, "abort")
            try:
                timeout = ABORT_GRACE_S if give_up else _left(deadline)
                produced.append(pool.expect(slot, "result", timeout))
            except WorkerError as error:
                errors.append(str(error))
                restart = True
                give_up = True
    except BaseException:
        restart = True
        raise
    finally:
        stop_broker()
        if restart:
            # Workers may be stuck mid-run against the broker we just stopped: start clean.
            pool.restart()
    if errors:
        record["errors"] = errors
    if len(produced) < len(slots) or (with_consumer and consumed is None):
        record["error"] = "; ".join(e.strip().splitlines()[-1] for e in errors) or "no result"
    record.update(_throughput_figures(workload, produced, consumed))
    if record["exact"] and "error" not in record:
        # Keep the JSON small: the broker's output only matters when something went wrong.
        del record["broker_log_tail"]
    return record


def _left(deadline: float) -> float:
    return max(deadline - time.perf_counter(), 1.0)


def _merge_shares(shares: list[dict[str, Any]], workload: Workload) -> dict[str, Any]:
    """One consumer's figures from several consumers' bitmaps."""
    seen = bytearray(workload.messages)
    for share in shares:
        for seq, bit in enumerate(share["seen"]):
            if bit:
                seen[seq] = 1
    unique = workload.messages - seen.count(0)
    received = sum(s["received"] for s in shares)
    foreign = sum(s["foreign"] for s in shares)
    return {
        "first_receive": min(s["first_receive"] for s in shares if s["received"]),
        "last_receive": max(s["last_receive"] for s in shares),
        "received": received,
        "unique": unique,
        "duplicates": received - unique - foreign,
        "missing": workload.messages - unique,
        "foreign": foreign,
        "timed_out": unique < workload.messages,
        "per_consumer_received": [s["received"] for s in shares],
    }


def _consume_spec(url: str, topic: str, workload: Workload, settings: Settings) -> ConsumeSpec:
    shared = workload.consumers > 1
    return ConsumeSpec(
        url=url,
        topic=topic,
        subscription="bench",
        key_shared=workload.subscription == "key_shared",
        expected=workload.messages,
        idle_timeout_ms=settings.idle_timeout_ms,
        first_timeout_ms=settings.idle_timeout_ms + PRODUCERS_START_MS,
        grace_ms=SHARE_IDLE_END_MS if shared else DUPLICATE_GRACE_MS,
        receiver_queue_size=settings.receiver_queue_size,
        shared=shared,
    )


def _produce_spec(
    url: str, topic: str, workload: Workload, settings: Settings, first_seq: int
) -> ProduceSpec:
    return ProduceSpec(
        url=url,
        topic=topic,
        first_seq=first_seq,
        count=workload.messages // workload.producers,
        size=workload.size,
        batching=workload.batching,
        key_based=workload.key_based_batching,
        batch_delay_ms=settings.batch_delay_ms,
        max_pending=settings.max_pending,
        key_space=KEY_SPACE,
    )


def _throughput_figures(
    workload: Workload, produced: list[dict[str, Any]], consumed: dict[str, Any] | None
) -> dict[str, Any]:
    """Rates only for what completed: a stalled run reports counts, not a misleading rate."""
    figures: dict[str, Any] = {"messages": workload.messages}
    acked = sum(p["acked"] for p in produced)
    failed = sum(p["failed"] for p in produced)
    figures.update({"acked": acked, "send_failed": failed})
    produce_complete = acked == workload.messages and failed == 0
    first_send = min((p["first_send"] for p in produced), default=0.0)
    if produce_complete:
        last_ack = max(p["last_ack"] for p in produced)
        figures["produce_s"] = last_ack - first_send
        figures["produce_msg_s"] = acked / (last_ack - first_send)
        figures["per_producer_msg_s"] = [
            p["acked"] / (p["last_ack"] - p["first_send"]) for p in produced
        ]
    exact = produce_complete
    rate = figures.get("produce_msg_s")
    if consumed is not None:
        figures.update(
            {
                "received": consumed["received"],
                "duplicates": consumed["duplicates"],
                "missing": consumed["missing"],
                "foreign": consumed["foreign"],
                "consumer_timed_out": consumed["timed_out"],
            }
        )
        if "per_consumer_received" in consumed:
            figures["per_consumer_received"] = consumed["per_consumer_received"]
        if consumed["missing"] == 0 and produced:
            elapsed = consumed["last_receive"] - first_send
            figures["e2e_s"] = elapsed
            figures["e2e_msg_s"] = workload.messages / elapsed
        rate = figures.get("e2e_msg_s")
        exact = exact and consumed["missing"] == 0 and consumed["duplicates"] == 0
        exact = exact and consumed["foreign"] == 0
    if rate is not None:
        figures["mb_s"] = rate * workload.size / 1_000_000
    figures["complete"] = rate is not None
    figures["exact"] = exact
    return figures


def latency_run(
    pool: WorkerPool, name: str, size: int, settings: Settings, scratch: Path
) -> dict[str, Any]:
    """One paced-publish latency run against a fresh ``name`` broker."""
    record: dict[str, Any] = {"broker": name, "size": size, "loadavg_before": load_average()}
    broker = brokers.start(name, scratch)
    record["ready_s"] = brokers.wait_ready(broker)
    slot = 1
    try:
        pool.send(
            slot,
            "latency",
            LatencySpec(
                url=broker.url,
                topic=_topic("latency"),
                size=size,
                rate=settings.latency_rate,
                duration_s=settings.latency_duration_s,
                warmup_s=settings.latency_warmup_s,
                key_space=KEY_SPACE,
            ),
        )
        pool.expect(slot, "ready", READY_TIMEOUT_S)
        pool.send(slot, "go")
        timeout = settings.latency_duration_s + settings.latency_warmup_s + 60.0
        record.update(pool.expect(slot, "result", timeout))
    except Exception as error:
        pool.restart()
        raise RuntimeError(f"{error}; broker output:\n{broker.log_tail(LOG_TAIL_LINES)}") from error
    except BaseException:
        pool.restart()
        raise
    finally:
        record["broker_exit"] = brokers.stop(broker)
    return record
