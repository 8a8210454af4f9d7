"""Connection limits and keep-alive against a real broker: ``brokerMaxConnectionsPerIp`` and
``brokerMaxConnections`` refuse a connection at accept with Pulsar's ERROR (the official client
times out retrying, and connects once a slot frees); ``keepAliveIntervalSeconds`` pings a silent
client and closes it when nothing answers, and closes a socket that never sends CONNECT, while a
client that answers PONG stays. About 12 s on -n 0 (two brokers, keepAliveIntervalSeconds=1)."""

from __future__ import annotations

import ssl
import threading
import time
from pathlib import Path

import pulsar
import pytest

from keyshared.protocol import commands, pb
from tests.broker_process import BrokerProcess, free_port
from tests.certs import make_certs
from tests.integration.conftest import make_client
from tests.integration.test_disk_full import metric, wait_for
from tests.raw_client import ConnectionClosed, RawClient

T = pb.BaseCommand


def _raw_from(broker: BrokerProcess, source_ip: str) -> RawClient:
    """A raw connection to the broker from the loopback address ``source_ip``."""
    return RawClient("127.0.0.1", broker.port, source_ip=source_ip)


def _refusal(raw: RawClient) -> pb.CommandError:
    """The ERROR the broker answers a refused connection with, before closing it."""
    frames = raw.wait_closed(timeout=5)
    assert [f.type for f in frames] == [T.ERROR], frames
    return frames[0].command.error


def test_connections_over_the_limits_are_refused_at_accept(fresh_broker: BrokerProcess) -> None:
    fresh_broker.conf.update(brokerMaxConnections=3, brokerMaxConnectionsPerIp=2)
    fresh_broker.start()
    opened: list[RawClient] = []
    client: pulsar.Client | None = None
    try:
        for ip in ("127.0.0.1", "127.0.0.1"):
            opened.append(_raw_from(fresh_broker, ip))
            opened[-1].handshake()
        # A third from the same address: refused by the per-IP limit, with Pulsar's message.
        third = _raw_from(fresh_broker, "127.0.0.1")
        port = third.sock.getsockname()[1]
        err = _refusal(third)
        assert err.error == pb.NotAllowedError
        assert err.request_id == (1 << 64) - 1
        assert err.message == (
            f"Reached the maximum number of connections on address/127.0.0.1:{port}"
        )
        # Another address still gets in, up to the broker's limit ...
        opened.append(_raw_from(fresh_broker, "127.0.0.2"))
        opened[-1].handshake()
        # ... past which every address is refused.
        err = _refusal(_raw_from(fresh_broker, "127.0.0.3"))
        assert err.error == pb.NotAllowedError
        assert err.message == "Reached the maximum number of connections"

        # The official client sees its connection closed and retries until its operation
        # timeout: the create fails with Timeout, and no session was ever half-open.
        client = make_client(fresh_broker.service_url, operation_timeout_seconds=2)
        with pytest.raises(pulsar.Timeout):
            client.create_producer("persistent://public/default/limited")
        # A slot from 127.0.0.1 frees: the client's next attempt gets in and publishes.
        opened.pop(0).close()
        producer = client.create_producer("persistent://public/default/limited")
        producer.send(b"admitted")

        assert metric(fresh_broker, "pulsar_active_connections") == 3
        rejected_ip = metric(fresh_broker, "keyshared_connections_rejected_per_ip_total")
        rejected_max = metric(fresh_broker, "keyshared_connections_rejected_max_connections_total")
        assert rejected_ip == 1
        # The 127.0.0.3 one, then each of the client's attempts while three were open.
        assert rejected_max is not None and rejected_max >= 2
        # Accepted: 3 raw + the client's; refused connections are not "created" (as Pulsar).
        assert metric(fresh_broker, "pulsar_connection_created_total_count") == 4
        assert metric(fresh_broker, "pulsar_connection_create_success_count") == 4
        assert metric(fresh_broker, "pulsar_connection_closed_total_count") == 1
    finally:
        for raw in opened:
            raw.close()
        if client is not None:
            client.close()


def test_keepalive_pings_silent_clients_and_closes_those_that_do_not_answer(
    fresh_broker: BrokerProcess,
) -> None:
    fresh_broker.conf["keepAliveIntervalSeconds"] = 1
    fresh_broker.start()
    silent = RawClient.to(fresh_broker.service_url)
    answering = RawClient.to(fresh_broker.service_url)
    mute = RawClient.to(fresh_broker.service_url)  # never sends CONNECT
    try:
        silent.handshake()
        answering.handshake()
        started = time.monotonic()
        # The answering client reads (and answers PINGs) for 5 s on its own thread.
        listener = threading.Thread(target=lambda: list(answering.frames(timeout=5)))
        listener.start()
        # The silent client reads but never answers: a PING comes after an interval of
        # silence, then the broker closes the connection after another one.
        got: list[int] = []
        with pytest.raises(ConnectionClosed):
            deadline = started + 8
            while time.monotonic() < deadline:
                if silent._fill(deadline):
                    while (frame := silent.decoder.next_frame()) is not None:
                        got.append(frame.type)
        closed_after = time.monotonic() - started
        assert got == [T.PING], got
        assert closed_after >= 1.5, closed_after  # pinged, then given an interval to answer
        # A socket that never completed the handshake is closed too, with nothing sent.
        mute.wait_closed_silently(timeout=4)
        # The client that answered the broker's PINGs (RawClient.frames does) stays connected.
        listener.join()
        assert sum(f.type == T.PING for f in answering.received) >= 2
        answering.ping_pong(timeout=2)
        assert metric(fresh_broker, "keyshared_keepalive_timeouts_total") == 2
        assert metric(fresh_broker, "pulsar_active_connections") == 1
    finally:
        silent.close()
        answering.close()
        mute.close()


def test_negative_limits_are_refused_by_name(fresh_broker: BrokerProcess) -> None:
    fresh_broker.conf["brokerMaxConnectionsPerIp"] = -1
    with pytest.raises(RuntimeError, match="brokerMaxConnectionsPerIp: must be 0"):
        fresh_broker.start()


def test_commands_count_as_answers(fresh_broker: BrokerProcess) -> None:
    """A client busy with other commands is never closed for not sending PONG itself."""
    fresh_broker.conf["keepAliveIntervalSeconds"] = 1
    fresh_broker.start()
    raw = RawClient.to(fresh_broker.service_url)
    try:
        raw.handshake()
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            # Ask for a PONG every 0.4 s but never answer the broker's PINGs.
            raw.send(commands.ping())
            deadline = time.monotonic() + 0.4
            while raw._fill(deadline):
                pass
        raw.ping_pong(timeout=2)
    finally:
        raw.close()


def test_the_tls_listener_shares_the_count(fresh_broker: BrokerProcess, tmp_path: Path) -> None:
    """One count for both listeners: with one plain connection open, brokerMaxConnections=1
    refuses a TLS one (the ERROR arrives over TLS), and the reverse once the plain one closes."""
    certs = make_certs(tmp_path / "tls")
    tls_port = free_port()
    fresh_broker.conf.update(
        brokerMaxConnections=1,
        brokerServicePortTls=tls_port,
        tlsCertificateFilePath=certs.cert,
        tlsKeyFilePath=certs.key,
        tlsTrustCertsFilePath=certs.ca,
    )
    fresh_broker.start()
    context = ssl.create_default_context(cafile=str(certs.ca))

    def tls_client() -> RawClient:
        raw = RawClient("127.0.0.1", tls_port)
        raw.sock = context.wrap_socket(raw.sock, server_hostname="127.0.0.1")
        return raw

    plain = RawClient.to(fresh_broker.service_url)
    secure: RawClient | None = None
    try:
        plain.handshake()
        err = _refusal(tls_client())
        assert err.message == "Reached the maximum number of connections"
        plain.close()
        wait_for(lambda: metric(fresh_broker, "pulsar_active_connections") == 0, 5, "plain closed")
        secure = tls_client()
        secure.handshake()
        err = _refusal(RawClient.to(fresh_broker.service_url))
        assert err.message == "Reached the maximum number of connections"
    finally:
        plain.close()
        if secure is not None:
            secure.close()
