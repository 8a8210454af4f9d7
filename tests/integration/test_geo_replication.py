"""Geo-replication between two real brokers, each its own cluster, as Pulsar clusters do it.

Two standalone processes (clusters ``ca`` and ``cb``) register each other with
``PUT /admin/v2/clusters``, allow both on tenant ``geo`` and replicate namespace ``geo/ns`` both
ways with deduplication on, as Pulsar's geo-replication guide sets it up. Messages are published
with the official client on ``ca`` and read on ``cb`` with it. About 30 s on ``-n 0``.
"""

from __future__ import annotations

import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pulsar
import pytest

from tests.broker_process import BrokerProcess
from tests.integration.admin_support import ok
from tests.integration.geo_support import client as _client
from tests.integration.geo_support import drain, replicating

pytestmark = pytest.mark.integration

NS = "geo/ns"


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    with replicating({"ca": {}, "cb": {}}, NS) as brokers:
        yield brokers["ca"], brokers["cb"]


def _topic() -> str:
    return f"persistent://{NS}/t-{uuid.uuid4().hex[:10]}"


def _subscribe(b: BrokerProcess, topic: str) -> None:
    """Create the durable subscription ``audit`` on ``b`` (what it holds survives restarts:
    without a subscription or retention, consumed ledgers are trimmed, as in Pulsar)."""
    client = _client(b)
    try:
        client.subscribe(topic, "audit").close()
    finally:
        client.close()


def _read_all(b: BrokerProcess, topic: str, expect: int, timeout: float = 30.0) -> list[Any]:
    """Every message of ``topic`` on ``b`` (subscription ``audit``) once at least ``expect``
    are there, then a short quiet period to catch extra ones."""
    client = _client(b)
    try:
        consumer = client.subscribe(
            topic, "audit", initial_position=pulsar.InitialPosition.Earliest
        )
        return drain(consumer, expect, timeout)
    finally:
        client.close()


def _wait(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_admin_checks_clusters_and_tenants(pair: tuple[BrokerProcess, BrokerProcess]) -> None:
    a, _ = pair
    path = f"/admin/v2/namespaces/{NS}/replication"
    assert sorted(ok(a, "GET", path)) == ["ca", "cb"]
    status, body = a.admin("POST", path, ["ca", "nowhere"])
    assert status == 412 and "nowhere" in body["reason"]
    ok(a, "PUT", "/admin/v2/tenants/solo", {"allowedClusters": ["ca"]})
    ok(a, "PUT", "/admin/v2/namespaces/solo/ns", {})
    status, body = a.admin("POST", "/admin/v2/namespaces/solo/ns/replication", ["ca", "cb"])
    assert status == 403
    assert body["reason"] == (
        "Cluster cb is not in the list of allowed clusters list for tenant [solo]"
    )
    status, _ = a.admin("PUT", "/admin/v2/namespaces/solo/other", {"replication_clusters": ["cb"]})
    assert status == 403


def test_messages_arrive_intact_in_order_and_never_loop(
    pair: tuple[BrokerProcess, BrokerProcess],
) -> None:
    a, b = pair
    topic = _topic()
    _subscribe(b, topic)
    client = _client(a)
    try:
        producer = client.create_producer(topic, producer_name="app-1", batching_enabled=False)
        for i in range(30):
            producer.send(
                f"m{i}".encode(),
                partition_key=f"k{i % 3}",
                ordering_key=f"o{i % 2}",
                properties={"i": str(i)},
                event_timestamp=1_000_000 + i,
            )
        # Kept here: one message for this cluster only, one for the other explicitly.
        producer.send(b"local-only", disable_replication=True)
        producer.send(b"only-ca", replication_clusters=["ca"])
        producer.send(b"to-cb", replication_clusters=["cb"])
        batching = client.create_producer(
            topic, producer_name="app-2", batching_enabled=True, batching_max_messages=10
        )
        for i in range(20):
            batching.send_async(f"b{i}".encode(), None, partition_key=f"k{i % 3}")
        batching.flush()
    finally:
        client.close()
    got = _read_all(b, topic, 51)
    datas = [m.data() for m in got]
    assert b"local-only" not in datas and b"only-ca" not in datas
    assert datas.count(b"to-cb") == 1
    plain = [m for m in got if m.data().startswith(b"m")]
    assert [m.data() for m in plain] == [f"m{i}".encode() for i in range(30)]
    for i, m in enumerate(plain):
        assert m.partition_key() == f"k{i % 3}"
        assert m.properties() == {"i": str(i)}
        assert m.ordering_key() == f"o{i % 2}"
        assert m.event_timestamp() == 1_000_000 + i
        assert m.producer_name() == "app-1"
    batched = [m.data() for m in got if m.data().startswith(b"b")]
    assert batched == [f"b{i}".encode() for i in range(20)]
    assert len(got) == 51
    # Nothing comes back to ca: it holds what it stored, once.
    back = _read_all(a, topic, 53, timeout=10)
    assert len(back) == 53
    # The publish time is the original one, and batches arrive as they were stored (not
    # re-batched): the same messages share an entry on both sides.
    published = {m.data(): m.publish_timestamp() for m in back}
    assert all(m.publish_timestamp() == published[m.data()] for m in got)

    def entries(msgs: list[Any]) -> list[list[bytes]]:
        runs: dict[tuple[int, int], list[bytes]] = {}
        for m in msgs:
            if m.data().startswith(b"b"):
                mid = m.message_id()
                runs.setdefault((mid.ledger_id(), mid.entry_id()), []).append(m.data())
        return list(runs.values())

    assert entries(got) == entries(back)
    assert max(len(run) for run in entries(got)) > 1
    stats = ok(a, "GET", f"/admin/v2/persistent/{topic[len('persistent://') :]}/stats")
    rep = stats["replication"]["cb"]
    assert rep["connected"] is True and rep["replicationBacklog"] == 0
    assert rep["msgOutCount"] == 51
    with urllib.request.urlopen(a.web_url + "/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    labels = f'namespace="{NS}",remote_cluster="cb",topic="{topic}"'
    for line in (
        f'pulsar_replication_backlog{{cluster="ca",{labels}}} 0.0',
        f'pulsar_replication_connected_count{{cluster="ca",{labels}}} 1.0',
    ):
        assert line in metrics
    internal = ok(a, "GET", f"/admin/v2/persistent/{topic[len('persistent://') :]}/internalStats")
    assert "pulsar.repl.cb" in internal["cursors"]
    remote = ok(b, "GET", f"/admin/v2/persistent/{topic[len('persistent://') :]}/stats")
    assert remote["replication"]["ca"]["inboundConnection"]
    assert remote["replication"]["ca"]["msgInCount"] == 51
    names = [p["producerName"] for p in remote["publishers"]]
    assert names == ["pulsar.repl.ca-->cb"]
    # The replicators' cursor names are reserved.
    client = _client(a)
    try:
        with pytest.raises(pulsar.PulsarException):
            client.subscribe(topic, "pulsar.repl.x")
    finally:
        client.close()


def test_remote_down_then_back_gets_everything_once(
    pair: tuple[BrokerProcess, BrokerProcess],
) -> None:
    a, b = pair
    topic = _topic()
    path = f"/admin/v2/persistent/{topic[len('persistent://') :]}/stats"
    _subscribe(b, topic)
    client = _client(a)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"before")
        _wait(lambda: ok(a, "GET", path)["replication"]["cb"]["replicationBacklog"] == 0)
        b.stop()
        for i in range(40):
            producer.send(f"m{i}".encode(), partition_key=f"k{i % 4}")
        _wait(lambda: not ok(a, "GET", path)["replication"]["cb"]["connected"])
        assert ok(a, "GET", path)["replication"]["cb"]["replicationBacklog"] == 40
        b.start(same_ports=True)
    finally:
        client.close()
    got = [m.data() for m in _read_all(b, topic, 41)]
    assert got == [b"before"] + [f"m{i}".encode() for i in range(40)]
    _wait(lambda: ok(a, "GET", path)["replication"]["cb"]["connected"])


def test_local_broker_killed_mid_stream_each_message_once_at_remote(
    pair: tuple[BrokerProcess, BrokerProcess],
) -> None:
    a, b = pair
    topic = _topic()
    _subscribe(b, topic)
    _subscribe(a, topic)
    confirmed: list[bytes] = []
    lock = threading.Lock()
    client = _client(a)
    # Two producers: their sequence ids overlap, so the remote must tell the replicator's
    # resends apart by the original producer's name.
    producers = [
        client.create_producer(
            topic, batching_enabled=True, batching_max_messages=20, batching_max_publish_delay_ms=2
        )
        for _ in range(2)
    ]

    def done(res: pulsar.Result, _msg_id: Any, data: bytes) -> None:
        if res == pulsar.Result.Ok:
            with lock:
                confirmed.append(data)

    sent = 0
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with lock:
                if len(confirmed) >= 300:
                    break
            data = f"m{sent}".encode()
            producers[(sent // 5) % 2].send_async(
                data, lambda r, m, d=data: done(r, m, d), partition_key=f"k{sent % 5}"
            )
            sent += 1
            if sent % 50 == 0:
                time.sleep(0.02)
        # SIGKILL while sends and replication are both in flight.
        a.kill()
    finally:
        client.close()
    with lock:
        ok_sent = list(confirmed)
    assert len(ok_sent) >= 300
    a.start(same_ports=True)
    got = [m.data() for m in _read_all(b, topic, len(ok_sent), timeout=40)]
    assert len(got) == len(set(got)), "a message arrived twice"
    assert set(ok_sent) <= set(got)
    # The remote holds what the local cluster stored, in its order (so per key too).
    assert got == [m.data() for m in _read_all(a, topic, len(got), timeout=10)]


def test_partitioned_topic_replicates_partition_by_partition(
    pair: tuple[BrokerProcess, BrokerProcess],
) -> None:
    a, b = pair
    topic = _topic()
    rest = f"/admin/v2/persistent/{topic[len('persistent://') :]}"
    # Without a shared configuration store the partitioned topic is created on both clusters.
    for x in (a, b):
        ok(x, "PUT", rest + "/partitions", 2)
    _subscribe(b, topic)
    client = _client(a)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(20):
            producer.send(f"m{i}".encode(), partition_key=f"k{i % 4}")
    finally:
        client.close()
    got = _read_all(b, topic, 20)
    assert sorted(m.data() for m in got) == sorted(f"m{i}".encode() for i in range(20))
    for k in range(4):
        of_key = [int(m.data()[1:]) for m in got if m.partition_key() == f"k{k}"]
        assert of_key == sorted(of_key)
    # Each partition has its own replicator (and cursor pulsar.repl.cb).
    out = [
        ok(a, "GET", f"{rest}-partition-{i}/stats")["replication"]["cb"]["msgOutCount"]
        for i in range(2)
    ]
    assert sum(out) == 20
    merged = ok(a, "GET", f"{rest}/partitioned-stats")["replication"]["cb"]
    assert merged["msgOutCount"] == 20 and merged["replicationBacklog"] == 0
    assert merged["connected"] is True


def test_topic_level_replication_policy_overrides_the_namespace(
    pair: tuple[BrokerProcess, BrokerProcess],
) -> None:
    a, b = pair
    for x in (a, b):
        if x.admin("GET", "/admin/v2/namespaces/geo/plain")[0] == 404:
            ok(x, "PUT", "/admin/v2/namespaces/geo/plain", {})
    # A namespace that does not replicate, one topic of it that does.
    on = f"persistent://geo/plain/t-{uuid.uuid4().hex[:10]}"
    # A namespace that replicates, one topic of it kept local.
    off = _topic()
    rest_on = f"/admin/v2/persistent/{on[len('persistent://') :]}"
    rest_off = f"/admin/v2/persistent/{off[len('persistent://') :]}"
    for t in (on, off):
        _subscribe(b, t)
        _subscribe(a, t)
    assert a.admin("GET", rest_on + "/replication") == (200, None)
    assert ok(a, "GET", rest_on + "/replication?applied=true") == ["ca"]
    status, body = a.admin("POST", rest_on + "/replication", ["ca", "nowhere"])
    assert status == 412 and "nowhere" in body["reason"]
    assert a.admin("POST", rest_on + "/replication", [])[0] == 412
    ok(a, "POST", rest_on + "/replication", ["cb", "ca"])
    assert ok(a, "GET", rest_on + "/replication") == ["ca", "cb"]
    ok(a, "POST", rest_off + "/replication", ["ca"])
    assert ok(a, "GET", rest_off + "/replication?applied=true") == ["ca"]
    client = _client(a)
    try:
        for t in (on, off):
            producer = client.create_producer(t, batching_enabled=False)
            for i in range(5):
                producer.send(f"m{i}".encode())
    finally:
        client.close()
    assert len(_read_all(b, on, 5)) == 5
    assert _read_all(b, off, 0, timeout=3) == []
    # No replicator towards cb (what stats show of cb is cb's replicator producing here).
    assert "pulsar.repl.cb" not in ok(a, "GET", rest_off + "/internalStats")["cursors"]
    assert ok(a, "GET", rest_off + "/stats")["replication"]["cb"]["connected"] is False
    # Falling back to the namespace's policy: the kept messages follow.
    ok(a, "DELETE", rest_off + "/replication")
    assert a.admin("GET", rest_off + "/replication") == (200, None)
    assert len(_read_all(b, off, 0, timeout=3)) == 0  # the cursor starts at the end, as Pulsar's
    client = _client(a)
    try:
        client.create_producer(off, batching_enabled=False).send(b"after")
    finally:
        client.close()
    assert [m.data() for m in _read_all(b, off, 1)] == [b"after"]


def test_remote_broker_killed_mid_stream_each_message_once(
    pair: tuple[BrokerProcess, BrokerProcess],
) -> None:
    a, b = pair
    topic = _topic()
    rest = f"/admin/v2/persistent/{topic[len('persistent://') :]}"
    _subscribe(b, topic)
    _subscribe(a, topic)
    client = _client(a)
    producers = [
        client.create_producer(
            topic, batching_enabled=True, batching_max_messages=10, batching_max_publish_delay_ms=2
        )
        for _ in range(2)
    ]
    failed: list[pulsar.Result] = []

    def publish() -> None:
        for i in range(400):
            producers[(i // 7) % 2].send_async(
                f"m{i}".encode(),
                lambda r, _m: failed.append(r) if r != pulsar.Result.Ok else None,
                partition_key=f"k{i % 5}",
            )
            if i % 20 == 19:
                time.sleep(0.02)
        for p in producers:
            p.flush()

    try:
        thread = threading.Thread(target=publish)
        thread.start()
        # SIGKILL the remote while the replicator streams to it.
        _wait(lambda: b.admin("GET", rest + "/stats")[1]["msgInCounter"] >= 50)
        b.kill()
        thread.join(30)
        assert not failed
    finally:
        client.close()
    b.start(same_ports=True)
    got = [m.data() for m in _read_all(b, topic, 400, timeout=40)]
    assert len(got) == 400 and len(set(got)) == 400
    assert got == [m.data() for m in _read_all(a, topic, 400, timeout=10)]


def test_unloaded_topic_goes_on_replicating(pair: tuple[BrokerProcess, BrokerProcess]) -> None:
    a, b = pair
    for x in (a, b):
        if x.admin("GET", "/admin/v2/namespaces/geo/plain")[0] == 404:
            ok(x, "PUT", "/admin/v2/namespaces/geo/plain", {})
    # One way only (nothing comes back from cb to load the topic on ca).
    topic = f"persistent://geo/plain/t-{uuid.uuid4().hex[:10]}"
    rest = f"/admin/v2/persistent/{topic[len('persistent://') :]}"
    _subscribe(b, topic)
    _subscribe(a, topic)
    ok(a, "POST", rest + "/replication", ["ca", "cb"])
    client = _client(a)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"m0")
        _wait(lambda: ok(a, "GET", rest + "/stats")["replication"]["cb"]["replicationBacklog"] == 0)
        b.stop()
        producer.send(b"m1")
    finally:
        client.close()
    ok(a, "PUT", rest + "/unload")
    b.start(same_ports=True)
    # No client touches the topic on ca any more: its replicator still delivers m1.
    assert [m.data() for m in _read_all(b, topic, 2)] == [b"m0", b"m1"]
    # Nor after a restart of ca: it loads its replicated topics itself.
    b.stop()
    client = _client(a)
    try:
        client.create_producer(topic, batching_enabled=False).send(b"m2")
    finally:
        client.close()
    a.stop()
    b.start(same_ports=True)
    a.start(same_ports=True)
    assert [m.data() for m in _read_all(b, topic, 1)] == [b"m2"]


def test_partitioned_topic_missing_on_the_remote_is_created_there(
    pair: tuple[BrokerProcess, BrokerProcess],
) -> None:
    a, b = pair
    ns = "geo/auto"
    for x in (a, b):
        if x.admin("GET", f"/admin/v2/namespaces/{ns}")[0] == 404:
            # Retention: what reaches cb before anyone subscribes there is kept to be read.
            ok(x, "PUT", f"/admin/v2/namespaces/{ns}", {"deduplicationEnabled": True})
            ok(x, "POST", f"/admin/v2/namespaces/{ns}/replication", ["ca", "cb"])
            retention = {"retentionTimeInMinutes": 60, "retentionSizeInMB": 100}
            ok(x, "POST", f"/admin/v2/namespaces/{ns}/retention", retention)
    topic = f"persistent://{ns}/t-{uuid.uuid4().hex[:10]}"
    rest = f"/admin/v2/persistent/{topic[len('persistent://') :]}"
    # Created on ca only: the replicators create it on cb with the same partitions.
    ok(a, "PUT", rest + "/partitions", 3)
    client = _client(a)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(30):
            producer.send(f"m{i}".encode(), partition_key=f"k{i % 5}")
    finally:
        client.close()
    _wait(
        lambda: (
            ok(a, "GET", rest + "/partitioned-stats")["replication"]["cb"]["replicationBacklog"]
            == 0
        ),
        30,
    )
    assert ok(b, "GET", rest + "/partitions") == {"partitions": 3}
    got = _read_all(b, topic, 30)
    assert sorted(m.data() for m in got) == sorted(f"m{i}".encode() for i in range(30))
    for k in range(5):
        of_key = [int(m.data()[1:]) for m in got if m.partition_key() == f"k{k}"]
        assert of_key == sorted(of_key)

    # A different shape on the remote: nothing is written there, the replicator waits.
    other = f"persistent://{ns}/t-{uuid.uuid4().hex[:10]}"
    rest_other = f"/admin/v2/persistent/{other[len('persistent://') :]}"
    ok(b, "PUT", rest_other + "/partitions", 2)
    ok(a, "PUT", rest_other + "/partitions", 3)
    client = _client(a)
    try:
        client.create_producer(other, batching_enabled=False).send(b"x", partition_key="k")
    finally:
        client.close()
    time.sleep(2.0)
    merged = ok(a, "GET", rest_other + "/partitioned-stats")["replication"]["cb"]
    assert merged["connected"] is False and merged["replicationBacklog"] == 1
    assert ok(b, "GET", rest_other + "/partitioned-stats")["msgInCounter"] == 0
