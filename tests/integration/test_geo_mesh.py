"""Geo-replication in a full mesh of three clusters: every message once everywhere, no loops.

Three standalone processes (clusters ``ca``, ``cb``, ``cc``) register the other two with
``PUT /admin/v2/clusters`` and replicate namespace ``geo/mesh`` to each other, deduplication on,
as Pulsar's geo-replication guide sets up a mesh without a shared configuration store. Messages
are published with the official client on every cluster, keyed, batched and not; each is named
``{origin}/{producer}/{i}`` so the audit can tell it by its original producer and sequence.

The audit, on every cluster: each message exactly once, none replicated back to its origin or
forwarded by a cluster that received it, and the messages of each origin in the order its own
cluster stored them (so per key as published). A remote cluster is then stopped with SIGSTOP
(a network partition: its sockets stay open, nothing answers), or SIGKILLed under load, and
everything converges once it is back. About 40 s on ``-n 0``.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pulsar
import pytest

from tests.broker_process import BrokerProcess
from tests.integration.admin_support import ok, tpath
from tests.integration.geo_support import client as _client
from tests.integration.geo_support import drain, replicating

pytestmark = pytest.mark.integration

NS = "geo/mesh"
CLUSTERS = ("ca", "cb", "cc")
KEYS = 4
# Short keep-alive: a partitioned peer is found out in seconds, not in a minute.
KEEPALIVE = 2

Mesh = dict[str, BrokerProcess]


@pytest.fixture(scope="module")
def mesh() -> Iterator[Mesh]:
    with replicating({c: {"keepAliveIntervalSeconds": KEEPALIVE} for c in CLUSTERS}, NS) as m:
        yield m


def _new_topic(mesh: Mesh) -> str:
    """A fresh topic, loaded on every cluster with the durable subscription ``audit`` (so its
    replicators start, their cursors at the end, and nothing is trimmed before the audit)."""
    topic = f"persistent://{NS}/t-{uuid.uuid4().hex[:10]}"
    for b in mesh.values():
        client = _client(b)
        try:
            client.subscribe(topic, "audit").close()
        finally:
            client.close()
    return topic


def _publish(
    b: BrokerProcess, topic: str, origin: str, n_plain: int, n_batched: int, tag: str = ""
) -> list[str]:
    """``n_plain`` messages unbatched and ``n_batched`` batched, keyed, on ``b``; their names
    in publish order per producer."""
    sent: list[str] = []
    client = _client(b)
    try:
        plain = client.create_producer(
            topic, producer_name=f"{origin}-u{tag}", batching_enabled=False
        )
        batched = client.create_producer(
            topic,
            producer_name=f"{origin}-b{tag}",
            batching_enabled=True,
            batching_max_messages=10,
            batching_max_publish_delay_ms=5,
            # One key a batch, as Key_Shared asks of batching producers.
            batching_type=pulsar.BatchingType.KeyBased,
        )
        for i in range(n_plain):
            name = f"{origin}/u{tag}/{i}"
            plain.send(name.encode(), partition_key=f"k{i % KEYS}")
            sent.append(name)
        failed: list[pulsar.Result] = []
        for i in range(n_batched):
            name = f"{origin}/b{tag}/{i}"
            batched.send_async(
                name.encode(),
                lambda r, _m: failed.append(r) if r != pulsar.Result.Ok else None,
                partition_key=f"k{i % KEYS}",
            )
            sent.append(name)
        batched.flush()
        assert not failed
    finally:
        client.close()
    return sent


def _read_all(b: BrokerProcess, topic: str, expect: int, timeout: float = 40.0) -> list[Any]:
    """Every message of subscription ``audit`` on ``b`` once at least ``expect`` came, then a
    quiet period to catch extra ones."""
    client = _client(b)
    try:
        return drain(client.subscribe(topic, "audit"), expect, timeout)
    finally:
        client.close()


def _held(mesh: Mesh, topic: str, expect: dict[str, int]) -> dict[str, list[str]]:
    """What each cluster holds (its ``audit`` subscription), read from all three at once."""
    with ThreadPoolExecutor(len(mesh)) as pool:
        futures = {c: pool.submit(_read_all, b, topic, expect[c]) for c, b in mesh.items()}
        return {c: _names(f.result()) for c, f in futures.items()}


def _wait(cond: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.1)


def _replication(b: BrokerProcess, topic: str) -> dict[str, Any]:
    stats = ok(b, "GET", tpath(topic, "stats"))
    return dict(stats["replication"])


def _caught_up(mesh: Mesh, topic: str) -> bool:
    for name, b in mesh.items():
        rep = _replication(b, topic)
        for other in mesh:
            if other == name:
                continue
            st = rep.get(other)
            if not st or not st["connected"] or st["replicationBacklog"] != 0:
                return False
    return True


def _origin(name: str) -> str:
    return name.split("/", 1)[0]


def _audit(held: dict[str, list[str]], expected: dict[str, set[str]]) -> None:
    """Each cluster holds exactly ``expected[cluster]``, each once, and the messages of each
    origin in the order the origin stored them (which, per producer and key, is publish
    order)."""
    for cluster, names in held.items():
        dups = {n for n in names if names.count(n) > 1}
        assert not dups, f"{cluster} holds twice: {sorted(dups)[:5]}"
        assert set(names) == expected[cluster], (
            cluster,
            sorted(expected[cluster] - set(names))[:5],
            sorted(set(names) - expected[cluster])[:5],
        )
    for origin, at_origin in held.items():
        own = [n for n in at_origin if _origin(n) == origin]
        for cluster, names in held.items():
            theirs = [n for n in names if _origin(n) == origin]
            want = [n for n in own if n in set(theirs)]
            assert theirs == want, f"{origin}'s messages out of order on {cluster}"
        # Per producer and key, the origin stored them as published (key-based batching
        # reorders across keys, never within one).
        for producer in {n.rsplit("/", 1)[0] for n in own}:
            seq = [int(n.rsplit("/", 1)[1]) for n in own if n.rsplit("/", 1)[0] == producer]
            for k in range(KEYS):
                of_key = [i for i in seq if i % KEYS == k]
                assert of_key == sorted(of_key), f"{producer} stored key k{k} out of order"


def _names(messages: list[Any]) -> list[str]:
    out = []
    for m in messages:
        name = m.data().decode()
        origin, producer, _ = name.split("/")
        # The original producer's name travels with the message.
        assert m.producer_name() == f"{origin}-{producer}", name
        out.append(name)
    return out


def test_mesh_every_message_once_everywhere_in_origin_order(mesh: Mesh) -> None:
    topic = _new_topic(mesh)
    # A Key_Shared subscription on cc, two consumers, before anything is published.
    ks_client = _client(mesh["cc"])
    ks = [
        ks_client.subscribe(
            topic,
            "ks",
            consumer_type=pulsar.ConsumerType.KeyShared,
            consumer_name=f"ks-{i}",
            receiver_queue_size=20,
        )
        for i in range(2)
    ]
    try:
        sent: dict[str, list[str]] = {}
        for c in CLUSTERS:
            sent[c] = _publish(mesh[c], topic, c, 20, 30)
        # Restricted per message: this one goes to cb, never to cc.
        client = _client(mesh["ca"])
        try:
            p = client.create_producer(topic, producer_name="ca-r", batching_enabled=False)
            p.send(b"ca/r/0", replication_clusters=["cb"])
            p.send(b"ca/r/1", disable_replication=True)
        finally:
            client.close()
        everything = {n for names in sent.values() for n in names}
        expected = {
            "ca": everything | {"ca/r/0", "ca/r/1"},
            "cb": everything | {"ca/r/0"},
            "cc": everything,
        }
        _wait(lambda: _caught_up(mesh, topic), what="replication caught up")
        held = _held(mesh, topic, {c: len(expected[c]) for c in CLUSTERS})
        _audit(held, expected)

        # Key_Shared on the remote: each key at one consumer, in its origin's order.
        per_consumer: list[list[str]] = [[], []]
        deadline = time.monotonic() + 30
        while sum(map(len, per_consumer)) < len(expected["cc"]):
            assert time.monotonic() < deadline, "Key_Shared consumers starved"
            for i, consumer in enumerate(ks):
                try:
                    m = consumer.receive(timeout_millis=100)
                except pulsar.Timeout:
                    continue
                per_consumer[i].append(m.data().decode())
                consumer.acknowledge(m)
        assert sorted(per_consumer[0] + per_consumer[1]) == sorted(expected["cc"])
        key_of = {n: int(n.rsplit("/", 1)[1]) % KEYS for n in everything}
        keys = [{key_of[n] for n in got} for got in per_consumer]
        assert not keys[0] & keys[1], "a key went to both consumers"
        for i, got in enumerate(per_consumer):
            for origin in CLUSTERS:
                theirs = [n for n in got if _origin(n) == origin]
                order = [n for n in held[origin] if n in set(theirs)]
                assert theirs == order, f"consumer {i}: {origin}'s keys out of order"
    finally:
        ks_client.close()

    # Nothing went round: each replicator sent its own cluster's messages only.
    for c in CLUSTERS:
        rep = _replication(mesh[c], topic)
        for other in CLUSTERS:
            if other == c:
                continue
            extra = 1 if (c, other) == ("ca", "cb") else 0
            assert rep[other]["msgOutCount"] == 50 + extra, (c, other, rep[other])
            assert rep[other]["msgInCount"] == 50 + (1 if (other, c) == ("ca", "cb") else 0)


def test_partitioned_cluster_catches_up_once_back(mesh: Mesh) -> None:
    topic = _new_topic(mesh)
    sent = {c: _publish(mesh[c], topic, c, 5, 10, tag="0") for c in CLUSTERS}
    _wait(lambda: _caught_up(mesh, topic), what="caught up before the partition")
    cc = mesh["cc"]
    assert cc.proc is not None
    # Cut off: its sockets stay open and silent, as behind a network partition.
    cc.proc.send_signal(signal.SIGSTOP)
    try:
        for c in ("ca", "cb"):
            sent[c] += _publish(mesh[c], topic, c, 20, 30, tag="1")
        # The others find out (keep-alive) and hold what cc has not confirmed.
        for c in ("ca", "cb"):
            _wait(
                lambda c=c: not _replication(mesh[c], topic)["cc"]["connected"],  # type: ignore[misc]
                timeout=6 * KEEPALIVE + 10,
                what=f"{c} sees cc gone",
            )
            assert _replication(mesh[c], topic)["cc"]["replicationBacklog"] > 0
        # ca and cb go on replicating between themselves meanwhile.
        _wait(
            lambda: (
                _replication(mesh["ca"], topic)["cb"]["replicationBacklog"] == 0
                and _replication(mesh["cb"], topic)["ca"]["replicationBacklog"] == 0
            ),
            what="ca and cb caught up during the partition",
        )
    finally:
        cc.proc.send_signal(signal.SIGCONT)
    _wait(lambda: _caught_up(mesh, topic), timeout=60, what="caught up after the partition")
    everything = {n for names in sent.values() for n in names}
    held = _held(mesh, topic, dict.fromkeys(CLUSTERS, len(everything)))
    _audit(held, dict.fromkeys(CLUSTERS, everything))


def test_cluster_killed_under_load_mesh_converges(mesh: Mesh) -> None:
    topic = _new_topic(mesh)
    confirmed: dict[str, list[str]] = {c: [] for c in CLUSTERS}
    lock = threading.Lock()
    stop = threading.Event()

    def load(c: str) -> None:
        client = _client(mesh[c])
        try:
            producers = [
                client.create_producer(
                    topic,
                    producer_name=f"{c}-{p}",
                    batching_enabled=True,
                    batching_max_messages=10,
                    batching_max_publish_delay_ms=2,
                    send_timeout_millis=5000,
                )
                for p in ("b", "u")
            ]

            def done(r: pulsar.Result, _m: Any, name: str) -> None:
                if r == pulsar.Result.Ok:
                    with lock:
                        confirmed[c].append(name)

            i = 0
            while not stop.is_set() and i < 600:
                p = "b" if (i // 5) % 2 == 0 else "u"
                name = f"{c}/{p}/{i}"
                producers[0 if p == "b" else 1].send_async(
                    name.encode(),
                    lambda r, m, n=name: done(r, m, n),
                    partition_key=f"k{i % KEYS}",
                )
                i += 1
                if i % 20 == 0:
                    time.sleep(0.02)
            for producer in producers:
                # cb's own producers are cut by the kill.
                with contextlib.suppress(pulsar.PulsarException):
                    producer.flush()
        finally:
            client.close()

    threads = {c: threading.Thread(target=load, args=(c,)) for c in CLUSTERS}
    for t in threads.values():
        t.start()
    cb = mesh["cb"]
    _wait(
        lambda: ok(cb, "GET", tpath(topic, "stats"))["msgInCounter"] >= 300,
        what="load on cb",
    )
    cb.kill()  # SIGKILL, sends and replication in flight both ways
    for c in ("ca", "cc"):
        threads[c].join(60)
    stop.set()
    threads["cb"].join(60)
    cb.start(same_ports=True)
    _wait(lambda: _caught_up(mesh, topic), timeout=60, what="caught up after the kill")
    at_least = len({n for names in confirmed.values() for n in names})
    held = _held(mesh, topic, dict.fromkeys(CLUSTERS, at_least))
    # What cb stored before the kill (confirmed or not) is what everyone holds of cb.
    everything = set(held["ca"])
    _audit(held, dict.fromkeys(CLUSTERS, everything))
    for c in CLUSTERS:
        lost = set(confirmed[c]) - everything
        assert not lost, f"confirmed on {c} and lost: {sorted(lost)[:5]}"
    assert len(confirmed["ca"]) == len(confirmed["cc"]) == 600
