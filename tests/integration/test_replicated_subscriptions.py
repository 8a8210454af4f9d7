"""Replicated subscriptions between two real brokers: a consumer fails over to the other cluster.

Two standalone processes (clusters ``ra`` and ``rb``) replicate namespace ``rsub/ns`` both ways,
as in ``test_geo_replication.py``. A consumer with ``replicate_subscription_state_enabled``
consumes and acknowledges part of a stream on ``ra``; the same subscription opened on ``rb``
must start at or before the first message not acknowledged on ``ra`` (never after it: nothing
unacknowledged is lost), and not far before it. Snapshots are taken every 200 ms here (Pulsar's
default is 1000) so that the paced stream holds many. The same over a partitioned topic,
partition by partition. About 60 s on ``-n 0`` (80 s on a loaded machine).
"""

from __future__ import annotations

import json
import subprocess
import sys
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
from tests.integration.geo_support import replicating

pytestmark = pytest.mark.integration

NS = "rsub/ns"
SNAPSHOT_MS = 200
N = 300
"""Messages produced, 20 every 200 ms: about one snapshot per 20 messages."""
ACKED = 190
"""Messages acknowledged on ``ra`` (indexes 0..189): the first unacknowledged one is 190, mid-way between two snapshots."""
SHORT = 100
"""Messages of the tests that need a few snapshots but no failover point."""
BOUND = 100
"""How far before the first unacknowledged message ``rb`` may start: a snapshot's positions
trail the acknowledged ones by about one snapshot interval plus a replication round trip (~20 to
40 messages here); 100 leaves room for a loaded machine and is still well after index 0."""


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    conf = {"replicatedSubscriptionsSnapshotFrequencyMillis": SNAPSHOT_MS}
    with replicating({"ra": conf, "rb": conf}, NS) as brokers:
        yield brokers["ra"], brokers["rb"]


def _wait(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _stats(b: BrokerProcess, topic: str) -> dict[str, Any]:
    status, body = b.admin("GET", f"/admin/v2/persistent/{topic[len('persistent://') :]}/stats")
    return body if status == 200 else {}


def _replicator_connected(b: BrokerProcess, topic: str, remote: str) -> bool:
    return bool(_stats(b, topic).get("replication", {}).get(remote, {}).get("connected"))


def _produce_paced(a: BrokerProcess, topic: str, n: int = N) -> None:
    """``n`` messages keyed k0..k9, 20 per snapshot interval, so snapshots fall all along."""
    client = _client(a)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(n):
            producer.send_async(str(i).encode(), None, partition_key=f"k{i % 10}")
            if i % 20 == 19:
                producer.flush()
                time.sleep(SNAPSHOT_MS / 1000)
        producer.flush()
    finally:
        client.close()


def _drain(
    consumer: pulsar.Consumer, quiet: float = 2.0, expect: int = 0, timeout: float = 30.0
) -> list[int]:
    """Every message, acknowledged: at least ``expect`` of them, then until none came for
    ``quiet`` seconds."""
    got: list[int] = []
    deadline = time.monotonic() + timeout
    last = time.monotonic()
    while time.monotonic() < deadline and (len(got) < expect or time.monotonic() - last < quiet):
        try:
            msg = consumer.receive(timeout_millis=200)
        except pulsar.Timeout:
            continue
        got.append(int(msg.data()))  # a marker delivered as a message would not parse
        consumer.acknowledge(msg)
        last = time.monotonic()
    return got


def _settled(b: BrokerProcess, topic: str, sub: str) -> int:
    """Wait until ``sub`` exists on ``b`` and its backlog stayed the same for 1.5 s."""
    seen: list[tuple[float, int]] = []

    def stable() -> bool:
        st = _stats(b, topic).get("subscriptions", {}).get(sub)
        if st is None:
            return False
        backlog = int(st["msgBacklog"])
        if not seen or seen[-1][1] != backlog:
            seen.append((time.monotonic(), backlog))
            return False
        return time.monotonic() - seen[-1][0] >= 1.5

    _wait(stable)
    return seen[-1][1]


@pytest.mark.parametrize(
    ("sub_type", "ack_beyond"),
    [
        (pulsar.ConsumerType.Exclusive, ()),
        # Individual acks past the first unacknowledged message do not follow (only the
        # mark-delete position does, as in Pulsar): rb redelivers them, duplicates only.
        (pulsar.ConsumerType.KeyShared, (ACKED + 3, ACKED + 7)),
    ],
    ids=["exclusive", "key_shared"],
)
def test_consumer_fails_over_close_to_where_it_stopped(
    pair: tuple[BrokerProcess, BrokerProcess],
    sub_type: pulsar.ConsumerType,
    ack_beyond: tuple[int, ...],
) -> None:
    a, b = pair
    topic = f"persistent://{NS}/t-{uuid.uuid4().hex[:10]}"
    sub = "orders"
    ca = _client(a)
    try:
        consumer = ca.subscribe(
            topic,
            sub,
            consumer_type=sub_type,
            initial_position=pulsar.InitialPosition.Earliest,
            replicate_subscription_state_enabled=True,
            receiver_queue_size=50,
        )
        _produce_paced(a, topic)
        _wait(lambda: _stats(b, topic).get("msgInCounter", 0) >= N)
        received: list[int] = []
        while len(received) < ACKED + 10:
            msg = consumer.receive(timeout_millis=10_000)
            i = int(msg.data())
            received.append(i)
            if i < ACKED or i in ack_beyond:
                consumer.acknowledge(msg)
        assert sorted(received) == list(range(ACKED + 10))  # one consumer: every key in order
        local = _stats(a, topic)["subscriptions"][sub]
        assert local["isReplicated"] is True
        rest = f"/admin/v2/persistent/{topic[len('persistent://') :]}/subscription/{sub}"
        assert ok(a, "GET", rest + "/replicatedSubscriptionStatus") == {topic: True}
        _settled(b, topic, sub)
        consumer.close()  # the consumer "fails": ACKED..ACKED+9 were received, not acked
    finally:
        ca.close()

    remote = _stats(b, topic)["subscriptions"][sub]
    assert remote["isReplicated"] is True
    cb = _client(b)
    try:
        consumer = cb.subscribe(
            topic,
            sub,
            consumer_type=sub_type,
            initial_position=pulsar.InitialPosition.Latest,
            replicate_subscription_state_enabled=True,
        )
        got = _drain(consumer, expect=N - ACKED)
    finally:
        cb.close()
    assert got, "the subscription on rb did not follow: nothing delivered"
    first = min(got)
    # Never after an unacknowledged message: everything from the first unacked on arrives.
    assert first <= ACKED
    assert set(range(ACKED, N)) <= set(got)
    # And close to where the consumer stopped.
    assert ACKED - first <= BOUND, f"rb started at {first}, {ACKED - first} before {ACKED}"
    assert set(got) == set(range(first, N))
    for k in range(10):
        of_key = [i for i in got if i % 10 == k]
        assert of_key == sorted(of_key), f"key k{k} out of order on rb"


def test_markers_never_reach_consumers_and_status_can_be_set(
    pair: tuple[BrokerProcess, BrokerProcess],
) -> None:
    a, b = pair
    topic = f"persistent://{NS}/t-{uuid.uuid4().hex[:10]}"
    rest = f"/admin/v2/persistent/{topic[len('persistent://') :]}/subscription"
    ca = _client(a)
    cb = _client(b)
    try:
        plain_b = cb.subscribe(topic, "plain", initial_position=pulsar.InitialPosition.Earliest)
        rep = ca.subscribe(
            topic,
            "rep",
            initial_position=pulsar.InitialPosition.Earliest,
            replicate_subscription_state_enabled=True,
        )
        plain_a = ca.subscribe(
            topic,
            "plain",
            consumer_type=pulsar.ConsumerType.Shared,
            initial_position=pulsar.InitialPosition.Earliest,
        )
        _produce_paced(a, topic, SHORT)
        # Markers ran both ways (requests to rb, responses to ra, updates to rb) and are in
        # both topics; no consumer sees one, and they are acknowledged for every subscription.
        assert sorted(_drain(rep, 1.0, SHORT)) == list(range(SHORT))
        assert sorted(_drain(plain_a, 1.0, SHORT)) == list(range(SHORT))
        assert sorted(_drain(plain_b, 1.0, SHORT)) == list(range(SHORT))
        reader = ca.create_reader(topic, pulsar.MessageId.earliest)
        seen: list[int] = []
        while reader.has_message_available():
            seen.append(int(reader.read_next(timeout_millis=5000).data()))
        assert seen == list(range(SHORT))
        internal = ok(a, "GET", f"/admin/v2/persistent/{topic[len('persistent://') :]}/stats")
        assert internal["subscriptions"]["plain"]["isReplicated"] is False
        _wait(lambda: _stats(a, topic)["subscriptions"]["plain"]["msgBacklog"] == 0)
        _wait(lambda: _stats(b, topic)["subscriptions"]["plain"]["msgBacklog"] == 0)
        # The replicated subscription reached rb without any consumer there.
        _wait(lambda: "rep" in _stats(b, topic).get("subscriptions", {}))
    finally:
        ca.close()
        cb.close()
    assert ok(b, "GET", rest + "/rep/replicatedSubscriptionStatus") == {topic: True}
    with urllib.request.urlopen(a.web_url + "/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    assert 'pulsar_replicated_subscriptions_pending_snapshots{cluster="ra"}' in metrics
    assert 'pulsar_replicated_subscriptions_timedout_snapshots{cluster="ra"} 0.0' in metrics
    status, _ = a.admin("POST", rest + "/plain/replicatedSubscriptionStatus", True)
    assert status == 204
    assert _stats(a, topic)["subscriptions"]["plain"]["isReplicated"] is True
    # pulsar-admin's commands for the same.
    cli = [sys.executable, "-m", "keyshared.cli", "admin", "--admin-url", a.web_url, "topics"]
    subprocess.run(
        [*cli, "set-replicated-subscription-status", topic, "-s", "plain", "-d"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    got = subprocess.run(
        [*cli, "get-replicated-subscription-status", topic, "-s", "plain"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(got.stdout) == {topic: False}
    status, _ = a.admin("POST", rest + "/nowhere/replicatedSubscriptionStatus", True)
    assert status == 404


def test_replication_of_the_subscription_survives_a_restart(
    pair: tuple[BrokerProcess, BrokerProcess],
) -> None:
    a, b = pair
    topic = f"persistent://{NS}/t-{uuid.uuid4().hex[:10]}"
    sub = "durable"
    status_path = (
        f"/admin/v2/persistent/{topic[len('persistent://') :]}/subscription/{sub}"
        "/replicatedSubscriptionStatus"
    )
    ca = _client(a)
    try:
        ca.subscribe(topic, sub, replicate_subscription_state_enabled=True).close()
    finally:
        ca.close()
    a.stop()
    a.start(same_ports=True)
    # The flag is stored with the subscription; this consumer does not ask for it.
    assert ok(a, "GET", status_path) == {topic: True}
    ca = _client(a)
    try:
        consumer = ca.subscribe(topic, sub)
        # Snapshots are taken only with every replicator connected (as Pulsar's): on a loaded
        # machine the restarted replicator could connect after the paced produce ended, and
        # with no new data after it no snapshot, so nothing for rb to follow. rb's replicator
        # back to ra (it carries the snapshot responses) lost ra for the restart too and
        # retries after a back-off that doubled while ra was down: wait for it as well.
        _wait(lambda: _replicator_connected(a, topic, "rb"))
        _wait(lambda: _replicator_connected(b, topic, "ra"), timeout=90)
        _produce_paced(a, topic, SHORT)
        assert sorted(_drain(consumer, 1.0, SHORT)) == list(range(SHORT))
    finally:
        ca.close()
    _settled(b, topic, sub)
    cb = _client(b)
    try:
        rest = _drain(cb.subscribe(topic, sub), quiet=1.5)
    finally:
        cb.close()
    # Everything was acknowledged on ra: rb starts within the last snapshot interval.
    assert rest == sorted(rest) and len(rest) <= 40, rest


PARTITIONS = 3
P_N = 450
"""Messages of the partitioned test: about 150 per partition."""
P_ACKED = 300
"""Messages acknowledged there (indexes 0..299): about 100 into each partition."""
P_BOUND = 40
"""How far before a partition's first unacknowledged message ``rb`` may start on it: a
snapshot interval holds about 7 messages of each partition; 40 leaves room for load and is
still well into the partition (the first unacknowledged one is about 100 in)."""


def _positions_on(b: BrokerProcess, partition: str) -> dict[int, tuple[int, int]]:
    """Each message of ``partition`` on ``b``: its index to its (ledger, entry) there."""
    client = _client(b)
    try:
        reader = client.create_reader(partition, pulsar.MessageId.earliest)
        out: dict[int, tuple[int, int]] = {}
        while reader.has_message_available():
            msg = reader.read_next(timeout_millis=5000)
            out[int(msg.data())] = (msg.message_id().ledger_id(), msg.message_id().entry_id())
        return out
    finally:
        client.close()


def test_partitioned_topic_follows_partition_by_partition(
    pair: tuple[BrokerProcess, BrokerProcess],
) -> None:
    a, b = pair
    topic = f"persistent://{NS}/p-{uuid.uuid4().hex[:10]}"
    rest = f"/admin/v2/persistent/{topic[len('persistent://') :]}"
    sub = "parts"
    ok(a, "PUT", rest + "/partitions", PARTITIONS)
    partition_of: dict[int, int] = {}
    ca = _client(a)
    try:
        consumer = ca.subscribe(
            topic,
            sub,
            initial_position=pulsar.InitialPosition.Earliest,
            replicate_subscription_state_enabled=True,
            receiver_queue_size=50,
        )
        # Snapshots need every partition's replicator connected (the replicators also create
        # the partitioned topic on rb).
        _wait(
            lambda: bool(
                ok(a, "GET", rest + "/partitioned-stats")
                .get("replication", {})
                .get("rb", {})
                .get("connected")
            )
        )
        producer = ca.create_producer(topic, batching_enabled=False)

        def sent(i: int) -> Callable[[pulsar.Result, pulsar.MessageId], None]:
            def record(res: pulsar.Result, msg_id: pulsar.MessageId) -> None:
                assert res == pulsar.Result.Ok
                partition_of[i] = msg_id.partition()

            return record

        for i in range(P_N):
            producer.send_async(str(i).encode(), sent(i), partition_key=f"k{i % 30}")
            if i % 20 == 19:
                producer.flush()
                time.sleep(SNAPSHOT_MS / 1000)
        producer.flush()
        _wait(lambda: len(partition_of) == P_N)
        parts = [sorted(i for i, p in partition_of.items() if p == n) for n in range(PARTITIONS)]
        assert all(len(p) >= 100 for p in parts), [len(p) for p in parts]
        _wait(lambda: ok(b, "GET", rest + "/partitioned-stats").get("msgInCounter", 0) >= P_N)
        # Acknowledge 0..P_ACKED-1 (receiving whatever else comes, unacknowledged).
        acked: set[int] = set()
        while len(acked) < P_ACKED:
            msg = consumer.receive(timeout_millis=10_000)
            i = int(msg.data())
            assert msg.topic_name().endswith(f"-partition-{partition_of[i]}")
            if i < P_ACKED:
                consumer.acknowledge(msg)
                acked.add(i)
        # The mark-delete position follows on each partition: on rb it is, partition by
        # partition, before the first message unacknowledged on ra and not far before it (by
        # the messages' positions on rb: the backlog would count the markers too).
        first_unacked = [min(i for i in p if i >= P_ACKED) for p in parts]
        unacked = [len(p) - p.index(f) for p, f in zip(parts, first_unacked, strict=True)]
        for n, part in enumerate(parts):
            partition = f"{topic}-partition-{n}"
            _settled(b, partition, sub)
            cursor = ok(b, "GET", f"{rest}-partition-{n}/internalStats")["cursors"][sub]
            ledger, _, entry = str(cursor["markDeletePosition"]).partition(":")
            mark_delete = (int(ledger), int(entry))
            on_b = _positions_on(b, partition)
            assert sorted(on_b) == part, n
            k = part.index(first_unacked[n])
            assert k > P_BOUND, (n, k)  # the bound must say something
            assert on_b[first_unacked[n]] > mark_delete, (n, mark_delete)
            assert on_b[part[k - P_BOUND]] <= mark_delete, (n, mark_delete)
        consumer.close()  # the consumer "fails" with P_ACKED.. unacknowledged
    finally:
        ca.close()

    cb = _client(b)
    try:
        consumer = cb.subscribe(
            topic,
            sub,
            initial_position=pulsar.InitialPosition.Latest,
            replicate_subscription_state_enabled=True,
        )
        got: dict[int, list[int]] = {n: [] for n in range(PARTITIONS)}
        deadline = time.monotonic() + 30
        last = time.monotonic()
        while time.monotonic() < deadline and (
            sum(map(len, got.values())) < sum(unacked) or time.monotonic() - last < 2.0
        ):
            try:
                msg = consumer.receive(timeout_millis=200)
            except pulsar.Timeout:
                continue
            n = int(msg.topic_name().rsplit("-partition-", 1)[1])
            got[n].append(int(msg.data()))
            consumer.acknowledge(msg)
            last = time.monotonic()
    finally:
        cb.close()
    for n, part in enumerate(parts):
        assert got[n], f"partition {n}: the subscription on rb did not follow"
        start = part.index(got[n][0])
        # Never after the partition's first unacknowledged message, not far before it, and
        # from there the partition's messages once each, in order.
        assert start <= part.index(first_unacked[n]), (n, got[n][0], first_unacked[n])
        assert part.index(first_unacked[n]) - start <= P_BOUND, (n, got[n][0], first_unacked[n])
        assert got[n] == part[start:], n
