"""Which client certificate the replicator presents to a remote cluster, and what its CONNECT
says, as Pulsar's ``getReplicationClient`` decides: the cluster's ``authenticationPlugin`` over
the broker's ``brokerClientAuthenticationPlugin``; an ``AuthenticationTls`` plugin's certificate
over the ``brokerClientCertificateFilePath``/``...KeyFilePath`` files; the cluster's TLS settings
over the broker's when the cluster enables TLS itself.

A real TLS handshake with an in-process remote that asks for a client certificate, trusts the
test CA and records the certificate's CN and the CONNECT's authentication fields.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from keyshared.broker.client_credentials import CredentialsError
from keyshared.broker.replication.client import RemoteConnection, RemoteError
from keyshared.broker.replication.tls import remote_credentials, remote_urls
from keyshared.config import BrokerConfig
from keyshared.protocol import FrameDecoder, commands, pb
from keyshared.server.auth_service import certificate_common_name
from keyshared.server.tls import server_ssl_context
from tests.certs import Certs, make_certs, make_client_cert

TLS_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationTls"
TOKEN_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"


@dataclass
class Seen:
    """What the remote saw of one connection."""

    cn: str | None
    method: str
    has_data: bool
    data: bytes


async def _connect_once(certs: Certs, url_of: Any) -> Seen:
    """Serve one connection over TLS; ``url_of(port)`` gives the replicator's ``RemoteUrls``."""
    ctx = server_ssl_context(str(certs.cert), str(certs.key), str(certs.ca))
    seen: asyncio.Future[Seen] = asyncio.get_running_loop().create_future()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder(5 * 1024 * 1024)
        while data := await reader.read(65536):
            decoder.feed(data)
            for frame in decoder:
                if frame.command.type == pb.BaseCommand.CONNECT:
                    c = frame.command.connect
                    cn = certificate_common_name(writer.get_extra_info("peercert"))
                    if not seen.done():
                        seen.set_result(
                            Seen(cn, c.auth_method_name, c.HasField("auth_data"), c.auth_data)
                        )
                    writer.write(commands.connected())

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=ctx)
    port = server.sockets[0].getsockname()[1]
    try:
        urls, creds = url_of(port)
        conn = await RemoteConnection.open(urls.broker_url, creds, timeout=5, tls=urls.ssl)
        conn.close()
        return await asyncio.wait_for(seen, 5)
    finally:
        server.close()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("repl-tls"))


def _tls_params(certs: Certs, role: str, as_json: bool = False) -> str:
    cert, key = make_client_cert(certs, role)
    if as_json:
        return json.dumps({"tlsCertFile": str(cert), "tlsKeyFile": str(key)})
    return f"tlsCertFile:{cert},tlsKeyFile:{key}"


def _config(**keys: str) -> BrokerConfig:
    cfg = BrokerConfig()
    for key, value in keys.items():
        assert cfg.set(key, value)
    return cfg


def _seen(certs: Certs, data: dict[str, Any], cfg: BrokerConfig) -> Seen:
    def url_of(port: int) -> Any:
        cluster = {**data, "brokerServiceUrlTls": f"pulsar+ssl://127.0.0.1:{port}"}
        creds = remote_credentials("cr", cluster, cfg)
        return remote_urls("cr", cluster, cfg, creds), creds

    return asyncio.run(_connect_once(certs, url_of))


def test_the_clusters_tls_plugin_wins_over_the_brokers(certs: Certs) -> None:
    files = make_client_cert(certs, "from-files")
    cfg = _config(
        brokerClientTlsEnabled="true",
        brokerClientTrustCertsFilePath=str(certs.ca),
        brokerClientAuthenticationPlugin=TLS_PLUGIN,
        brokerClientAuthenticationParameters=_tls_params(certs, "broker-role"),
        brokerClientCertificateFilePath=str(files[0]),
        brokerClientKeyFilePath=str(files[1]),
    )
    cluster = {
        "authenticationPlugin": TLS_PLUGIN,
        "authenticationParameters": _tls_params(certs, "cluster-role", as_json=True),
    }
    seen = _seen(certs, cluster, cfg)
    # The certificate is the proof: method "tls" and no command data, as Pulsar's client sends.
    assert (seen.cn, seen.method, seen.has_data) == ("cluster-role", "tls", False)
    # Without a plugin of its own the cluster gets the broker's, whose certificate still wins
    # over the broker's certificate files.
    seen = _seen(certs, {}, cfg)
    assert (seen.cn, seen.method, seen.has_data) == ("broker-role", "tls", False)


def test_certificate_files_are_presented_under_another_plugin(certs: Certs) -> None:
    cert, key = make_client_cert(certs, "broker-files")
    cfg = _config(
        brokerClientTlsEnabled="true",
        brokerClientTrustCertsFilePath=str(certs.ca),
        brokerClientCertificateFilePath=str(cert),
        brokerClientKeyFilePath=str(key),
    )
    token = {"authenticationPlugin": TOKEN_PLUGIN, "authenticationParameters": "token:abc"}
    seen = _seen(certs, token, cfg)
    assert (seen.cn, seen.method, seen.data) == ("broker-files", "token", b"abc")
    # A cluster enabling TLS itself uses its own files (and trust), not the broker's.
    own_cert, own_key = make_client_cert(certs, "cluster-files")
    own = {
        "brokerClientTlsEnabled": True,
        "brokerClientTrustCertsFilePath": str(certs.ca),
        "brokerClientCertificateFilePath": str(own_cert),
        "brokerClientKeyFilePath": str(own_key),
    }
    seen = _seen(certs, own, cfg)
    assert (seen.cn, seen.method, seen.has_data) == ("cluster-files", "none", False)
    # Neither: no certificate at all.
    seen = _seen(
        certs, {**own, "brokerClientCertificateFilePath": "", "brokerClientKeyFilePath": ""}, cfg
    )
    assert seen.cn is None


def test_a_certificate_replaced_on_disk_is_the_one_presented(certs: Certs, tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "c.key"
    first = make_client_cert(certs, "before")
    cert.write_bytes(first[0].read_bytes())
    key.write_bytes(first[1].read_bytes())
    cfg = _config(brokerClientTlsEnabled="true", brokerClientTrustCertsFilePath=str(certs.ca))
    cluster = {
        "authenticationPlugin": "tls",
        "authenticationParameters": f"tlsCertFile:{cert},tlsKeyFile:{key}",
    }
    assert _seen(certs, cluster, cfg).cn == "before"
    second = make_client_cert(certs, "after")
    cert.write_bytes(second[0].read_bytes())
    key.write_bytes(second[1].read_bytes())
    later = os.stat(cert).st_mtime_ns + 1_000_000_000
    for f in (cert, key):
        os.utime(f, ns=(later, later))
    assert _seen(certs, cluster, cfg).cn == "after"


def test_unusable_tls_settings_are_refused_by_name(certs: Certs) -> None:
    plugin = {
        "authenticationPlugin": TLS_PLUGIN,
        "authenticationParameters": _tls_params(certs, "r"),
    }
    plain = {**plugin, "brokerServiceUrl": "pulsar://127.0.0.1:1"}
    cfg = _config()
    with pytest.raises(RemoteError, match="AuthenticationTls needs TLS"):
        remote_urls("cr", plain, cfg, remote_credentials("cr", plain, cfg))
    cert, _key = make_client_cert(certs, "half")
    half = {
        "brokerClientTlsEnabled": True,
        "brokerServiceUrlTls": "pulsar+ssl://127.0.0.1:1",
        "brokerClientCertificateFilePath": str(cert),
    }
    with pytest.raises(RemoteError, match="brokerClientKeyFilePath is not set"):
        remote_urls("cr", half, cfg, remote_credentials("cr", half, cfg))
    no_key = {"authenticationPlugin": TLS_PLUGIN, "authenticationParameters": f"tlsCertFile:{cert}"}
    with pytest.raises(
        CredentialsError, match=r"cluster cr authenticationParameters.*no tlsKeyFile"
    ):
        remote_credentials("cr", no_key, cfg)
    missing = {
        "brokerClientTlsEnabled": True,
        "brokerServiceUrlTls": "pulsar+ssl://127.0.0.1:1",
        "brokerClientCertificateFilePath": "/nonexistent/c.pem",
        "brokerClientKeyFilePath": "/nonexistent/c.key",
    }
    with pytest.raises(RemoteError, match=r"/nonexistent/c\.pem"):
        remote_urls("cr", missing, cfg, remote_credentials("cr", missing, cfg))
