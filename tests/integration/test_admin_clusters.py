"""Admin REST: clusters (Pulsar's ClusterData), and the whole Policies body of a new namespace."""

from __future__ import annotations

import uuid

import pytest

from tests.broker_process import BrokerProcess
from tests.integration.admin_support import ok

pytestmark = pytest.mark.integration

REMOTE = {
    "serviceUrl": "http://remote.example.com:8080",
    "brokerServiceUrl": "pulsar://remote.example.com:6650",
    "authenticationPlugin": "org.apache.pulsar.client.impl.auth.AuthenticationToken",
    "authenticationParameters": "token:abc",
}


def test_cluster_lifecycle_codes_and_persistence(fresh_broker: BrokerProcess) -> None:
    b = fresh_broker.start()
    # The standalone's own cluster is there from the start, with the URLs it listens on.
    assert ok(b, "GET", "/admin/v2/clusters") == ["standalone"]
    local = ok(b, "GET", "/admin/v2/clusters/standalone")
    assert local["serviceUrl"] == b.web_url
    assert local["brokerServiceUrl"] == b.service_url
    assert b.admin("GET", "/admin/v2/clusters/nope") == (
        404,
        {"reason": "Cluster does not exist"},
    )
    # Create, 409 on a second PUT, read back, update, 404 updating a missing one.
    assert b.admin("PUT", "/admin/v2/clusters/remote", REMOTE) == (204, None)
    assert b.admin("PUT", "/admin/v2/clusters/remote", REMOTE) == (
        409,
        {"reason": "Cluster already exists"},
    )
    assert ok(b, "GET", "/admin/v2/clusters/remote") == REMOTE
    assert ok(b, "GET", "/admin/v2/clusters") == ["remote", "standalone"]
    changed = {**REMOTE, "brokerServiceUrlTls": "pulsar+ssl://remote.example.com:6651"}
    assert b.admin("POST", "/admin/v2/clusters/remote", changed) == (204, None)
    assert ok(b, "GET", "/admin/v2/clusters/remote") == changed
    assert b.admin("POST", "/admin/v2/clusters/nope", REMOTE)[0] == 404
    # Bad input is named: a wrong URL scheme, a field ClusterData does not have, a bad name.
    status, body = b.admin("PUT", "/admin/v2/clusters/c2", {"serviceUrl": "pulsar://x:1"})
    assert status == 400 and body["reason"].startswith("Illegal service url")
    status, body = b.admin("PUT", "/admin/v2/clusters/c2", {"serviceUrls": "http://x:1"})
    assert status == 400 and "serviceUrls" in body["reason"]
    assert b.admin("PUT", "/admin/v2/clusters/bad%20name", REMOTE) == (
        412,
        {"reason": "Cluster name is not valid"},
    )
    # Tenants may only allow known clusters; a cluster in use cannot be deleted.
    status, body = b.admin("PUT", "/admin/v2/tenants/acme", {"allowedClusters": ["c2"]})
    assert status == 412 and "c2" in body["reason"]
    ok(b, "PUT", "/admin/v2/tenants/acme", {"allowedClusters": ["standalone", "remote"]})
    assert b.admin("DELETE", "/admin/v2/clusters/remote") == (412, {"reason": "Cluster not empty"})
    assert b.admin("DELETE", "/admin/v2/clusters/standalone")[0] == 412
    # A namespace's replication clusters: known and allowed (geo-replication itself is
    # tested in test_geo_replication.py).
    body = {"replication_clusters": ["standalone", "remote"]}
    ok(b, "PUT", "/admin/v2/namespaces/acme/ns", body)
    replication = "/admin/v2/namespaces/acme/ns/replication"
    assert ok(b, "GET", replication) == ["remote", "standalone"]
    assert b.admin("POST", replication, ["remote"]) == (204, None)
    assert ok(b, "GET", replication) == ["remote"]
    assert b.admin("POST", replication, ["c2"])[0] == 412
    assert b.admin("POST", replication, [])[0] == 412
    assert b.admin("POST", replication, ["standalone"]) == (204, None)
    ok(b, "DELETE", "/admin/v2/namespaces/acme/ns")
    ok(b, "POST", "/admin/v2/tenants/acme", {"allowedClusters": ["standalone"]})
    status, _ = b.admin("POST", replication.replace("acme/ns", "acme/nope"), ["standalone"])
    assert status == 404
    ok(b, "PUT", "/admin/v2/clusters/spare", {})
    b.restart()
    # Persisted across a restart, the local cluster's URLs refreshed.
    assert ok(b, "GET", "/admin/v2/clusters") == ["remote", "spare", "standalone"]
    assert ok(b, "GET", "/admin/v2/clusters/remote") == changed
    assert ok(b, "GET", "/admin/v2/clusters/standalone")["serviceUrl"] == b.web_url
    assert b.admin("DELETE", "/admin/v2/clusters/remote") == (204, None)
    assert b.admin("DELETE", "/admin/v2/clusters/remote")[0] == 404
    assert ok(b, "GET", "/admin/v2/clusters") == ["spare", "standalone"]


def test_namespace_body_is_honoured_whole(broker: BrokerProcess) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    ok(broker, "PUT", f"/admin/v2/tenants/{tenant}", {"allowedClusters": ["standalone"]})
    body = {
        "auth_policies": {
            "namespace_auth": {"app": ["produce", "consume"]},
            "destination_auth": {},
            "subscription_auth_roles": {},
        },
        "replication_clusters": ["standalone"],
        "retention_policies": {"retentionTimeInMinutes": 60, "retentionSizeInMB": -1},
        "message_ttl_in_seconds": 30,
        "deduplicationEnabled": True,
        "subscription_types_enabled": ["Key_Shared", "Exclusive"],
        "compaction_threshold": 1048576,
        "dispatcherPauseOnAckStatePersistentEnabled": True,
        # Fields a Java client sends with their defaults: they ask for nothing.
        "bundles": {"boundaries": ["0x00000000", "0xffffffff"], "numBundles": 1},
        "backlog_quota_map": {},
        "allowed_clusters": [],
        "encryption_required": False,
        "subscription_auth_mode": "None",
        "offload_threshold": -1,
        "deleted": False,
    }
    ns = f"{tenant}/full"
    assert broker.admin("PUT", f"/admin/v2/namespaces/{ns}", body) == (204, None)
    view = ok(broker, "GET", f"/admin/v2/namespaces/{ns}")
    assert view["auth_policies"]["namespace_auth"] == {"app": ["consume", "produce"]}
    assert ok(broker, "GET", f"/admin/v2/namespaces/{ns}/permissions") == {
        "app": ["consume", "produce"]
    }
    assert view["replication_clusters"] == ["standalone"]
    assert view["retention_policies"] == body["retention_policies"]
    assert view["message_ttl_in_seconds"] == 30 and view["deduplicationEnabled"] is True
    assert view["dispatcherPauseOnAckStatePersistentEnabled"] is True
    assert ok(broker, "GET", f"/admin/v2/namespaces/{ns}/subscriptionTypesEnabled") == [
        "Exclusive",
        "Key_Shared",
    ]
    assert ok(broker, "GET", f"/admin/v2/namespaces/{ns}/compactionThreshold") == 1048576
    # The same namespace again: 409; a missing tenant: 404.
    assert broker.admin("PUT", f"/admin/v2/namespaces/{ns}", body)[0] == 409
    assert broker.admin("PUT", "/admin/v2/namespaces/no-such-tenant/x", body)[0] == 404


def test_namespace_body_refuses_what_it_cannot_honour_by_name(broker: BrokerProcess) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    ok(broker, "PUT", f"/admin/v2/tenants/{tenant}", {"allowedClusters": ["standalone"]})
    path = f"/admin/v2/namespaces/{tenant}/ns"
    status, body = broker.admin(
        "PUT", path, {"encryption_required": True, "allowed_clusters": ["standalone"]}
    )
    assert status == 501
    assert body["reason"] == (
        "Namespace policies not implemented by keyshared: allowed_clusters, encryption_required"
    )
    status, body = broker.admin("PUT", path, {"replication_clusters": ["elsewhere"]})
    assert status == 412 and "elsewhere" in body["reason"]
    status, body = broker.admin("PUT", path, {"message_ttl_in_seconds": "soon"})
    assert status == 400 and "message_ttl_in_seconds" in body["reason"]
    status, body = broker.admin("PUT", path, {"subscription_types_enabled": ["KeyShared"]})
    assert status == 412 and "KeyShared" in body["reason"]
    # Nothing was created by the refused calls.
    assert broker.admin("GET", path)[0] == 404


def test_proxy_and_tls_settings_the_replicator_cannot_honour_are_refused_by_name(
    broker: BrokerProcess,
) -> None:
    sni = {
        "serviceUrl": "http://remote.example.com:8080",
        "brokerServiceUrlTls": "pulsar+ssl://broker.remote.example.com:6651",
        "proxyServiceUrl": "pulsar+ssl://ats-proxy.example.com:4443",
        "proxyProtocol": "SNI",
    }
    name = f"sni-{uuid.uuid4().hex[:8]}"
    path = f"/admin/v2/clusters/{name}"
    bad = [
        ({"proxyServiceUrl": "http://ats-proxy.example.com:4443"}, "Illegal proxy service url"),
        ({"proxyProtocol": "HTTP_CONNECT"}, "Illegal proxyProtocol HTTP_CONNECT"),
        ({"proxyServiceUrl": None}, "proxyProtocol SNI needs a proxyServiceUrl"),
        ({"proxyProtocol": None}, "proxyServiceUrl needs a proxyProtocol"),
        (
            {"proxyServiceUrl": "pulsar://ats-proxy.example.com:4080"},
            "proxyServiceUrl must be pulsar+ssl://",
        ),
        ({"brokerServiceUrlTls": None}, "proxyProtocol SNI needs a brokerServiceUrlTls"),
        (
            {"brokerServiceUrlTls": "pulsar+ssl://10.1.2.3:6651"},
            "SNI cannot carry the IP address 10.1.2.3",
        ),
    ]
    tls = ["brokerClientTlsEnabledWithKeyStore", "brokerClientSslFactoryPlugin"]
    bad += [
        ({tls[0]: True, "brokerClientTlsEnabled": True}, f"{tls[0]} is not supported"),
        ({tls[1]: "com.example.MySslFactory"}, f"{tls[1]} com.example.MySslFactory"),
    ]
    for change, reason in bad:
        status, body = broker.admin("PUT", path, {**sni, **change})
        assert status == 400 and reason in body["reason"], (change, status, body)
    assert broker.admin("GET", path)[0] == 404  # nothing half-stored
    # What pulsar-admin sends by default is fine.
    sni = {**sni, tls[0]: False, tls[1]: "org.apache.pulsar.common.util.DefaultPulsarSslFactory"}
    assert broker.admin("PUT", path, sni) == (204, None)
    assert ok(broker, "GET", path) == sni
    # An update is checked the same way.
    status, body = broker.admin("POST", path, {**sni, "proxyProtocol": "sni"})
    assert status == 400 and "Illegal proxyProtocol sni" in body["reason"]
    assert ok(broker, "GET", path) == sni
    assert broker.admin("DELETE", path) == (204, None)
