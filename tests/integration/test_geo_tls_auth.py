"""Geo-replication authenticated by TLS client certificates, as Pulsar's ``AuthenticationTls``.

The remote cluster ``ct`` serves TLS with the test certificates (``tests/certs.py``),
authenticates by client certificate (the role is its CN) or token (for the test's own admin
calls) and authorizes by namespace permissions. The local cluster ``cs`` reaches it over TLS
only (its plain URLs are registered as dead ports) as two clusters: ``ct``, whose
``ClusterData`` carries an ``AuthenticationTls`` of its own (role ``repl``), and ``cu``, which
carries none and so gets the broker's ``brokerClientAuthenticationPlugin`` (role
``broker-role``). Each namespace grants only one of the two roles, so what arrives shows which
certificate was presented. About 10 s on ``-n 0``.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulsar
import pytest

from keyshared.tokens import create_token
from tests.broker_process import BrokerProcess, free_port, quiet_logger
from tests.certs import make_certs, make_client_cert
from tests.integration.admin_support import ok, tpath
from tests.integration.geo_support import drain

pytestmark = pytest.mark.integration

SECRET = b"geo-tls-auth-test-secret-0123456"
TLS_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationTls"
PROVIDERS = (
    "org.apache.pulsar.broker.authentication.AuthenticationProviderTls,"
    "org.apache.pulsar.broker.authentication.AuthenticationProviderToken"
)


def _wait(cond: Callable[[], bool], timeout: float = 30.0, why: Callable[[], Any] = str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out {why()}"
        time.sleep(0.1)


def _admin(b: BrokerProcess, method: str, path: str, body: Any, token: str) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(b.web_url + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
            return int(resp.status), json.loads(raw) if raw else None
    except urllib.error.HTTPError as err:
        return int(err.code), None


def _produce(b: BrokerProcess, topic: str, n: int) -> list[tuple[str, bytes]]:
    client = pulsar.Client(b.service_url, operation_timeout_seconds=10, logger=quiet_logger())
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        sent = [(f"k{i % 4}", f"m{i}".encode()) for i in range(n)]
        for key, value in sent:
            producer.send(value, partition_key=key)
        return sent
    finally:
        client.close()


def _received(b: BrokerProcess, topic: str, token: str, expect: int) -> list[tuple[str, bytes]]:
    client = pulsar.Client(
        b.service_url,
        authentication=pulsar.AuthenticationToken(token),
        operation_timeout_seconds=10,
        logger=quiet_logger(),
    )
    try:
        consumer = client.subscribe(
            topic, "audit", initial_position=pulsar.InitialPosition.Earliest
        )
        return [(m.partition_key(), m.data()) for m in drain(consumer, expect)]
    finally:
        client.close()


def test_replicator_authenticates_with_a_client_certificate(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "tls")
    (tmp_path / "secret.key").write_bytes(SECRET)
    admin = create_token("admin", secret_key=SECRET)
    repl_cert, repl_key = make_client_cert(certs, "repl")
    broker_cert, broker_key = make_client_cert(certs, "broker-role")
    tls_port, web_tls_port = free_port(), free_port()
    remote = BrokerProcess(
        conf={
            "clusterName": "ct",
            "brokerServicePortTls": tls_port,
            "webServicePortTls": web_tls_port,
            "tlsCertificateFilePath": certs.cert,
            "tlsKeyFilePath": certs.key,
            "tlsTrustCertsFilePath": certs.ca,
            "authenticationEnabled": "true",
            "authenticationProviders": PROVIDERS,
            "tokenSecretKey": f"file://{tmp_path / 'secret.key'}",
            "authorizationEnabled": "true",
            "superUserRoles": "admin",
        }
    )
    local = BrokerProcess(
        conf={
            "clusterName": "cs",
            "brokerClientTlsEnabled": "true",
            "brokerClientTrustCertsFilePath": certs.ca,
            "brokerClientAuthenticationPlugin": TLS_PLUGIN,
            "brokerClientAuthenticationParameters": (
                f"tlsCertFile:{broker_cert},tlsKeyFile:{broker_key}"
            ),
        }
    )
    dead = f"127.0.0.1:{free_port()}"
    try:
        for b in (remote, local):
            b.start()

        def on_remote(method: str, path: str, body: Any = None) -> Any:
            status, answer = _admin(remote, method, path, body, admin)
            assert 200 <= status < 300, (method, path, status)
            return answer

        on_remote("PUT", "/admin/v2/clusters/cs", {"serviceUrl": local.web_url})
        on_remote("PUT", "/admin/v2/tenants/geo", {"allowedClusters": ["cs", "ct"]})
        for ns in ("geo/a", "geo/b"):
            on_remote("PUT", f"/admin/v2/namespaces/{ns}", {"deduplicationEnabled": True})
        on_remote("POST", "/admin/v2/namespaces/geo/b/permissions/broker-role", ["produce"])
        # repl may look topics up on geo/a but not produce there (yet).
        on_remote("POST", "/admin/v2/namespaces/geo/a/permissions/repl", ["consume"])

        urls = {
            "serviceUrl": f"http://{dead}",
            "serviceUrlTls": f"https://127.0.0.1:{web_tls_port}",
            "brokerServiceUrl": f"pulsar://{dead}",
            "brokerServiceUrlTls": f"pulsar+ssl://127.0.0.1:{tls_port}",
        }
        own_cert = json.dumps({"tlsCertFile": str(repl_cert), "tlsKeyFile": str(repl_key)})
        ct = {**urls, "authenticationPlugin": TLS_PLUGIN, "authenticationParameters": own_cert}
        ok(local, "PUT", "/admin/v2/clusters/ct", ct)
        ok(local, "PUT", "/admin/v2/clusters/cu", urls)
        ok(local, "PUT", "/admin/v2/tenants/geo", {"allowedClusters": ["cs", "ct", "cu"]})
        ok(local, "PUT", "/admin/v2/namespaces/geo/a", {"replication_clusters": ["cs", "ct"]})
        ok(local, "PUT", "/admin/v2/namespaces/geo/b", {"replication_clusters": ["cs", "cu"]})
        topic_a = f"persistent://geo/a/t-{uuid.uuid4().hex[:10]}"
        topic_b = f"persistent://geo/b/t-{uuid.uuid4().hex[:10]}"
        sent_a = _produce(local, topic_a, 20)
        sent_b = _produce(local, topic_b, 20)

        def replication(topic: str, cluster: str) -> dict[str, Any]:
            return dict(ok(local, "GET", tpath(topic, "stats"))["replication"][cluster])

        # cu has no plugin of its own: the broker's certificate (broker-role, granted on geo/b).
        _wait(lambda: replication(topic_b, "cu")["replicationBacklog"] == 0)
        assert _received(remote, topic_b, admin, 20) == sent_b

        # ct's own certificate (repl) wins over the broker's; the remote authenticates it on the
        # binary protocol and refuses it the producer: nothing there, everything kept.
        def refusal() -> str:
            overview = ok(local, "GET", "/dashboard/api/overview")
            (shown,) = [t for t in overview["topics"] if t["name"] == topic_a]
            return str((shown.get("replicationErrors") or {}).get("ct") or "")

        _wait(lambda: "AuthorizationError" in refusal(), why=refusal)
        rep = replication(topic_a, "ct")
        assert rep["connected"] is False and rep["replicationBacklog"] == 20
        status, stats = _admin(remote, "GET", tpath(topic_a, "stats"), None, admin)
        assert status == 404 or stats["msgInCounter"] == 0, stats

        # Granted: the replicator's next attempt gets in; each message arrives once, in order.
        on_remote("POST", "/admin/v2/namespaces/geo/a/permissions/repl", ["produce", "consume"])
        _wait(lambda: replication(topic_a, "ct")["replicationBacklog"] == 0)
        assert _received(remote, topic_a, admin, 20) == sent_a
        publishers = on_remote("GET", tpath(topic_a, "stats"))["publishers"]
        assert [p["producerName"] for p in publishers] == ["pulsar.repl.cs-->ct"]
    finally:
        for b in (remote, local):
            b.close()
