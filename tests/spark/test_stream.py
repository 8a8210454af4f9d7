"""Streaming reads: admission control, exactly-once across a killed and restarted query."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from tests.broker_process import BrokerProcess
from tests.spark.conftest import admin_path, produce, seq_of
from tests.spark.stream_job import start_copy

ROOT = Path(__file__).resolve().parents[2]


def _read_all(spark: Any, broker: BrokerProcess, topic: str) -> list[Any]:
    return (
        spark.read.format("keyshared")
        .option("service.url", broker.service_url)
        .option("admin.url", broker.web_url)
        .option("topic", topic)
        .load()
        .select("__key", "value", "__partition", "__ledgerId", "__entryId", "__batchIndex")
        .collect()
    )


def test_exactly_once_after_kill(
    spark: Any, dedup_broker: BrokerProcess, client_factory: Any, new_topic: Any, tmp_path: Path
) -> None:
    """A streaming copy SIGKILLed mid-run and restarted from its checkpoint: the output topic
    holds every input message exactly once, each key's messages in order."""
    broker = dedup_broker
    source, sink = new_topic("src"), new_topic("dst")
    for t in (source, sink):
        assert broker.admin("PUT", admin_path(t) + "/partitions", 2)[0] == 204
    client = client_factory(broker)
    sent = produce(client, source, 2400, batching=False)
    checkpoint = str(tmp_path / "ckpt")
    args = [broker.service_url, broker.web_url, source, sink, checkpoint, "200"]
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    log = open(tmp_path / "job.log", "wb")  # noqa: SIM115 - closed below
    job = subprocess.Popen(
        [sys.executable, "-m", "tests.spark.stream_job", *args],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        commits = Path(checkpoint) / "commits"
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            done = [p for p in commits.glob("[0-9]*")] if commits.exists() else []
            if len(done) >= 3:
                break
            assert job.poll() is None, (tmp_path / "job.log").read_text(errors="replace")[-3000:]
            time.sleep(0.05)
        else:
            raise AssertionError("the job committed no 3 batches in time")
        time.sleep(0.15)  # most likely inside a micro-batch now
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(10)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        log.close()
    committed = len(list((Path(checkpoint) / "commits").glob("[0-9]*")))
    planned = len(list((Path(checkpoint) / "offsets").glob("[0-9]*")))
    written_at_kill = len(_read_all(spark, broker, sink))
    assert 0 < written_at_kill < len(sent)

    sent += produce(client, source, 300, batching=False, prefix="late")
    query = start_copy(spark, args, available_now=True, predefinedSubscription="copy-progress")
    query.awaitTermination(240)
    assert query.exception() is None, query.exception()
    progress = query.recentProgress
    assert progress and max(p["numInputRows"] for p in progress) <= 200  # maxRecordsPerBatch

    rows = _read_all(spark, broker, sink)
    got = [r["value"] for r in rows]
    assert len(got) == len(set(got)), f"{len(got) - len(set(got))} duplicates"
    assert sorted(got) == sorted(v for _, v in sent), "lost or foreign rows"
    last: dict[str, int] = defaultdict(int)
    for r in sorted(
        rows, key=lambda r: (r["__partition"], r["__ledgerId"], r["__entryId"], r["__batchIndex"])
    ):
        key, n = seq_of(r["value"])
        assert n == last[key] + 1, (key, n, last[key])
        last[key] = n
    # The tracking subscription follows the committed batches (one behind, by design).
    subs = broker.admin("GET", admin_path(source) + "-partition-0/subscriptions")[1]
    assert "copy-progress" in subs
    print(
        f"kill after {committed} committed / {planned} planned batches, "
        f"{written_at_kill} rows out; restart ran {len(progress)} batches"
    )
