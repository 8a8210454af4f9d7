"""Pulsar's client-CI security set-up on a live broker: TLS on both ports, the Tls, Token and Basic
providers chained, an anonymous role, authorization, and HTTP lookups.

The broker.conf is shaped like Apache pulsar-client-python's ``standalone-ssl.conf`` (written
here, with certificates and an htpasswd file made here), and the namespaces are set up with the
same REST calls its CI script makes: a namespace open to the anonymous role (the script opens
``public/default``; here ``public`` already exists, and Pulsar answers 409 to a PUT of an existing
tenant too, so a fresh tenant ``open`` plays that part), ``private/auth`` only to
``token-principal`` and the super users.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
import pulsar
import pytest
from passlib.hash import apr_md5_crypt, des_crypt

from tests.broker_process import BrokerProcess, free_port, quiet_logger
from tests.certs import Certs, make_certs, make_client_cert

pytestmark = pytest.mark.integration

SECRET = os.urandom(32)
RUN = uuid.uuid4().hex[:8]
PRIVATE = f"persistent://private/auth/t-{RUN}"
TIMEOUT_MS = 10_000


def token(role: str) -> str:
    return jwt.encode({"sub": role}, SECRET, algorithm="HS256")


@dataclass
class CiBroker:
    broker: BrokerProcess
    certs: Certs
    tls_port: int
    web_tls_port: int

    @property
    def tls_url(self) -> str:
        return f"pulsar+ssl://localhost:{self.tls_port}"

    def http(self, method: str, path: str, auth: str | None = None, body: Any = None) -> int:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.broker.web_url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if auth:
            req.add_header("Authorization", auth)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as err:
            return int(err.code)


def htpasswd() -> str:
    """One user per hash form Pulsar's basic provider reads (and bcrypt, as htpasswd -B)."""
    import bcrypt

    return "\n".join(
        [
            f"admin:{apr_md5_crypt.hash('123456')}",
            f"cryptuser:{des_crypt.hash('crypt-pw')}",
            f"bcryptuser:{bcrypt.hashpw(b'bcrypt-pw', bcrypt.gensalt(rounds=4)).decode()}",
        ]
    )


def ci_conf(root: Path, certs: Certs, tls_port: int, web_tls_port: int) -> dict[str, object]:
    (root / "secret.key").write_bytes(SECRET)
    (root / ".htpasswd").write_text(htpasswd() + "\n")
    return {
        "advertisedAddress": "localhost",
        "clusterName": "standalone",
        "brokerServicePortTls": tls_port,
        "webServicePortTls": web_tls_port,
        "tlsEnabled": "true",
        "tlsCertificateFilePath": certs.cert,
        "tlsKeyFilePath": certs.key,
        "tlsTrustCertsFilePath": certs.ca,
        "tlsAllowInsecureConnection": "false",
        "anonymousUserRole": "anonymous",
        "authenticationEnabled": "true",
        "authenticationProviders": (
            "org.apache.pulsar.broker.authentication.AuthenticationProviderTls,"
            "org.apache.pulsar.broker.authentication.AuthenticationProviderToken,"
            "org.apache.pulsar.broker.authentication.AuthenticationProviderBasic"
        ),
        "authorizationEnabled": "true",
        "tokenSecretKey": f"file://{root / 'secret.key'}",
        "superUserRoles": "localhost,superUser,admin",
        "basicAuthConf": root / ".htpasswd",
    }


@pytest.fixture(scope="module")
def ci(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CiBroker]:
    root = tmp_path_factory.mktemp("ci")
    certs = make_certs(root / "tls")
    tls_port, web_tls_port = free_port(), free_port()
    broker = BrokerProcess(conf=ci_conf(root, certs, tls_port, web_tls_port))
    try:
        broker.start()
        ci = CiBroker(broker, certs, tls_port, web_tls_port)
        su = f"Bearer {token('superUser')}"
        # The REST calls of the client suite's CI script. As Pulsar's standalone, the broker made
        # neither the public tenant nor public/default: its own client has no credentials.
        public = {"adminRoles": ["anonymous"], "allowedClusters": ["standalone"]}
        assert ci.http("PUT", "/admin/v2/tenants/public", su, public) == 204
        default_ns = {"auth_policies": {"namespace_auth": {"anonymous": ["produce", "consume"]}}}
        assert ci.http("PUT", "/admin/v2/namespaces/public/default", su, default_ns) == 204
        assert ci.http("PUT", "/admin/v2/tenants/open", su, {"adminRoles": ["anonymous"],
                       "allowedClusters": ["standalone"]}) == 204  # fmt: skip
        both = ["produce", "consume"]
        grants = {"anonymous": both, "cryptuser": both, "bcryptuser": both}
        open_ns = {"auth_policies": {"namespace_auth": grants}}
        assert ci.http("PUT", "/admin/v2/namespaces/open/default", su, open_ns) == 204
        assert ci.http("PUT", "/admin/v2/tenants/private", su, {"adminRoles": [],
                       "allowedClusters": ["standalone"]}) == 204  # fmt: skip
        closed = {"auth_policies": {"namespace_auth": {"token-principal": ["produce", "consume"]}}}
        assert ci.http("PUT", "/admin/v2/namespaces/private/auth", su, closed) == 204
        yield ci
    finally:
        broker.close()


def round_trip(url: str, topic: str, **client_args: Any) -> None:
    """Subscribe, produce one message, receive it: through ``url`` with ``client_args``."""
    client = pulsar.Client(url, logger=quiet_logger(), operation_timeout_seconds=10, **client_args)
    try:
        consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
        producer = client.create_producer(topic)
        producer.send(b"hello")
        assert consumer.receive(TIMEOUT_MS).data() == b"hello"
    finally:
        client.close()


def tls_args(ci: CiBroker, **more: Any) -> dict[str, Any]:
    return {"tls_trust_certs_file_path": str(ci.certs.ca), **more}


# --- each provider, each service URL ------------------------------------------------------------


def test_anonymous_clients_use_the_open_namespace_on_every_url(ci: CiBroker) -> None:
    topic = f"persistent://open/default/anon-{RUN}"
    round_trip(ci.broker.service_url, topic)
    round_trip(ci.broker.web_url, topic + "-http")  # HTTP lookup
    round_trip(ci.tls_url, topic + "-tls", **tls_args(ci))


def test_short_topic_names_reach_the_public_default_the_script_created(ci: CiBroker) -> None:
    # The fixture's PUTs made public and public/default (the standalone could not), with the
    # anonymous role as the tenant's admin and with grants on the namespace.
    round_trip(ci.broker.service_url, f"short-{RUN}")
    assert ci.http("PUT", f"/admin/v2/persistent/public/default/p-{RUN}/partitions", None, 2) == 204


def test_anonymous_clients_are_refused_on_the_private_namespace(ci: CiBroker) -> None:
    client = pulsar.Client(ci.broker.service_url, logger=quiet_logger())
    try:
        with pytest.raises(pulsar.AuthorizationError):
            client.create_producer(PRIVATE + "-anon")
        # A namespace that does not exist is not found (the client suite's asyncio test).
        with pytest.raises(pulsar.TopicNotFound):
            client.create_producer("tenant/ns/no-such-namespace")
    finally:
        client.close()


def test_token_principal_reaches_the_private_namespace(ci: CiBroker) -> None:
    auth = pulsar.AuthenticationToken(token("token-principal"))
    round_trip(ci.broker.service_url, PRIVATE + "-token", authentication=auth)
    round_trip(ci.broker.web_url, PRIVATE + "-token-http", authentication=auth)
    round_trip(ci.tls_url, PRIVATE + "-token-tls", authentication=auth, **tls_args(ci))


@pytest.mark.parametrize(
    ("user", "password"),
    [("admin", "123456"), ("cryptuser", "crypt-pw"), ("bcryptuser", "bcrypt-pw")],
)
def test_basic_users_of_each_hash_form(ci: CiBroker, user: str, password: str) -> None:
    # Only admin is a super user: the others may use the open namespace.
    ns = "private/auth" if user == "admin" else "open/default"
    topic = f"persistent://{ns}/basic-{user}-{RUN}"
    auth = pulsar.AuthenticationBasic(user, password)
    round_trip(ci.broker.service_url, topic, authentication=auth)
    round_trip(ci.broker.web_url, topic + "-http", authentication=auth)


def test_wrong_basic_password_is_refused_over_both_protocols(ci: CiBroker) -> None:
    topic = f"persistent://open/default/wrong-{RUN}"
    auth = pulsar.AuthenticationBasic("admin", "wrong")
    client = pulsar.Client(
        ci.broker.service_url,
        authentication=auth,
        logger=quiet_logger(),
        operation_timeout_seconds=3,
    )
    try:
        # The Python client reports a refused CONNECT as a timeout (research/pulsar-protocol.md).
        with pytest.raises((pulsar.AuthenticationError, pulsar.Timeout)):
            client.create_producer(topic)
    finally:
        client.close()
    # Over HTTP the lookup is answered 401; the C++ client reports a failed HTTP call as a
    # ConnectError, which it retries until its operation timeout.
    bad = "Basic " + base64.b64encode(b"admin:wrong").decode()
    assert (
        ci.http("GET", "/lookup/v2/topic/persistent/" + topic[len("persistent://") :], bad) == 401
    )
    client = pulsar.Client(
        ci.broker.web_url, authentication=auth, logger=quiet_logger(), operation_timeout_seconds=3
    )
    try:
        with pytest.raises((pulsar.ConnectError, pulsar.Timeout)):
            client.create_producer(topic)
    finally:
        client.close()


def test_basic_method_no_provider_serves_falls_back_to_the_anonymous_role(ci: CiBroker) -> None:
    # As Pulsar's ServerCnx: an unknown method gets anonymousUserRole, which may not use private.
    auth = pulsar.AuthenticationBasic("admin", "123456", "unknown")
    client = pulsar.Client(ci.broker.service_url, authentication=auth, logger=quiet_logger())
    try:
        with pytest.raises(pulsar.AuthorizationError):
            client.create_producer(PRIVATE + "-unknown-method")
    finally:
        client.close()


def test_tls_client_certificate_common_name_is_the_role(ci: CiBroker) -> None:
    cert, key = make_client_cert(ci.certs, "superUser")
    auth = pulsar.AuthenticationTLS(str(cert), str(key))
    round_trip(ci.tls_url, PRIVATE + "-tls-su", authentication=auth, **tls_args(ci))
    # A certificate for a role without permission proves that role, and is refused there.
    cert2, key2 = make_client_cert(ci.certs, "nobody")
    client = pulsar.Client(
        ci.tls_url,
        authentication=pulsar.AuthenticationTLS(str(cert2), str(key2)),
        logger=quiet_logger(),
        **tls_args(ci),
    )
    try:
        with pytest.raises(pulsar.AuthorizationError):
            client.create_producer(PRIVATE + "-tls-nobody")
    finally:
        client.close()


def https_status(ci: CiBroker, path: str, cert: tuple[Path, Path] | None) -> int:
    ctx = ssl.create_default_context(cafile=str(ci.certs.ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    url = f"https://localhost:{ci.web_tls_port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=10, context=ctx) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def test_tls_client_certificate_is_the_role_on_the_https_admin_port(ci: CiBroker) -> None:
    assert https_status(ci, "/admin/v2/tenants", make_client_cert(ci.certs, "superUser")) == 200
    # Another certificate proves another role; none at all is the anonymous role.
    assert https_status(ci, "/admin/v2/tenants", make_client_cert(ci.certs, "nobody")) == 403
    assert https_status(ci, "/admin/v2/tenants", None) == 403
    # The official client on an https:// service URL: the HTTP lookup and the broker both take
    # the certificate's CN.
    cert, key = make_client_cert(ci.certs, "token-principal")
    auth = pulsar.AuthenticationTLS(str(cert), str(key))
    url = f"https://localhost:{ci.web_tls_port}"
    round_trip(url, PRIVATE + "-https-cert", authentication=auth, **tls_args(ci))


def test_admin_api_takes_basic_credentials_and_anonymous_requests(ci: CiBroker) -> None:
    basic = "Basic " + base64.b64encode(b"admin:123456").decode()
    assert ci.http("GET", "/admin/v2/tenants", basic) == 200
    bad = "Basic " + base64.b64encode(b"admin:nope").decode()
    assert ci.http("GET", "/admin/v2/tenants", bad) == 401
    # No credentials: the anonymous role, a tenant admin of open, not a super user.
    assert ci.http("GET", "/admin/v2/namespaces/open") == 200
    assert ci.http("GET", "/admin/v2/tenants") == 403


def test_http_lookup_answers_the_advertised_address(ci: CiBroker) -> None:
    req = urllib.request.Request(
        ci.broker.web_url + f"/lookup/v2/topic/persistent/open/default/lk-{RUN}"
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        data = json.loads(resp.read())
    assert data["brokerUrl"] == f"pulsar://localhost:{ci.broker.port}"
    assert data["brokerUrlTls"] == f"pulsar+ssl://localhost:{ci.tls_port}"
    assert data["httpUrl"] == f"http://localhost:{ci.broker.web_port}"


# --- settings the broker cannot honour stop it ---------------------------------------------------


@pytest.mark.parametrize(
    ("conf", "named"),
    [
        ({"tlsAllowInsecureConnection": "true"}, "tlsAllowInsecureConnection"),
        ({"tlsProtocols": "TLSv1.2,TLSv1.3"}, "tlsProtocols"),
        ({"tlsProtocols": "SSLv3"}, "SSLv3"),
        ({"tlsCiphers": "NO_SUCH_CIPHER"}, "tlsCiphers"),
        ({"basicAuthConf": ""}, "basicAuthConf"),
        ({"authenticationProviders": "com.example.MyProvider"}, "com.example.MyProvider"),
    ],
)
def test_settings_that_cannot_be_honoured_stop_the_broker(
    tmp_path: Path, conf: dict[str, str], named: str
) -> None:
    certs = make_certs(tmp_path / "tls")
    base = ci_conf(tmp_path, certs, free_port(), free_port())
    if conf.get("tlsProtocols") == "TLSv1.2,TLSv1.3":
        # Valid protocols without any TLS port: refused too (nothing to apply them to).
        for key in ("brokerServicePortTls", "webServicePortTls"):
            base.pop(key)
        base["authenticationProviders"] = (
            "org.apache.pulsar.broker.authentication.AuthenticationProviderToken"
        )
    base.update(conf)
    conf_file = tmp_path / "broker.conf"
    conf_file.write_text("".join(f"{k}={v}\n" for k, v in base.items()))
    proc = subprocess.run(
        [sys.executable, "-m", "keyshared.cli", "standalone", "--config", str(conf_file),
         "--data-dir", str(tmp_path / "d"), "--broker-port", "0", "--web-port", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert named in proc.stderr
