"""ConnectionLimits: the admission rule of brokerMaxConnections and brokerMaxConnectionsPerIp."""

from __future__ import annotations

from keyshared.server.connection_limits import (
    MAX_CONNECTIONS_MESSAGE,
    ConnectionLimits,
)


def test_unlimited_by_default() -> None:
    limits = ConnectionLimits(0, 0)
    for i in range(1000):
        assert limits.admit("10.0.0.1", f"/10.0.0.1:{i}") is None
    assert limits.active == 1000


def test_per_ip_limit_counts_each_address_and_frees_on_release() -> None:
    limits = ConnectionLimits(0, 2)
    assert limits.admit("10.0.0.1", "/10.0.0.1:1") is None
    assert limits.admit("10.0.0.1", "/10.0.0.1:2") is None
    assert (
        limits.admit("10.0.0.1", "/10.0.0.1:3")
        == "Reached the maximum number of connections on address/10.0.0.1:3"
    )
    assert limits.admit("10.0.0.2", "/10.0.0.2:1") is None
    limits.release("10.0.0.1")
    assert limits.admit("10.0.0.1", "/10.0.0.1:4") is None
    assert (limits.active, limits.rejected_per_ip, limits.rejected_max_connections) == (3, 1, 0)


def test_broker_limit_applies_before_the_per_ip_one_and_refusals_count_nothing() -> None:
    limits = ConnectionLimits(2, 1)
    assert limits.admit("a", "/a:1") is None
    assert limits.admit("b", "/b:1") is None
    assert limits.admit("a", "/a:2") == MAX_CONNECTIONS_MESSAGE
    assert limits.admit("c", "/c:1") == MAX_CONNECTIONS_MESSAGE
    assert limits.active == 2 and limits.connections_from("c") == 0
    limits.release("b")
    limits.release("a")
    assert limits.connections_from("a") == 0 and limits.active == 0
    assert limits.admit("c", "/c:2") is None
