"""Geo-replication over TLS: ``pulsar+ssl`` to the remote's ``brokerServiceUrlTls`` and its
admin API at ``serviceUrlTls``, trusted through ``brokerClientTrustCertsFilePath``, as Pulsar's
broker does with ``brokerClientTlsEnabled``.

The remote cluster ``ct`` serves TLS with the test certificates (``tests/certs.py``); its plain
URLs are registered on ``cs`` as dead ports, so what arrives came over TLS. The same remote
registered as ``cx`` with a ``ClusterData`` trusting another CA gets nothing. About 12 s on
``-n 0``.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pulsar
import pytest

from tests.broker_process import BrokerProcess, free_port, quiet_logger
from tests.certs import make_certs
from tests.integration.admin_support import ok, tpath
from tests.integration.geo_support import wait_for

pytestmark = pytest.mark.integration


def test_replication_over_tls_with_the_brokers_trust_settings(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "tls")
    other_ca = make_certs(tmp_path / "other", name="someone else")
    tls_port, web_tls_port = free_port(), free_port()
    remote = BrokerProcess(
        conf={
            "clusterName": "ct",
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
    dead = f"127.0.0.1:{free_port()}"
    try:
        for b in (remote, local):
            b.start()
        ct = {
            "serviceUrl": f"http://{dead}",
            "serviceUrlTls": f"https://127.0.0.1:{web_tls_port}",
            "brokerServiceUrl": f"pulsar://{dead}",
            "brokerServiceUrlTls": f"pulsar+ssl://127.0.0.1:{tls_port}",
        }
        ok(local, "PUT", "/admin/v2/clusters/ct", ct)
        # The same remote as cluster "cx", with TLS settings of its own (ClusterData's, which
        # win over the broker's) trusting another CA.
        cx = {
            **ct,
            "brokerClientTlsEnabled": True,
            "brokerClientTrustCertsFilePath": str(other_ca.ca),
        }
        ok(local, "PUT", "/admin/v2/clusters/cx", cx)
        ok(remote, "PUT", "/admin/v2/clusters/cs", {"serviceUrl": local.web_url})
        ok(local, "PUT", "/admin/v2/tenants/geo", {"allowedClusters": ["cs", "ct", "cx"]})
        ok(remote, "PUT", "/admin/v2/tenants/geo", {"allowedClusters": ["cs", "ct"]})
        for b in (local, remote):
            ok(b, "PUT", "/admin/v2/namespaces/geo/tls", {"deduplicationEnabled": True})
        ok(local, "POST", "/admin/v2/namespaces/geo/tls/replication", ["cs", "ct"])
        # Partitioned on cs only: the replicators create it on ct through https.
        topic = f"persistent://geo/tls/t-{uuid.uuid4().hex[:10]}"
        ok(local, "PUT", tpath(topic, "partitions"), 2)
        unseen = f"persistent://geo/tlsx/t-{uuid.uuid4().hex[:10]}"
        ok(local, "PUT", "/admin/v2/namespaces/geo/tlsx", {"replication_clusters": ["cs", "cx"]})
        client = pulsar.Client(local.service_url, logger=quiet_logger())
        try:
            for t in (topic, unseen):
                producer = client.create_producer(t, batching_enabled=False)
                for i in range(10):
                    producer.send(f"m{i}".encode(), partition_key=f"k{i % 3}")
        finally:
            client.close()

        def replication(t: str, path: str, cluster: str) -> dict[str, Any]:
            return dict(ok(local, "GET", tpath(t, path))["replication"][cluster])

        wait_for(lambda: replication(topic, "partitioned-stats", "ct")["replicationBacklog"] == 0)
        assert ok(remote, "GET", tpath(topic, "partitions")) == {"partitions": 2}
        assert ok(remote, "GET", tpath(topic, "partitioned-stats"))["msgInCounter"] == 10
        # Towards "cx", whose trust file does not trust the remote's certificate: nothing.
        rep = replication(unseen, "stats", "cx")
        assert rep["connected"] is False and rep["replicationBacklog"] == 10
        status, _ = remote.admin("GET", tpath(unseen, "stats"))
        assert status == 404
        # Why, as the dashboard shows it on hover.
        overview = ok(local, "GET", "/dashboard/api/overview")
        (shown,) = [t for t in overview["topics"] if t["name"] == unseen]
        assert "CERTIFICATE_VERIFY_FAILED" in shown["replicationErrors"]["cx"]
    finally:
        for b in (remote, local):
            b.close()
