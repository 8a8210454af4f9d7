"""How the replicator reaches a remote cluster: with the credentials its ``ClusterData`` names
(a token here; TLS client certificates in ``test_geo_tls_auth.py``) and through the advertised
listener it names (``listenerName``). One local broker (cluster ``ca``) for the module and, per
test, a remote in a process of its own. About 25 s on ``-n 0``.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from keyshared.tokens import create_token
from tests.broker_process import BrokerProcess, free_port, quiet_logger
from tests.integration.admin_support import ok
from tests.integration.geo_support import client as _client
from tests.integration.geo_support import drain

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def local() -> Iterator[BrokerProcess]:
    b = BrokerProcess(conf={"clusterName": "ca"})
    try:
        b.start()
        ok(b, "PUT", "/admin/v2/tenants/geo", {"allowedClusters": ["ca"]})
        yield b
    finally:
        b.close()


def _allow(b: BrokerProcess, *clusters: str) -> None:
    """Add ``clusters`` to tenant ``geo``'s allowed clusters on ``b``."""
    allowed = ok(b, "GET", "/admin/v2/tenants/geo")["allowedClusters"]
    ok(b, "POST", "/admin/v2/tenants/geo", {"allowedClusters": sorted({*allowed, *clusters})})


def _wait(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


SECRET = b"geo-replication-test-secret-0123"
TOKEN_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"


def _admin(b: BrokerProcess, method: str, path: str, body: Any, token: str) -> int:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(b.web_url + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def test_replicator_authenticates_with_the_clusters_credentials(
    local: BrokerProcess, tmp_path: Path
) -> None:
    a = local
    key = tmp_path / "secret.key"
    key.write_bytes(SECRET)
    admin = create_token("admin", secret_key=SECRET)
    c = BrokerProcess(
        conf={
            "clusterName": "cc",
            "authenticationEnabled": "true",
            "authenticationProviders": (
                "org.apache.pulsar.broker.authentication.AuthenticationProviderToken"
            ),
            "tokenSecretKey": f"file://{key}",
            "authorizationEnabled": "true",
            "superUserRoles": "admin",
            "brokerClientAuthenticationPlugin": TOKEN_PLUGIN,
            "brokerClientAuthenticationParameters": f"token:{admin}",
        }
    )
    try:
        c.start()
        ns = "geo/auth"
        topic = f"persistent://{ns}/t-{uuid.uuid4().hex[:10]}"
        body = {"serviceUrl": a.web_url, "brokerServiceUrl": a.service_url}
        assert _admin(c, "PUT", "/admin/v2/clusters/ca", body, admin) == 204
        tenant = {"allowedClusters": ["ca", "cc"]}
        assert _admin(c, "PUT", "/admin/v2/tenants/geo", tenant, admin) == 204
        assert _admin(c, "PUT", f"/admin/v2/namespaces/{ns}", {}, admin) == 204
        grant = f"/admin/v2/namespaces/{ns}/permissions/repl"
        assert _admin(c, "POST", grant, ["produce"], admin) == 204
        # On ca: cluster cc with a token that cc refuses at first.
        wrong = create_token("repl", secret_key=b"not-the-secret-not-the-secret-00")
        cc = {
            "serviceUrl": c.web_url,
            "brokerServiceUrl": c.service_url,
            "authenticationPlugin": TOKEN_PLUGIN,
            "authenticationParameters": f"token:{wrong}",
        }
        ok(a, "PUT", "/admin/v2/clusters/cc", cc)
        _allow(a, "cc")
        ok(a, "PUT", f"/admin/v2/namespaces/{ns}", {})
        ok(a, "POST", f"/admin/v2/namespaces/{ns}/replication", ["ca", "cc"])
        client = _client(a)
        try:
            client.subscribe(topic, "audit").close()
            producer = client.create_producer(topic, batching_enabled=False)
            for i in range(10):
                producer.send(f"m{i}".encode())
        finally:
            client.close()
        stats = f"/admin/v2/persistent/{topic[len('persistent://') :]}/stats"
        time.sleep(1.0)
        rep = ok(a, "GET", stats)["replication"]["cc"]
        assert rep["connected"] is False and rep["replicationBacklog"] == 10
        # The right token: the replicator reads the cluster's data at its next attempt.
        cc["authenticationParameters"] = f"token:{create_token('repl', secret_key=SECRET)}"
        ok(a, "POST", "/admin/v2/clusters/cc", cc)
        _wait(lambda: ok(a, "GET", stats)["replication"]["cc"]["replicationBacklog"] == 0, 30)
        reader_client = pulsar.Client(
            c.service_url,
            authentication=pulsar.AuthenticationToken(admin),
            operation_timeout_seconds=10,
            logger=quiet_logger(),
        )
        try:
            reader = reader_client.create_reader(topic, pulsar.MessageId.earliest)
            got = [reader.read_next(timeout_millis=5000).data() for _ in range(10)]
        finally:
            reader_client.close()
        assert got == [f"m{i}".encode() for i in range(10)]
    finally:
        c.close()


def test_replicator_asks_for_the_clusters_listener(
    local: BrokerProcess,
) -> None:
    # The remote's internal (default) listener advertises a dead port; its "external" one the
    # port it serves. A cluster registered with listenerName "external" gets everything, the
    # same one without it is redirected to the dead port and gets nothing.
    a = local
    port, dead = free_port(), free_port()
    c = BrokerProcess(
        conf={
            "clusterName": "cl",
            "advertisedListeners": (
                f"internal:pulsar://127.0.0.1:{dead},external:pulsar://127.0.0.1:{port}"
            ),
        }
    )
    c.port = port
    try:
        c.start(same_ports=True)
        ok(c, "PUT", "/admin/v2/clusters/ca", {"serviceUrl": a.web_url})
        ok(c, "PUT", "/admin/v2/tenants/geo", {"allowedClusters": ["ca", "cl"]})
        for ns in ("geo/lst", "geo/lstx"):
            ok(c, "PUT", f"/admin/v2/namespaces/{ns}", {"deduplicationEnabled": True})
        body = {"serviceUrl": c.web_url, "brokerServiceUrl": c.service_url}
        ok(a, "PUT", "/admin/v2/clusters/cl", {**body, "listenerName": "external"})
        ok(a, "PUT", "/admin/v2/clusters/cm", body)
        _allow(a, "cl", "cm")
        ok(a, "PUT", "/admin/v2/namespaces/geo/lst", {"replication_clusters": ["ca", "cl"]})
        ok(a, "PUT", "/admin/v2/namespaces/geo/lstx", {"replication_clusters": ["ca", "cm"]})
        topic = f"persistent://geo/lst/t-{uuid.uuid4().hex[:10]}"
        elsewhere = f"persistent://geo/lstx/t-{uuid.uuid4().hex[:10]}"
        client = _client(a)
        try:
            for t in (topic, elsewhere):
                producer = client.create_producer(t, batching_enabled=False)
                for i in range(10):
                    producer.send(f"m{i}".encode())
        finally:
            client.close()

        def rest(t: str) -> str:
            return f"/admin/v2/persistent/{t[len('persistent://') :]}/stats"

        _wait(lambda: ok(a, "GET", rest(topic))["replication"]["cl"]["replicationBacklog"] == 0)
        reader_client = pulsar.Client(
            c.service_url,
            listener_name="external",
            operation_timeout_seconds=10,
            logger=quiet_logger(),
        )
        try:
            consumer = reader_client.subscribe(
                topic, "audit", initial_position=pulsar.InitialPosition.Earliest
            )
            got = [m.data() for m in drain(consumer, 10)]
        finally:
            reader_client.close()
        assert got == [f"m{i}".encode() for i in range(10)]

        def error(t: str) -> str:
            overview = ok(a, "GET", "/dashboard/api/overview")
            (shown,) = [x for x in overview["topics"] if x["name"] == t]
            return str((shown.get("replicationErrors") or {}).get("cm") or "")

        _wait(lambda: str(dead) in error(elsewhere))
        rep = ok(a, "GET", rest(elsewhere))["replication"]["cm"]
        assert rep["connected"] is False and rep["replicationBacklog"] == 10
    finally:
        c.close()
