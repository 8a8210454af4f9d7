"""``GET /metrics``: Pulsar's names and labels, parsed with prometheus-client's own parser."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pulsar
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.broker_process import BrokerProcess, running_broker
from tests.integration.conftest import make_client

pytestmark = pytest.mark.integration

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(broker: BrokerProcess) -> tuple[str, Samples, dict[str, str]]:
    """The body, samples by metric name, and each family's type."""
    with urllib.request.urlopen(broker.web_url + "/metrics", timeout=10) as resp:
        assert resp.status == 200
        content_type = resp.headers["Content-Type"]
        text = resp.read().decode()
    assert content_type.startswith("text/plain") and "version=0.0.4" in content_type
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return text, samples, types


def one(samples: Samples, name: str, **labels: str) -> float:
    """The value of the single sample of ``name`` whose labels include ``labels``."""
    found = [v for lab, v in samples.get(name, []) if labels.items() <= lab.items()]
    assert len(found) == 1, f"{name} {labels}: {found} (all: {samples.get(name)})"
    return found[0]


def labels_of(samples: Samples, name: str, topic: str) -> list[set[str]]:
    return [set(lab) for lab, _ in samples.get(name, []) if lab.get("topic") == topic]


def stats(broker: BrokerProcess, topic: str) -> dict[str, Any]:
    status, body = broker.admin(
        "GET", "/admin/v2/persistent/" + topic[len("persistent://") :] + "/stats"
    )
    assert status == 200, body
    return body  # type: ignore[no-any-return]


def test_topic_and_subscription_metrics_match_the_stats(
    broker: BrokerProcess, client: pulsar.Client, topic: str
) -> None:
    c1 = client.subscribe(
        topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared, consumer_name="m-c1"
    )
    shared = client.subscribe(topic, "sh", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(40):
        producer.send(f"payload-{i:03d}".encode(), partition_key=f"k{i % 16}")
    for _ in range(40):
        c1.receive(timeout_millis=5000)  # held: c1 keeps every key
    for _ in range(10):
        shared.acknowledge(shared.receive(timeout_millis=5000))
    c2 = client.subscribe(
        topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared, consumer_name="m-c2"
    )
    deadline = time.monotonic() + 10
    st = stats(broker, topic)
    while not st["subscriptions"]["ks"]["drainingHashesCount"] or (
        st["subscriptions"]["sh"]["msgBacklog"] != 30
    ):
        assert time.monotonic() < deadline, st
        time.sleep(0.05)
        st = stats(broker, topic)

    text, samples, types = scrape(broker)
    base = {"cluster": "standalone", "namespace": "public/default", "topic": topic}
    assert all(t == "gauge" for n, t in types.items() if n.startswith("pulsar_")), types
    for name in ("pulsar_in_messages_total", "pulsar_storage_size", "pulsar_msg_backlog"):
        assert labels_of(samples, name, topic) == [set(base)], name
    assert (
        labels_of(samples, "pulsar_subscription_back_log", topic)
        == [set(base) | {"subscription"}] * 2
    )

    assert one(samples, "pulsar_in_messages_total", **base) == 40 == st["msgInCounter"]
    assert one(samples, "pulsar_in_bytes_total", **base) == st["bytesInCounter"] > 0
    assert one(samples, "pulsar_storage_size", **base) == st["storageSize"] > 0
    assert one(samples, "pulsar_msg_backlog", **base) == 40 + 30
    assert one(samples, "pulsar_subscriptions_count", **base) == 2
    assert one(samples, "pulsar_producers_count", **base) == 1
    assert one(samples, "pulsar_consumers_count", **base) == 3
    assert one(samples, "pulsar_rate_in", **base) > 0
    assert one(samples, "pulsar_average_msg_size", **base) == pytest.approx(
        st["bytesInCounter"] / 40
    )

    ks = st["subscriptions"]["ks"]
    sub_ks = {**base, "subscription": "ks"}
    sub_sh = {**base, "subscription": "sh"}
    assert one(samples, "pulsar_subscription_back_log", **sub_ks) == 40 == ks["msgBacklog"]
    assert one(samples, "pulsar_subscription_back_log", **sub_sh) == 30
    assert one(samples, "pulsar_subscription_unacked_messages", **sub_ks) == 40
    # The Shared consumer's receiver queue holds the 30 it has not acked yet.
    assert one(samples, "pulsar_subscription_unacked_messages", **sub_sh) == 30
    assert one(samples, "pulsar_out_messages_total", **sub_ks) == ks["msgOutCounter"] == 40
    assert one(samples, "pulsar_out_bytes_total", **sub_ks) == ks["bytesOutCounter"] > 0
    assert one(samples, "pulsar_subscription_consumers_count", **sub_ks) == 2
    assert one(samples, "pulsar_subscription_msg_ack_rate", **sub_sh) > 0
    assert one(samples, "pulsar_subscription_blocked_on_unacked_messages", **sub_ks) == 0

    # The PIP-379 draining hashes of the Key_Shared subscription, and only of it.
    assert (
        one(samples, "pulsar_subscription_draining_hashes_count", **sub_ks)
        == (ks["drainingHashesCount"])
    )
    assert ks["drainingHashesCount"] > 0
    assert (
        one(samples, "pulsar_subscription_draining_hashes_unacked_messages", **sub_ks)
        == (ks["drainingHashesUnackedMessages"])
    )
    assert one(samples, "pulsar_subscription_draining_hashes_cleared_total", **sub_ks) == 0
    assert labels_of(samples, "pulsar_subscription_draining_hashes_count", topic) == [set(sub_ks)]

    # Consumer-level series are off by default, as in Pulsar.
    assert not any(name.startswith("pulsar_consumer_") for name in samples)
    assert one(samples, "pulsar_topics_count", cluster="standalone", namespace="public/default")
    assert "process_cpu_seconds_total" in samples or "python_info" in samples
    assert "/metrics/" not in text

    # Acks clear the draining hashes; a new scrape shows it.
    c2.close()
    c1.close()
    deadline = time.monotonic() + 10
    while True:
        _, samples, _ = scrape(broker)
        if one(samples, "pulsar_subscription_draining_hashes_count", **sub_ks) == 0:
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert one(samples, "pulsar_subscription_consumers_count", **sub_ks) == 0


def test_consumer_level_metrics_when_switched_on(fresh_broker: BrokerProcess, topic: str) -> None:
    fresh_broker.conf["exposeConsumerLevelMetricsInPrometheus"] = "true"
    fresh_broker.conf["exposeProducerLevelMetricsInPrometheus"] = "true"
    broker = fresh_broker.start()
    client = make_client(broker.service_url)
    try:
        consumer = client.subscribe(
            topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared, consumer_name="cl-1"
        )
        producer = client.create_producer(topic, producer_name="pl-1", batching_enabled=False)
        for i in range(5):
            producer.send(b"x", partition_key=str(i))
        for _ in range(5):
            consumer.receive(timeout_millis=5000)
        _, samples, _ = scrape(broker)
        c_labels = {"topic": topic, "subscription": "ks", "consumer_name": "cl-1"}
        assert one(samples, "pulsar_consumer_unacked_messages", **c_labels) == 5
        assert one(samples, "pulsar_out_messages_total", **c_labels) == 5
        assert one(samples, "pulsar_consumer_draining_hashes_count", **c_labels) == 0
        assert one(samples, "pulsar_producer_msg_rate_in", topic=topic, producer_name="pl-1") > 0
    finally:
        client.close()


def _get(url: str, bearer: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url)
    if bearer:
        req.add_header("Authorization", f"Bearer {bearer}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_operator_surface_behind_tokens(tmp_path: Path) -> None:
    """With authentication on: /metrics and the dashboard's snapshot need a super user's token,
    the page itself is public, and `keyshared perf` gets in with --auth-params."""
    import jwt

    secret = os.urandom(32)
    key_file = tmp_path / "secret.key"
    key_file.write_bytes(secret)

    def token(role: str) -> str:
        return jwt.encode({"sub": role}, secret, algorithm="HS256")

    conf = {
        "authenticationEnabled": "true",
        "authenticationProviders": (
            "org.apache.pulsar.broker.authentication.AuthenticationProviderToken"
        ),
        "tokenSecretKey": f"file://{key_file}",
        "authorizationEnabled": "true",
        "superUserRoles": "admin",
        "brokerClientAuthenticationPlugin": "org.apache.pulsar.client.impl.auth.AuthenticationToken",
        "brokerClientAuthenticationParameters": f"token:{token('admin')}",
    }
    topic = "persistent://public/default/behind-tokens"
    with running_broker(conf=conf) as broker:
        web = broker.web_url
        assert _get(web + "/metrics")[0] == 401
        assert _get(web + "/metrics", token("alice"))[0] == 403
        assert _get(web + "/dashboard/api/overview")[0] == 401
        assert _get(web + "/dashboard/api/overview", token("alice"))[0] == 403
        status, page = _get(web + "/")
        assert status == 200 and b"keyshared" in page
        assert _get(web + "/assets/dashboard.js")[0] == 200

        base = [sys.executable, "-m", "keyshared.cli", "perf", "produce", "-u"]
        base += [broker.service_url, "-r", "0", "-m", "50", "-s", "10"]
        run = subprocess.run(
            [*base, "--auth-params", f"token:{token('admin')}", "--json-out", "-", topic],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout)["messages"] == 50

        status, body = _get(web + "/metrics", token("admin"))
        assert status == 200
        families = {f.name: f for f in text_string_to_metric_families(body.decode())}
        assert one(_samples(families), "pulsar_in_messages_total", topic=topic) == 50
        status, body = _get(web + "/dashboard/api/overview", token("admin"))
        assert status == 200
        assert [t["name"] for t in json.loads(body)["topics"]] == [topic]


def _samples(families: dict[str, Any]) -> Samples:
    out: Samples = {}
    for family in families.values():
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out
