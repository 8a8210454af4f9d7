"""``make demo``: an end-to-end pipeline on the standalone broker, with a short summary.

1. A standalone broker starts (own data directory, free loopback ports).
2. A producer sends keyed events (JSON: key, seq, amount) to a 2-partition topic.
3. Key_Shared consumers process them while ``c3`` joins and ``c1`` leaves; each writes a
   consumption log (:class:`keyshared.spark.consumption_log.ConsumptionLog`).
4. A Structured Streaming job reads the topic (keyshared source) and aggregates per key, writing
   the running aggregates to an output topic (keyshared sink) and a Parquet snapshot.
5. The Spark audit checks the consumption logs against the topic; the compaction job turns the
   output topic into its latest value per key, which must equal the Parquet snapshot.

The pieces (:class:`LocalBroker`, :class:`KeySharedWorker`, :func:`produce_events`) are reused by
the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from keyshared.spark.consumption_log import ConsumptionLog

_READY = re.compile(r"broker service: pulsar://([\d.]+):(\d+)")
_WEB = re.compile(r"web service:\s+http://([\d.]+):(\d+)")


class LocalBroker:
    """A ``keyshared standalone`` process on free loopback ports."""

    def __init__(self, root: Path, conf: dict[str, object] | None = None) -> None:
        self.root = root
        self.conf = conf or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.service_url = ""
        self.web_url = ""

    def start(self, timeout: float = 30.0) -> LocalBroker:
        """Start it and wait until it prints its addresses."""
        self.root.mkdir(parents=True, exist_ok=True)
        conf = self.root / "broker.conf"
        conf.write_text("".join(f"{k}={v}\n" for k, v in self.conf.items()))
        log_path = self.root / "broker.log"
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "keyshared.cli", "standalone", "--data-dir",
                 str(self.root / "data"), "--broker-port", "0", "--web-port", "0",
                 "--bind-address", "127.0.0.1", "--config", str(conf)],
                stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = log_path.read_text(errors="replace")
            m, w = _READY.search(text), _WEB.search(text)
            if m and w:
                self.service_url = f"pulsar://127.0.0.1:{m.group(2)}"
                self.web_url = f"http://127.0.0.1:{w.group(2)}"
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited:\n{text}")
            time.sleep(0.02)
        self.stop()
        raise TimeoutError("broker did not start")

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        """One admin REST call (JSON in and out)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.web_url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


class KeySharedWorker(threading.Thread):
    """A Key_Shared consumer in a thread: receive, log, "process", log the ack, ack."""

    def __init__(
        self,
        client: Any,
        topic: str,
        subscription: str,
        name: str,
        log_dir: Path,
        *,
        sticky_ranges: list[tuple[int, int]] | None = None,
        work_seconds: float = 0.0,
    ) -> None:
        super().__init__(name=f"worker-{name}", daemon=True)
        self.client = client
        self.topic = topic
        self.subscription = subscription
        self.consumer_name = name
        self.log_path = log_dir / f"{name}.jsonl"
        self.sticky_ranges = sticky_ranges
        self.work_seconds = work_seconds
        self.processed = 0
        self.error: BaseException | None = None
        self._stop_flag = threading.Event()
        self._ready = threading.Event()

    def run(self) -> None:
        import pulsar

        policy = None
        if self.sticky_ranges is not None:
            policy = pulsar.ConsumerKeySharedPolicy(
                key_shared_mode=pulsar.KeySharedMode.Sticky, sticky_ranges=self.sticky_ranges
            )
        try:
            consumer = self.client.subscribe(
                self.topic,
                self.subscription,
                consumer_type=pulsar.ConsumerType.KeyShared,
                consumer_name=self.consumer_name,
                initial_position=pulsar.InitialPosition.Earliest,
                receiver_queue_size=20,
                key_shared_policy=policy,
                # Without it a batch entry left half-acknowledged by a leaving consumer comes
                # back whole, and its acknowledged messages are processed twice.
                batch_index_ack_enabled=True,
            )
        except BaseException as exc:
            self.error = exc
            self._ready.set()
            return
        log = ConsumptionLog(
            self.log_path,
            self.consumer_name,
            self.subscription,
            self.topic,
            ranges=self.sticky_ranges,
        )
        self._ready.set()
        try:
            while not self._stop_flag.is_set():
                try:
                    msg = consumer.receive(100)
                except pulsar.Timeout:
                    continue
                log.received(msg)
                if self.work_seconds:
                    time.sleep(self.work_seconds)
                log.acked(msg)
                consumer.acknowledge(msg)
                self.processed += 1
        except BaseException as exc:
            self.error = exc
        finally:
            log.close()
            consumer.close()

    def started(self, timeout: float = 10.0) -> KeySharedWorker:
        """Start and wait until the consumer is subscribed."""
        self.start()
        self._ready.wait(timeout)
        if self.error is not None:
            raise self.error
        return self

    def leave(self) -> None:
        """Stop consuming and close (the log's ``leave`` comes first)."""
        self._stop_flag.set()
        self.join(10)


def produce_events(
    client: Any, topic: str, n: int, keys: int, *, seconds: float = 0.0, seed: int = 7
) -> list[dict[str, Any]]:
    """Send ``n`` JSON events over about ``seconds`` (key-based batching); returns them."""
    import random

    import pulsar

    rng = random.Random(seed)
    producer = client.create_producer(
        topic,
        batching_enabled=True,
        batching_type=pulsar.BatchingType.KeyBased,
        batching_max_publish_delay_ms=10,
        block_if_queue_full=True,
    )
    seqs: dict[str, int] = {}
    events = []
    t0 = time.monotonic()
    for i in range(n):
        key = f"user-{rng.randrange(keys):03d}"
        seqs[key] = seqs.get(key, 0) + 1
        ev = {"key": key, "seq": seqs[key], "amount": rng.randrange(1, 100)}
        events.append(ev)
        producer.send_async(json.dumps(ev).encode(), None, partition_key=key)
        if seconds and i % 50 == 49:
            ahead = t0 + seconds * (i + 1) / n - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
    producer.flush()
    producer.close()
    return events


def _aggregate_query(spark: Any, broker: LocalBroker, topic: str, out: str, parquet: Path) -> Any:
    from pyspark.sql import functions as F

    events = (
        spark.readStream.format("keyshared")
        .option("service.url", broker.service_url)
        .option("admin.url", broker.web_url)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerBatch", "1500")
        .load()
        .select(
            F.from_json(F.col("value").cast("string"), "key STRING, seq INT, amount INT").alias("e")
        )
        .select("e.*")
    )
    totals = events.groupBy("key").agg(
        F.count("*").alias("events"),
        F.sum("amount").alias("amount"),
        F.max("seq").alias("last_seq"),
    )

    def write(batch: Any, batch_id: int) -> None:
        batch = batch.cache()
        batch.write.mode("overwrite").parquet(str(parquet))
        (
            batch.select(
                F.col("key").alias("__key"),
                F.to_json(F.struct("key", "events", "amount", "last_seq")).alias("value"),
            )
            .write.format("keyshared")
            .option("service.url", broker.service_url)
            .option("topic", out)
            .mode("append")
            .save()
        )
        batch.unpersist()

    return (
        totals.writeStream.outputMode("complete")
        .foreachBatch(write)
        .option("checkpointLocation", str(parquet.parent / "checkpoint"))
        .trigger(processingTime="1 second")
        .start()
    )


def run_demo(
    workdir: Path, *, events: int = 3000, keys: int = 40, master: str = "local[2]"
) -> dict[str, Any]:
    """Run the whole pipeline in ``workdir``; returns the figures it prints."""
    import pulsar

    t_start = time.monotonic()
    broker = LocalBroker(
        workdir / "broker",
        {"defaultRetentionTimeInMinutes": -1, "defaultRetentionSizeInMB": -1},
    ).start()
    topic, out = "persistent://public/default/events", "persistent://public/default/events-by-key"
    summary: dict[str, Any] = {"broker": broker.service_url}
    spark = None
    try:
        for t in (topic, out):
            broker.admin("PUT", "/admin/v2/" + t.replace("://", "/") + "/partitions", 2)
        client = pulsar.Client(broker.service_url, logger=_quiet(), operation_timeout_seconds=10)
        logs = workdir / "consumption-logs"
        sub = "processors"
        c1 = KeySharedWorker(client, topic, sub, "c1", logs, work_seconds=0.001).started()
        c2 = KeySharedWorker(client, topic, sub, "c2", logs, work_seconds=0.001).started()
        produced: list[dict[str, Any]] = []
        producer = threading.Thread(
            target=lambda: produced.extend(produce_events(client, topic, events, keys, seconds=6)),
            daemon=True,
        )
        producer.start()

        def membership() -> None:
            time.sleep(2)
            workers.append(
                KeySharedWorker(client, topic, sub, "c3", logs, work_seconds=0.001).started()
            )
            time.sleep(2)
            c1.leave()

        workers = [c1, c2]
        churn = threading.Thread(target=membership, daemon=True)
        churn.start()

        from keyshared.spark.session import get_session

        spark = get_session(master, "keyshared-demo", {"spark.sql.shuffle.partitions": "2"})
        summary["spark_ready_s"] = round(time.monotonic() - t_start, 1)
        parquet = workdir / "aggregates" / "snapshot.parquet"
        query = _aggregate_query(spark, broker, topic, out, parquet)
        producer.join()
        churn.join()
        deadline = time.monotonic() + 60
        while sum(w.processed for w in workers) < events and time.monotonic() < deadline:
            time.sleep(0.1)
        for w in workers:
            w.leave()
        query.processAllAvailable()
        query.stop()
        summary["stream_batches"] = len(query.recentProgress)
        summary["streaming_done_s"] = round(time.monotonic() - t_start, 1)
        summary["processed_by"] = {w.consumer_name: w.processed for w in workers}

        from keyshared.spark.audit import audit
        from keyshared.spark.compact import latest_per_key

        def read(t: str) -> Any:
            return (
                spark.read.format("keyshared")
                .option("service.url", broker.service_url)
                .option("admin.url", broker.web_url)
                .option("topic", t)
                .load()
            )

        report = audit(spark, str(logs), topic_df=read(topic), subscription=sub)
        snapshot = {
            r["key"]: (r["events"], r["amount"]) for r in spark.read.parquet(str(parquet)).collect()
        }
        expect: dict[str, tuple[int, int]] = {}
        for ev in produced:
            n, a = expect.get(ev["key"], (0, 0))
            expect[ev["key"]] = (n + 1, a + ev["amount"])
        compacted = {
            r["__key"]: json.loads(r["value"]) for r in latest_per_key(read(out)).collect()
        }
        from_topic = {k: (v["events"], v["amount"]) for k, v in compacted.items()}
        summary.update(
            produced=len(produced),
            keys=len(expect),
            audit=report.to_dict(),
            audit_text=report.summary(),
            aggregates_match=snapshot == expect,
            compacted_topic_matches=from_topic == expect,
            total_s=round(time.monotonic() - t_start, 1),
        )
        client.close()
    finally:
        if spark is not None:
            spark.stop()
        broker.stop()
    return summary


def _quiet() -> Any:
    import logging

    logger = logging.getLogger("keyshared.demo.pulsar-client")
    logger.setLevel(logging.WARNING)
    return logger


def main(argv: list[str] | None = None) -> int:
    """Run the demo and print its summary; exit 1 if a check fails."""
    p = argparse.ArgumentParser(prog="python -m keyshared.spark.demo", description=__doc__)
    p.add_argument("--events", type=int, default=3000)
    p.add_argument("--keys", type=int, default=40)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--workdir", help="keep the files here (default: a temporary directory)")
    args = p.parse_args(argv)
    workdir = (
        Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="keyshared-demo-"))
    )
    try:
        s = run_demo(workdir, events=args.events, keys=args.keys, master=args.master)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    ok = s["audit"]["ok"] and s["aggregates_match"] and s["compacted_topic_matches"]
    print()
    print("keyshared demo")
    print(f"  broker {s['broker']}; Spark ready after {s['spark_ready_s']} s")
    print(f"  produced {s['produced']} events over {s['keys']} keys to a 2-partition topic")
    print(f"  Key_Shared consumers (c3 joined, c1 left): {s['processed_by']}")
    print("  " + s["audit_text"].replace("\n", "\n  "))
    print(f"  streaming aggregates per key == produced events: {s['aggregates_match']}")
    print(f"  compacted output topic == aggregates: {s['compacted_topic_matches']}")
    print(
        f"  {'OK' if ok else 'FAILED'} in {s['total_s']} s (streaming done after "
        f"{s['streaming_done_s']} s, {s['stream_batches']} micro-batches)"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
