"""One measurement at a time: start-up, a throughput run, a latency run.

Every run starts a fresh broker in a fresh directory and stops it afterwards, so brokers never
run at the same time and never inherit each other's data or background work.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

from . import brokers
from .pool import WorkerError, WorkerPool
from .workers import ConsumeSpec, LatencySpec, ProduceSpec, time_first_producer
from .workloads import LatencyCell, Workload

READY_TIMEOUT_S = 30.0
# Extra patience for the first message of a run, on top of the idle timeout.
FIRST_MESSAGE_GRACE_S = 5.0
ABORT_GRACE_S = 5.0
LOG_TAIL_LINES = 15
# After the last expected message arrived, consumers keep receiving this long to catch late
# duplicates (not timed).
DUPLICATE_GRACE_S = 0.3
# How often consumers look at the stop flag while idle, and the parent at the shared block.
CONSUMER_POLL_MS = 50
MONITOR_INTERVAL_S = 0.005
PROBE_SLOT = 0
BACKGROUND_SLOT = 1


@dataclass(frozen=True)
class Settings:
    """Knobs shared by every run of one invocation."""

    batch_delay_ms: int = 5
    max_pending: int = 10_000
    receiver_queue_size: int = 1000
    latency_duration_s: float = 5.0
    latency_warmup_s: float = 0.5
    # A consumer that gets nothing for this long declares the rest of the messages missing.
    idle_timeout_ms: int = 10_000
    # A run's time limit allows its messages at this rate (see run_deadline_s).
    min_rate: float = 500.0


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


def run_deadline_s(workload: Workload, settings: Settings) -> float:
    """A run's time limit from the producers' go: a broker still delivering then is too slow
    to get a rate. Generous by default (500 msg/s); pulsar-lite's Shared dispatch to several
    consumers runs at about that rate when entries are small."""
    return 30.0 + settings.idle_timeout_ms / 1000 + workload.messages / settings.min_rate


def pool_size_for(workloads: list[Workload], latency: list[LatencyCell]) -> int:
    """Worker processes needed: the most consumers plus the most producers of any cell."""
    needed = [w.consumers + w.producers for w in workloads]
    needed += [2 if cell.background_rate else 1 for cell in latency]
    return max(needed, default=1)


def _watch(
    seen: memoryview, expected: int, idle_timeout_s: float, deadline: float
) -> tuple[str, float]:
    """Watch the consumers' shared block until every message arrived, progress stops for
    ``idle_timeout_s`` (a stall) or ``deadline`` passes; returns (outcome, time)."""
    missing = expected
    last_progress = time.perf_counter()
    patience = idle_timeout_s + FIRST_MESSAGE_GRACE_S
    while True:
        time.sleep(MONITOR_INTERVAL_S)
        now = time.perf_counter()
        now_missing = seen[:expected].tobytes().count(0)
        if now_missing == 0:
            return "complete", now
        if now_missing != missing:
            missing = now_missing
            last_progress = now
            patience = idle_timeout_s
        elif now - last_progress > patience:
            return "stalled", now
        if now > deadline:
            return "deadline", now


def throughput_run(
    pool: WorkerPool, name: str, workload: Workload, settings: Settings, scratch: Path
) -> dict[str, Any]:
    """One run of ``workload`` against a fresh ``name`` broker; returns every figure.

    Consumer processes take worker slots ``0 .. consumers - 1``, producers the next ones.
    The parent watches the consumers' shared block: once every message was delivered it
    waits a grace period for late duplicates and raises the stop flag; when deliveries stop
    for the idle timeout it declares a stall, stops the broker at once and tells the
    producers to give up, so a stuck broker costs the idle timeout and not the client's send
    timeout. Each worker's answer is collected on its own, so a stall still leaves figures.
    """
    record: dict[str, Any] = {"broker": name, "loadavg_before": load_average()}
    broker = brokers.start(name, scratch)
    record["listen_s"] = broker.listen_s
    record["ready_s"] = brokers.wait_ready(broker)
    cpu_before = broker.cpu_seconds()
    topic = _topic("e2e")
    with_consumer = workload.subscription != "none"
    consumer_slots = list(range(workload.consumers)) if with_consumer else []
    slots = [len(consumer_slots) + n for n in range(workload.producers)]
    errors: list[str] = []
    produced: list[dict[str, Any]] = []
    consumed: list[dict[str, Any]] = []
    stuck: set[int] = set()
    stopped = False
    block = shared_memory.SharedMemory(create=True, size=workload.messages + 1)
    seen = block.buf
    assert seen is not None

    def stop_broker() -> None:
        nonlocal stopped
        if not stopped:
            record["broker_cpu_s"] = broker.cpu_seconds() - cpu_before
            record["broker_log_tail"] = broker.log_tail(LOG_TAIL_LINES)
            stop_began = time.perf_counter()
            record["broker_exit"] = brokers.stop(broker)
            record["stop_s"] = time.perf_counter() - stop_began
            stopped = True

    def collect(slot: int, timeout: float, into: list[dict[str, Any]]) -> None:
        try:
            into.append(pool.expect(slot, "result", timeout))
        except WorkerError as error:
            errors.append(str(error))
            stuck.add(slot)

    try:
        pad_topic = _topic("pad")
        for index, slot in enumerate(consumer_slots):
            spec = _consume_spec(
                broker.url, topic, pad_topic, workload, settings, index, block.name
            )
            pool.send(slot, "consume", spec)
        # Every subscription exists before the first message is produced.
        for slot in consumer_slots:
            try:
                pool.expect(slot, "ready", READY_TIMEOUT_S)
            except WorkerError:
                stuck.add(slot)
                raise
        share = workload.messages // workload.producers
        for n, slot in enumerate(slots):
            pool.send(
                slot, "produce", _produce_spec(broker.url, topic, workload, settings, n * share)
            )
        for slot in slots:
            try:
                pool.expect(slot, "ready", READY_TIMEOUT_S)
            except WorkerError:
                stuck.add(slot)
                raise
        for slot in slots:
            pool.send(slot, "go")
        deadline = time.perf_counter() + run_deadline_s(workload, settings)
        give_up = False
        if with_consumer:
            outcome, _ = _watch(seen, workload.messages, settings.idle_timeout_ms / 1000, deadline)
            record["outcome"] = outcome
            give_up = outcome != "complete"
            if not give_up:
                time.sleep(DUPLICATE_GRACE_S)
            seen[workload.messages] = 1
            for slot in consumer_slots:
                collect(slot, CONSUMER_POLL_MS / 1000 + ABORT_GRACE_S, consumed)
        for slot in slots:
            if give_up:
                stop_broker()
                for other in slots:
                    if not pool.answered(other):
                        pool.send(other, "abort")
            before = len(errors)
            collect(slot, ABORT_GRACE_S if give_up else _left(deadline), produced)
            give_up = give_up or len(errors) > before
    except BaseException:
        stuck.update(consumer_slots + slots)
        raise
    finally:
        stop_broker()
        record["loadavg_after"] = load_average()
        missing = seen[: workload.messages].tobytes().count(0)
        del seen
        block.close()
        block.unlink()
        if stuck:
            # These workers may be stuck mid-run against the broker we just stopped.
            pool.restart(stuck)
    if errors:
        record["errors"] = errors
    if len(produced) < len(slots) or len(consumed) < len(consumer_slots):
        record["error"] = "; ".join(e.strip().splitlines()[-1] for e in errors) or "no result"
    record.update(
        _throughput_figures(workload, produced, consumed if with_consumer else None, missing)
    )
    if record["exact"] and "error" not in record:
        # Keep the JSON small: the broker's output only matters when something went wrong.
        del record["broker_log_tail"]
    return record


def _left(deadline: float) -> float:
    return max(deadline - time.perf_counter(), 1.0)


def _consume_spec(
    url: str,
    topic: str,
    pad_topic: str,
    workload: Workload,
    settings: Settings,
    index: int,
    shm_name: str,
) -> ConsumeSpec:
    return ConsumeSpec(
        url=url,
        topic=topic,
        subscription="bench",
        consumer_type=workload.subscription,
        index=index,
        pad_topic=pad_topic,
        expected=workload.messages,
        shm_name=shm_name,
        poll_ms=CONSUMER_POLL_MS,
        receiver_queue_size=settings.receiver_queue_size,
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
        batching=workload.batched,
        key_based=workload.batching == "keybased",
        batch_delay_ms=settings.batch_delay_ms,
        max_pending=settings.max_pending,
        key_space=workload.keys,
    )


def _throughput_figures(
    workload: Workload,
    produced: list[dict[str, Any]],
    consumed: list[dict[str, Any]] | None,
    missing: int,
) -> dict[str, Any]:
    """Rates only for what completed: a stalled run reports counts, not a misleading rate."""
    figures: dict[str, Any] = {"messages": workload.messages}
    acked = sum(p["acked"] for p in produced)
    failed = sum(p["failed"] for p in produced)
    figures.update(
        {"acked": acked, "send_failed": failed, "entries": sum(p["entries"] for p in produced)}
    )
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
        received = sum(c["received"] for c in consumed)
        foreign = sum(c["foreign"] for c in consumed)
        unique = workload.messages - missing
        figures.update(
            {
                "received": received,
                "per_consumer_received": [c["received"] for c in consumed],
                "duplicates": received - unique - foreign,
                "missing": missing,
                "foreign": foreign,
            }
        )
        if missing == 0 and produced and consumed:
            elapsed = max(c["last_fresh"] for c in consumed) - first_send
            figures["e2e_s"] = elapsed
            figures["e2e_msg_s"] = workload.messages / elapsed
        rate = figures.get("e2e_msg_s")
        exact = exact and missing == 0 and figures["duplicates"] == 0 and foreign == 0
    if rate is not None:
        figures["mb_s"] = rate * workload.size / 1_000_000
    figures["complete"] = rate is not None
    figures["exact"] = exact
    return figures


def _latency_spec(url: str, cell: LatencyCell, rate: float, settings: Settings) -> LatencySpec:
    return LatencySpec(
        url=url,
        topic=_topic("latency"),
        size=cell.size,
        rate=rate,
        duration_s=settings.latency_duration_s,
        warmup_s=settings.latency_warmup_s,
        key_space=1_000,
    )


LATENCY_KEYS = ("achieved_rate", "p50_ms", "p99_ms", "p999_ms", "max_ms", "acked", "failed")


def latency_run(
    pool: WorkerPool, name: str, cell: LatencyCell, settings: Settings, scratch: Path
) -> dict[str, Any]:
    """One paced-publish latency run against a fresh ``name`` broker.

    With a background rate, a second non-batched producer on its own topic runs at that rate
    for the whole probe (both get ``go`` together, both warm up for the same time).
    """
    record: dict[str, Any] = {
        "broker": name,
        "size": cell.size,
        "rate": cell.rate,
        "background_rate": cell.background_rate,
        "loadavg_before": load_average(),
    }
    broker = brokers.start(name, scratch)
    record["ready_s"] = brokers.wait_ready(broker)
    cpu_before = broker.cpu_seconds()
    slots = [PROBE_SLOT] + ([BACKGROUND_SLOT] if cell.background_rate else [])
    try:
        pool.send(PROBE_SLOT, "latency", _latency_spec(broker.url, cell, cell.rate, settings))
        if cell.background_rate:
            pool.send(
                BACKGROUND_SLOT,
                "latency",
                _latency_spec(broker.url, cell, cell.background_rate, settings),
            )
        for slot in slots:
            pool.expect(slot, "ready", READY_TIMEOUT_S)
        for slot in reversed(slots):
            pool.send(slot, "go")
        timeout = settings.latency_duration_s + settings.latency_warmup_s + 60.0
        record.update(pool.expect(PROBE_SLOT, "result", timeout))
        if cell.background_rate:
            background = pool.expect(BACKGROUND_SLOT, "result", timeout)
            record["background"] = {key: background[key] for key in LATENCY_KEYS}
    except Exception as error:
        pool.restart(slots)
        raise RuntimeError(f"{error}; broker output:\n{broker.log_tail(LOG_TAIL_LINES)}") from error
    except BaseException:
        pool.restart(slots)
        raise
    finally:
        record["broker_cpu_s"] = broker.cpu_seconds() - cpu_before
        record["broker_exit"] = brokers.stop(broker)
        record["loadavg_after"] = load_average()
    return record
