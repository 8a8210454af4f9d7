"""Geo-replication through an SNI-routing proxy, Pulsar's PIP-60 way: the remote cluster's
``ClusterData`` names a ``proxyServiceUrl`` with ``proxyProtocol`` ``SNI``, and the replicator
opens every binary-protocol connection to the proxy with the broker's host name as the TLS SNI.

The remote ``ct`` is registered with ``brokerServiceUrlTls`` ``pulsar+ssl://ct-broker.test:1``,
a name that resolves nowhere on a port nothing listens on: only the proxy (``tests/sni_proxy.py``)
knows where ``ct-broker.test`` is. The remote's lookups answer ``localhost`` (its
``advertisedAddress``), so the replicator's redirect goes through the proxy too. Cluster ``cw``
names a host the proxy has no route for: nothing goes there. About 10 s on ``-n 0``.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pulsar
import pytest

from tests.broker_process import BrokerProcess, free_port
from tests.certs import make_certs
from tests.integration.admin_support import ok, tpath
from tests.integration.geo_support import client, drain, wait_for
from tests.sni_proxy import SniProxy

pytestmark = pytest.mark.integration


def test_replication_through_an_sni_proxy(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "tls")
    tls_port, web_tls_port = free_port(), free_port()
    remote = BrokerProcess(
        conf={
            "clusterName": "ct",
            "advertisedAddress": "localhost",
            "brokerServicePortTls": tls_port,
            "webServicePortTls": web_tls_port,
            "tlsCertificateFilePath": certs.cert,
            "tlsKeyFilePath": certs.key,
            "tlsTrustCertsFilePath": certs.ca,
        }
    )
    local = BrokerProcess(
        conf={
            "clusterName": "cs",
            "brokerClientTlsEnabled": "true",
            "brokerClientTrustCertsFilePath": certs.ca,
        }
    )
    broker = ("127.0.0.1", tls_port)
    proxy = SniProxy({"ct-broker.test": broker, "localhost": broker})
    dead = f"127.0.0.1:{free_port()}"
    try:
        proxy.start()
        for b in (remote, local):
            b.start()
        ct = {
            "serviceUrl": f"http://{dead}",
            "serviceUrlTls": f"https://127.0.0.1:{web_tls_port}",
            "brokerServiceUrl": f"pulsar://{dead}",
            "brokerServiceUrlTls": "pulsar+ssl://ct-broker.test:1",
            "proxyServiceUrl": proxy.url,
            "proxyProtocol": "SNI",
        }
        ok(local, "PUT", "/admin/v2/clusters/ct", ct)
        # (No admin URL: nothing to create there first, straight to the proxy.)
        cw = {**ct, "brokerServiceUrlTls": "pulsar+ssl://nowhere.test:6651", "serviceUrlTls": ""}
        ok(local, "PUT", "/admin/v2/clusters/cw", cw)
        ok(remote, "PUT", "/admin/v2/clusters/cs", {"serviceUrl": local.web_url})
        ok(local, "PUT", "/admin/v2/tenants/geo", {"allowedClusters": ["cs", "ct", "cw"]})
        ok(remote, "PUT", "/admin/v2/tenants/geo", {"allowedClusters": ["cs", "ct"]})
        ok(remote, "PUT", "/admin/v2/namespaces/geo/sni", {"deduplicationEnabled": True})
        ok(local, "PUT", "/admin/v2/namespaces/geo/sni", {"replication_clusters": ["cs", "ct"]})
        ok(local, "PUT", "/admin/v2/namespaces/geo/snix", {"replication_clusters": ["cs", "cw"]})
        topic = f"persistent://geo/sni/t-{uuid.uuid4().hex[:10]}"
        unrouted = f"persistent://geo/snix/t-{uuid.uuid4().hex[:10]}"
        sent = [(f"k{i % 3}", f"m{i}".encode()) for i in range(20)]
        c = client(local)
        try:
            for t in (topic, unrouted):
                producer = c.create_producer(t, batching_enabled=False)
                for key, value in sent:
                    producer.send(value, partition_key=key)
        finally:
            c.close()

        def replication(t: str, cluster: str) -> dict[str, Any]:
            return dict(ok(local, "GET", tpath(t, "stats"))["replication"][cluster])

        wait_for(lambda: replication(topic, "ct")["replicationBacklog"] == 0)
        r = client(remote)
        try:
            consumer = r.subscribe(topic, "audit", initial_position=pulsar.InitialPosition.Earliest)
            got = [(m.partition_key(), m.data()) for m in drain(consumer, len(sent))]
        finally:
            r.close()
        assert got == sent
        # Both the registered name and the lookup's redirect went through the proxy.
        assert proxy.routed["ct-broker.test"] >= 1 and proxy.routed["localhost"] >= 1
        # A host the proxy cannot route: refused there, everything kept here.
        wait_for(lambda: "nowhere.test" in proxy.refused)
        rep = replication(unrouted, "cw")
        assert rep["connected"] is False and rep["replicationBacklog"] == len(sent)
        assert "nowhere.test" not in proxy.routed
        overview = ok(local, "GET", "/dashboard/api/overview")
        (shown,) = [t for t in overview["topics"] if t["name"] == unrouted]
        assert "through the SNI proxy" in shown["replicationErrors"]["cw"]
    finally:
        for b in (remote, local):
            b.close()
        proxy.close()
