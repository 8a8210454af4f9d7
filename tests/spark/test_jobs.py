"""The ready-made jobs: audit (Spark and plain Python agree), backlog, compact, and the CLI."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pulsar

from keyshared.spark.audit import audit, audit_events
from keyshared.spark.backlog import backlog
from keyshared.spark.cli import main as spark_cli
from keyshared.spark.compact import compact
from keyshared.spark.consumption_log import read_events
from keyshared.spark.demo import KeySharedWorker, produce_events
from tests.broker_process import BrokerProcess
from tests.spark.conftest import admin_path, produce

COUNTS = ("received", "acked", "order_violations", "overlaps", "lost", "duplicates",
          "redelivered", "sticky_violations", "topic_messages")  # fmt: skip


def _topic_df(spark: Any, broker: BrokerProcess, topic: str) -> Any:
    return (
        spark.read.format("keyshared")
        .option("service.url", broker.service_url)
        .option("admin.url", broker.web_url)
        .option("topic", topic)
        .load()
    )


def _same(a: Any, b: Any) -> None:
    assert {k: getattr(a, k) for k in COUNTS} == {k: getattr(b, k) for k in COUNTS}


def test_audit_of_key_shared_consumers(
    spark: Any, broker: BrokerProcess, client: Any, new_topic: Any, tmp_path: Path
) -> None:
    """AUTO_SPLIT consumers with a join and a leave, and two STICKY consumers: the broker keeps
    every rule; a tampered log breaks each one, and Spark and plain Python agree throughout."""
    topic = new_topic("audit")
    assert broker.admin("PUT", admin_path(topic) + "/partitions", 2)[0] == 204
    logs = tmp_path / "logs"
    auto = [KeySharedWorker(client, topic, "auto", f"a{i}", logs).started() for i in (1, 2)]
    sticky = [
        KeySharedWorker(client, topic, "sticky", "s1", logs, sticky_ranges=[(0, 32767)]).started(),
        KeySharedWorker(
            client, topic, "sticky", "s2", logs, sticky_ranges=[(32768, 65535)]
        ).started(),
    ]
    produce_events(client, topic, 300, 12, seconds=0.6)
    auto.append(KeySharedWorker(client, topic, "auto", "a3", logs).started())
    auto[0].leave()
    produce_events(client, topic, 300, 12, seconds=0.6, seed=8)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if sum(w.processed for w in auto) >= 600 and sum(w.processed for w in sticky) >= 600:
            break
        time.sleep(0.05)
    for w in auto + sticky:
        w.leave()
        assert w.error is None, w.error
    topic_df = _topic_df(spark, broker, topic).cache()
    ids = [
        tuple(r)
        for r in topic_df.select("__topic", "__ledgerId", "__entryId", "__batchIndex").collect()
    ]
    events = read_events(sorted(logs.glob("*.jsonl")))
    report = audit(spark, str(logs), topic_df=topic_df, subscription="auto")
    assert report.ok, report.summary()
    assert report.lost == 0 and report.topic_messages == 600 and report.acked == 600
    assert report.consumers == ["a1", "a2", "a3"]
    _same(report, audit_events(events, ids, subscription="auto"))
    clean_sticky = audit_events(events, ids, subscription="sticky")
    assert clean_sticky.ok and clean_sticky.acked == 600, clean_sticky.summary()

    # Tamper: one consumer gets a key's newer message before an older one, a second ack, a
    # message nobody acked, a STICKY receipt outside its consumer's range.
    bad = [dict(e) for e in events if e["subscription"] == "sticky"]
    s1 = [e for e in bad if e["consumer"] == "s1" and e["ev"] == "recv"]
    first, later = s1[0], next(e for e in s1[1:] if e["key"] == s1[0]["key"])
    first["ts"], later["ts"] = later["ts"], first["ts"]
    acks = [e for e in bad if e["ev"] == "ack"]
    bad.append({**acks[5], "ts": acks[5]["ts"] + 0.001})
    bad.remove(acks[7])
    joins = [e for e in bad if e["ev"] == "join" and e["consumer"] == "s2"]
    joins[0]["ranges"] = [[32768, 40000]]
    path = tmp_path / "bad" / "all.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(e) + "\n" for e in bad))
    report = audit(spark, str(path), topic_df=topic_df, subscription="sticky")
    expect = audit_events(bad, ids, subscription="sticky")
    _same(report, expect)
    assert report.order_violations >= 1 and report.duplicates == 1 and report.lost == 1
    assert report.sticky_violations > 0 and not report.ok
    topic_df.unpersist()

    # The CLI, without Spark: the clean logs pass (exit 0), the tampered ones fail (exit 1).
    assert spark_cli(["audit", "--no-spark", "--logs", str(logs), "--subscription", "auto"]) == 0
    assert spark_cli(["audit", "--no-spark", "--logs", str(path), "--json"]) == 1


def test_backlog_and_compact(
    spark: Any, broker: BrokerProcess, client: Any, new_topic: Any, tmp_path: Path, capsys: Any
) -> None:
    topic = new_topic("kv")
    consumer = client.subscribe(topic, "slow", initial_position=pulsar.InitialPosition.Earliest)
    produce(client, topic, 70, keys=7, batching=False)
    # Tombstones for k5 and k6; k4 is set again.
    producer = client.create_producer(topic)
    for key, value in (("k5", b""), ("k6", b"x"), ("k6", b""), ("k4", b"last")):
        producer.send(value, partition_key=key)
    producer.close()
    unacked = []
    for i in range(74):
        msg = consumer.receive(5000)
        if i < 20 or i % 3 == 0:
            consumer.acknowledge(msg)
        else:
            unacked.append(msg.partition_key())
    consumer.close()
    time.sleep(1.2)  # the cursor persists acks at most once a second; admin shows the live state

    (b,) = backlog(spark, broker.service_url, broker.web_url, topic)
    assert b.subscription == "slow" and b.messages == len(unacked)
    assert {r["key"]: r["messages"] for r in b.by_key} == {
        k: unacked.count(k) for k in set(unacked)
    }
    assert b.by_age["<1m"] == len(unacked) and b.oldest_age_s is not None and b.oldest_age_s < 60

    parquet = tmp_path / "compacted"
    out = new_topic("kv-compacted")
    assert (
        compact(
            spark,
            broker.service_url,
            topic,
            admin_url=broker.web_url,
            parquet=str(parquet),
            output_topic=out,
        )
        == 5
    )
    latest = {r["__key"]: r["value"] for r in spark.read.parquet(str(parquet)).collect()}
    assert latest == {"k0": b"k0:10", "k1": b"k1:10", "k2": b"k2:10", "k3": b"k3:10", "k4": b"last"}
    assert {r["__key"]: r["value"] for r in _topic_df(spark, broker, out).collect()} == latest

    assert spark_cli(["backlog", "--service-url", broker.service_url, "--admin-url", broker.web_url,
                      "--topic", topic, "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)[0]["messages"] == len(unacked)
    assert spark_cli(["compact", "--service-url", broker.service_url, "--topic", topic]) == 2
