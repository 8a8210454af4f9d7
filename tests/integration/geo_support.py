"""What the geo-replication tests share: clusters of real broker processes replicating a
namespace, and reading a topic until what is expected (and nothing more) has come."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pulsar

from tests.broker_process import BrokerProcess, quiet_logger
from tests.integration.admin_support import ok


def wait_for(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll ``cond`` every 0.1 s until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def client(b: BrokerProcess) -> pulsar.Client:
    """An official client on ``b`` with a short operation timeout and a quiet log."""
    return pulsar.Client(b.service_url, operation_timeout_seconds=10, logger=quiet_logger())


def register_cluster(b: BrokerProcess, name: str, other: BrokerProcess) -> None:
    """Register ``other`` on ``b`` as cluster ``name`` (updating it when already there)."""
    body = {"serviceUrl": other.web_url, "brokerServiceUrl": other.service_url}
    status, _ = b.admin("PUT", f"/admin/v2/clusters/{name}", body)
    if status == 409:
        ok(b, "POST", f"/admin/v2/clusters/{name}", body)
    else:
        assert status == 204


@contextmanager
def replicating(
    clusters: Mapping[str, dict[str, Any]], namespace: str
) -> Iterator[dict[str, BrokerProcess]]:
    """One broker per cluster name (with its extra config), each registering the others,
    allowing all of them on the namespace's tenant and replicating ``namespace`` to all, with
    deduplication on (as Pulsar's geo-replication guide sets it up)."""
    brokers = {
        name: BrokerProcess(conf={"clusterName": name, **conf}) for name, conf in clusters.items()
    }
    names = list(brokers)
    tenant = namespace.split("/")[0]
    try:
        for b in brokers.values():
            b.start()
        for name, b in brokers.items():
            for other, o in brokers.items():
                if other != name:
                    register_cluster(b, other, o)
            ok(b, "PUT", f"/admin/v2/tenants/{tenant}", {"allowedClusters": names})
            ok(b, "PUT", f"/admin/v2/namespaces/{namespace}", {"deduplicationEnabled": True})
            ok(b, "POST", f"/admin/v2/namespaces/{namespace}/replication", names)
        yield brokers
    finally:
        for b in brokers.values():
            b.close()


def drain(
    consumer: pulsar.Consumer, expect: int, timeout: float = 30.0, quiet: float = 1.5
) -> list[Any]:
    """Receive and ack until at least ``expect`` messages came and then none for ``quiet``
    seconds (to catch extra ones), or until ``timeout``."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    quiet_until: float | None = None
    while time.monotonic() < deadline:
        try:
            got.append(consumer.receive(timeout_millis=300))
            consumer.acknowledge(got[-1])
            quiet_until = None  # quiet means no message for the whole period
            continue
        except pulsar.Timeout:
            pass
        if len(got) >= expect:
            if quiet_until is None:
                quiet_until = time.monotonic() + quiet
            elif time.monotonic() >= quiet_until:
                break
    return got
