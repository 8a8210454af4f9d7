"""Publish back-pressure with real connections: ``maxMessagePublishBufferSizeInMB`` pauses
reading from every producer's connection while too much is unstored, and
``maxPendingPublishRequestsPerConnection`` pauses one connection with too many sends in flight;
both resume as the journal catches up, and every confirmed message is stored once.

These test the mechanics on the local disk with a tiny limit and many concurrent publishers;
the memory a slow disk costs with and without the limit is measured by
bench/bench_publish_buffer.py (a blkio-throttled loop device)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pulsar

from tests.broker_process import BrokerProcess
from tests.integration.conftest import make_client
from tests.integration.test_disk_full import metric, wait_for


def _publish(url: str, topic: str, tag: int, count: int, size: int, out: dict[str, str]) -> None:
    client = make_client(url)
    try:
        producer = client.create_producer(
            topic, batching_enabled=False, block_if_queue_full=True, send_timeout_millis=60_000
        )
        lock = threading.Lock()
        done = threading.Semaphore(0)

        def callback(key: str) -> Callable[[object, object], None]:
            def cb(res: object, msg_id: object) -> None:
                with lock:
                    out[key] = str(res) if res != pulsar.Result.Ok else "ok"
                done.release()

            return cb

        for i in range(count):
            key = f"{tag}-{i}"
            producer.send_async(key.encode().ljust(size, b"."), callback(key))
        for _ in range(count):
            done.acquire(timeout=120)
    finally:
        client.close()


def _stored(url: str, topic: str) -> list[str]:
    client = make_client(url)
    try:
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        keys = []
        while reader.has_message_available():
            keys.append(reader.read_next(10_000).data().split(b".")[0].decode())
        return keys
    finally:
        client.close()


def _run_publishers(broker: BrokerProcess, topic: str, n: int, count: int, size: int) -> None:
    results: dict[str, str] = {}
    threads = [
        threading.Thread(target=_publish, args=(broker.service_url, topic, t, count, size, results))
        for t in range(n)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert len(results) == n * count
    assert set(results.values()) == {"ok"}
    stored = _stored(broker.service_url, topic)
    assert len(stored) == len(set(stored)) == n * count


def test_the_publish_buffer_pauses_all_producers_and_resumes(
    fresh_broker: BrokerProcess, topic: str
) -> None:
    fresh_broker.conf.update({"maxMessagePublishBufferSizeInMB": 1})
    fresh_broker.start()
    _run_publishers(fresh_broker, topic, n=6, count=150, size=32 * 1024)
    assert (metric(fresh_broker, "keyshared_publish_buffer_pauses_total") or 0) >= 1
    peak = metric(fresh_broker, "pulsar_broker_publish_buffer_max_usage")
    assert peak is not None and peak > 1024 * 1024
    print(f"\npublish buffer peak {peak:.0f} bytes (limit 1 MiB)")
    # Bounded: the limit, plus what each connection had already read when reading stopped.
    assert peak < 1024 * 1024 + 6 * 512 * 1024, peak
    wait_for(
        lambda: (
            metric(fresh_broker, "pulsar_broker_publish_buffer_usage") == 0
            and metric(fresh_broker, "pulsar_broker_throttled_connections_global_limit") == 0
        ),
        30,
        "the buffer to drain and reading to resume",
    )


def test_the_per_connection_limit_pauses_that_connection_and_resumes(
    fresh_broker: BrokerProcess, topic: str
) -> None:
    fresh_broker.conf.update(
        {"maxMessagePublishBufferSizeInMB": 0, "maxPendingPublishRequestsPerConnection": 10}
    )
    fresh_broker.start()
    _run_publishers(fresh_broker, topic, n=2, count=400, size=1024)
    assert (metric(fresh_broker, "keyshared_publish_connection_pauses_total") or 0) >= 1
    assert metric(fresh_broker, "pulsar_broker_throttled_connections") == 0
