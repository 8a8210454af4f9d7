"""Admin REST: tenants, clusters, namespaces and the namespace policies this broker honours."""

from __future__ import annotations

import time
import uuid

import pulsar
import pytest

from tests.broker_process import BrokerProcess
from tests.integration.admin_support import new_namespace, ok, tpath, wait_for
from tests.integration.conftest import make_client

pytestmark = pytest.mark.integration


def test_tenant_lifecycle(broker: BrokerProcess) -> None:
    tenant = f"acme-{uuid.uuid4().hex[:6]}"
    assert "public" in ok(broker, "GET", "/admin/v2/tenants")
    assert broker.admin("GET", f"/admin/v2/tenants/{tenant}")[0] == 404
    info = {"adminRoles": ["ops"], "allowedClusters": ["standalone"]}
    assert broker.admin("PUT", f"/admin/v2/tenants/{tenant}", info) == (204, None)
    assert broker.admin("PUT", f"/admin/v2/tenants/{tenant}", info)[0] == 409
    assert tenant in ok(broker, "GET", "/admin/v2/tenants")
    assert ok(broker, "GET", f"/admin/v2/tenants/{tenant}") == info
    ok(broker, "POST", f"/admin/v2/tenants/{tenant}", {"adminRoles": ["a", "b"]})
    assert ok(broker, "GET", f"/admin/v2/tenants/{tenant}")["adminRoles"] == ["a", "b"]
    # Pulsar's checks: unknown clusters and invalid names are preconditions that fail.
    status, body = broker.admin("PUT", "/admin/v2/tenants/other", {"allowedClusters": ["x"]})
    assert status == 412 and "Clusters do not exist" in body["reason"]
    assert broker.admin("PUT", "/admin/v2/tenants/bad%20name", {})[0] == 412
    # A tenant with namespaces is deleted only when forced, and takes them along.
    ok(broker, "PUT", f"/admin/v2/namespaces/{tenant}/ns1")
    status, body = broker.admin("DELETE", f"/admin/v2/tenants/{tenant}")
    assert status == 409 and body == {"reason": "The tenant still has active namespaces"}
    assert broker.admin("DELETE", f"/admin/v2/tenants/{tenant}?force=true") == (204, None)
    assert tenant not in ok(broker, "GET", "/admin/v2/tenants")
    assert broker.admin("GET", f"/admin/v2/namespaces/{tenant}/ns1")[0] == 404


def test_clusters(broker: BrokerProcess) -> None:
    assert ok(broker, "GET", "/admin/v2/clusters") == ["standalone"]


def test_namespace_lifecycle_and_policies_view(broker: BrokerProcess) -> None:
    ns = new_namespace(broker)
    tenant = ns.split("/")[0]
    assert broker.admin("PUT", "/admin/v2/namespaces/no-such-tenant/x")[0] == 404
    assert broker.admin("PUT", f"/admin/v2/namespaces/{ns}")[0] == 409
    initial = {
        "deduplicationEnabled": True,
        "message_ttl_in_seconds": 120,
        "retention_policies": {"retentionTimeInMinutes": 10, "retentionSizeInMB": 5},
    }
    ok(broker, "PUT", f"/admin/v2/namespaces/{tenant}/ns2", initial)
    assert ok(broker, "GET", f"/admin/v2/namespaces/{tenant}") == [ns, f"{tenant}/ns2"]
    policies = ok(broker, "GET", f"/admin/v2/namespaces/{tenant}/ns2")
    for key, value in initial.items():
        assert policies[key] == value
    assert policies["auth_policies"]["namespace_auth"] == {}
    assert policies["replication_clusters"] == ["standalone"]
    plain = ok(broker, "GET", f"/admin/v2/namespaces/{ns}")
    assert plain["deduplicationEnabled"] is None and plain["retention_policies"] is None
    assert broker.admin("DELETE", f"/admin/v2/namespaces/{tenant}/ns2") == (204, None)
    assert broker.admin("GET", f"/admin/v2/namespaces/{tenant}/ns2")[0] == 404
    assert broker.admin("GET", "/admin/v2/namespaces/no-such-tenant")[0] == 404


def test_namespace_policy_round_trips(broker: BrokerProcess) -> None:
    p = f"/admin/v2/namespaces/{new_namespace(broker)}"
    # deduplication: body true/false
    assert ok(broker, "GET", p + "/deduplication") is None
    assert broker.admin("POST", p + "/deduplication", True) == (204, None)
    assert ok(broker, "GET", p + "/deduplication") is True
    ok(broker, "POST", p + "/deduplication", False)
    assert ok(broker, "GET", p + "/deduplication") is False
    ok(broker, "DELETE", p + "/deduplication")
    assert ok(broker, "GET", p + "/deduplication") is None
    # retention: RetentionPolicies, validated as Pulsar does
    retention = {"retentionTimeInMinutes": 60, "retentionSizeInMB": -1}
    assert ok(broker, "GET", p + "/retention") is None
    assert broker.admin("POST", p + "/retention", retention) == (204, None)
    assert ok(broker, "GET", p + "/retention") == retention
    for bad in (
        {"retentionTimeInMinutes": 0, "retentionSizeInMB": 10},
        {"retentionTimeInMinutes": -2, "retentionSizeInMB": -1},
    ):
        assert broker.admin("POST", p + "/retention", bad)[0] == 412
    assert broker.admin("POST", p + "/retention", {"retentionTimeInMinutes": "x"})[0] == 422
    assert ok(broker, "GET", p + "/retention") == retention
    ok(broker, "DELETE", p + "/retention")
    assert ok(broker, "GET", p + "/retention") is None
    # message TTL: body is the number of seconds
    assert ok(broker, "GET", p + "/messageTTL") is None
    assert broker.admin("POST", p + "/messageTTL", 3600) == (204, None)
    assert ok(broker, "GET", p + "/messageTTL") == 3600
    assert broker.admin("POST", p + "/messageTTL", -5)[0] == 412
    ok(broker, "DELETE", p + "/messageTTL")
    assert ok(broker, "GET", p + "/messageTTL") is None
    view = ok(broker, "GET", p)
    assert view["message_ttl_in_seconds"] is None and view["retention_policies"] is None
    assert broker.admin("GET", "/admin/v2/namespaces/public/nope/retention")[0] == 404


def test_delete_non_empty_namespace_only_when_forced(broker: BrokerProcess) -> None:
    ns = new_namespace(broker)
    ok(broker, "PUT", f"/admin/v2/persistent/{ns}/t1")
    ok(broker, "PUT", f"/admin/v2/persistent/{ns}/pt/partitions", 2)
    status, body = broker.admin("DELETE", f"/admin/v2/namespaces/{ns}")
    assert status == 409 and body == {"reason": "Cannot delete non empty namespace"}
    assert broker.admin("DELETE", f"/admin/v2/namespaces/{ns}?force=true") == (204, None)
    assert broker.admin("GET", f"/admin/v2/namespaces/{ns}")[0] == 404
    # Recreated, it is empty: its topics went with it.
    ok(broker, "PUT", f"/admin/v2/namespaces/{ns}")
    assert ok(broker, "GET", f"/admin/v2/namespaces/{ns}/topics") == []
    assert ok(broker, "GET", f"/admin/v2/persistent/{ns}/partitioned") == []


def test_namespace_topics_clear_backlog_and_unload(broker: BrokerProcess) -> None:
    ns = new_namespace(broker)
    a, b = f"persistent://{ns}/a", f"persistent://{ns}/b"
    ok(broker, "PUT", f"/admin/v2/persistent/{ns}/pt/partitions", 2)
    client = make_client(broker.service_url)
    try:
        subs = [
            client.subscribe(t, s, initial_position=pulsar.InitialPosition.Earliest)
            for t in (a, b)
            for s in ("s1", "s2")
        ]
        for t in (a, b):
            producer = client.create_producer(t, batching_enabled=False)
            for i in range(3):
                producer.send(f"{i}".encode())
            producer.close()
        topics = ok(broker, "GET", f"/admin/v2/namespaces/{ns}/topics")
        assert topics == [
            a,
            b,
            f"persistent://{ns}/pt-partition-0",
            f"persistent://{ns}/pt-partition-1",
        ]
        assert ok(broker, "GET", f"/admin/v2/persistent/{ns}") == topics

        def backlog(t: str, s: str) -> int:
            return int(ok(broker, "GET", tpath(t, "stats"))["subscriptions"][s]["msgBacklog"])

        assert backlog(a, "s1") == 3
        ok(broker, "POST", f"/admin/v2/namespaces/{ns}/clearBacklog/s1")
        assert [backlog(t, s) for t in (a, b) for s in ("s1", "s2")] == [0, 3, 0, 3]
        ok(broker, "POST", f"/admin/v2/namespaces/{ns}/clearBacklog")
        assert [backlog(t, s) for t in (a, b) for s in ("s1", "s2")] == [0, 0, 0, 0]
        # Unload closes the topics; the consumers reconnect and go on receiving.
        assert broker.admin("PUT", f"/admin/v2/namespaces/{ns}/unload") == (204, None)
        producer = client.create_producer(a, batching_enabled=False)
        producer.send(b"after-unload")
        # (messages the client had prefetched before the backlog was cleared may come first)
        got = [subs[0].receive(timeout_millis=10000).data()]
        while got[-1] != b"after-unload" and len(got) < 4:
            got.append(subs[0].receive(timeout_millis=10000).data())
        assert got[-1] == b"after-unload"
        assert set(got[:-1]) <= {b"0", b"1", b"2"}
    finally:
        client.close()


def test_deduplication_policy_applies_to_a_loaded_topic(broker: BrokerProcess) -> None:
    """Switching deduplication (namespace, then topic over namespace) needs no reload."""
    ns = new_namespace(broker)
    topic = f"persistent://{ns}/dedup"
    client = make_client(broker.service_url)
    try:
        client.subscribe(topic, "keep", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic, producer_name="p1", batching_enabled=False)

        def entries() -> int:
            return int(ok(broker, "GET", tpath(topic, "internalStats"))["numberOfEntries"])

        def status() -> str:
            return str(ok(broker, "GET", tpath(topic, "stats"))["deduplicationStatus"])

        producer.send(b"a", sequence_id=1)
        producer.send(b"a-again", sequence_id=1)
        assert entries() == 2 and status() == "Disabled"
        ok(broker, "POST", f"/admin/v2/namespaces/{ns}/deduplication", True)
        assert status() == "Enabled"
        producer.send(b"a-third", sequence_id=1)  # recovered state knows sequence id 1
        producer.send(b"b", sequence_id=2)
        assert entries() == 3
        # The topic's own policy wins over the namespace's.
        ok(broker, "POST", tpath(topic, "deduplicationEnabled"), False)
        assert status() == "Disabled"
        producer.send(b"b-again", sequence_id=2)
        assert entries() == 4
        ok(broker, "DELETE", tpath(topic, "deduplicationEnabled"))
        assert status() == "Enabled"
        producer.send(b"b-third", sequence_id=2)
        producer.send(b"c", sequence_id=3)
        assert entries() == 5
    finally:
        client.close()


def test_retention_policy_applies_to_a_loaded_topic(fresh_broker: BrokerProcess) -> None:
    """With retention set, consumed ledgers stay; removing it lets the broker trim them."""
    fresh_broker.conf["managedLedgerMaxEntriesPerLedger"] = 3
    fresh_broker.start()
    ns = new_namespace(fresh_broker)
    topic = f"persistent://{ns}/kept"
    ok(
        fresh_broker,
        "POST",
        f"/admin/v2/namespaces/{ns}/retention",
        {"retentionTimeInMinutes": 60, "retentionSizeInMB": -1},
    )
    client = make_client(fresh_broker.service_url)
    try:
        consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(10):
            producer.send(str(i).encode())
        for _ in range(10):
            consumer.acknowledge(consumer.receive(timeout_millis=5000))

        def ledgers() -> int:
            return len(ok(fresh_broker, "GET", tpath(topic, "internalStats"))["ledgers"])

        before = ledgers()
        assert before >= 4
        time.sleep(2.5)  # the broker's periodic trim runs every second
        assert ledgers() == before
        ok(fresh_broker, "DELETE", f"/admin/v2/namespaces/{ns}/retention")
        assert wait_for(lambda: ledgers() <= 2)
    finally:
        client.close()


def test_message_ttl_policy_applies_to_a_loaded_topic(fresh_broker: BrokerProcess) -> None:
    """A TTL set on the namespace expires the backlog of a topic that is already loaded."""
    fresh_broker.conf["messageExpiryCheckIntervalInMinutes"] = 0
    fresh_broker.start()
    ns = new_namespace(fresh_broker)
    topic = f"persistent://{ns}/expiring"
    client = make_client(fresh_broker.service_url)
    try:
        client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest).close()
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(3):
            producer.send(str(i).encode())

        def backlog() -> int:
            stats = ok(fresh_broker, "GET", tpath(topic, "stats"))
            return int(stats["subscriptions"]["s"]["msgBacklog"])

        time.sleep(2.5)
        assert backlog() == 3  # no TTL yet
        ok(fresh_broker, "POST", f"/admin/v2/namespaces/{ns}/messageTTL", 1)
        assert wait_for(lambda: backlog() == 0)
    finally:
        client.close()
