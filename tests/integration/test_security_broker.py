"""Nobody gets in: token authentication, namespace permissions and TLS on a live broker.

One broker serves the module with ``authenticationEnabled``, ``authorizationEnabled`` (super user
``admin``), an HS256 secret key given as ``file:``, and TLS on both the binary and the web port
(certificates made here with ``cryptography``: a CA and a server certificate for 127.0.0.1).

Every refusal test checks three things: the attempt is refused the way Pulsar refuses it, nothing
of the secret topic (its name, its messages) reaches the refused client, and the *witnesses* (an
authorized official client on the plain port and one on the TLS port, each with a producer and a
consumer) keep working on the same connections before and after.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import http.client
import json
import os
import socket
import ssl
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
import pulsar
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from keyshared.admin.http_auth import UNAUTHENTICATED_REASON, UNAUTHORIZED_REASON
from keyshared.broker.errors import ServerError
from keyshared.protocol import Frame, commands, pb
from tests.broker_process import BrokerProcess, free_port, quiet_logger, running_broker
from tests.certs import Certs, make_certs
from tests.raw_client import RawClient

pytestmark = pytest.mark.integration

T = pb.BaseCommand
U64_MAX = (1 << 64) - 1
SECRET = os.urandom(32)
ADMIN, ALICE, MALLORY = "admin", "alice", "mallory"
RUN = uuid.uuid4().hex[:10]
SECRET_TOPIC = f"persistent://public/default/secret-{RUN}"
SECRET_PAYLOAD = f"classified-{RUN}".encode()
# What must never reach a refused client: the topic's name (or its unique part) and its data.
LEAKS = (SECRET_TOPIC.encode(), f"secret-{RUN}".encode(), SECRET_PAYLOAD, RUN.encode())


TOKEN_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"


def token(role: str, key: bytes = SECRET, **claims: Any) -> str:
    """An HS256 token for ``role``."""
    return jwt.encode({"sub": role, **claims}, key, algorithm="HS256")


def forge_hs256(claims: dict[str, Any], key: bytes) -> str:
    """An HS256 token made by hand (PyJWT refuses an asymmetric key as an HMAC secret)."""

    def b64(data: bytes) -> bytes:
        return base64.urlsafe_b64encode(data).rstrip(b"=")

    signed = b64(b'{"alg":"HS256","typ":"JWT"}') + b"." + b64(json.dumps(claims).encode())
    sig = hmac.new(key, signed, hashlib.sha256).digest()
    return (signed + b"." + b64(sig)).decode()


def expired(role: str) -> str:
    return token(role, exp=int(time.time()) - 60)


# --- certificates -------------------------------------------------------------------------------


# --- the broker and its clients -----------------------------------------------------------------


@dataclass
class Secured:
    """The module's broker and how to reach it."""

    broker: BrokerProcess
    certs: Certs
    tls_port: int
    web_tls_port: int

    @property
    def url(self) -> str:
        return self.broker.service_url

    @property
    def tls_url(self) -> str:
        return f"pulsar+ssl://127.0.0.1:{self.tls_port}"

    @property
    def https_url(self) -> str:
        return f"https://127.0.0.1:{self.web_tls_port}"

    def client_tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.certs.ca))

    def http(
        self,
        method: str,
        path: str,
        *,
        role: str | None = None,
        auth: str | None = None,
        body: Any = None,
        tls: bool = False,
    ) -> tuple[int, Any, dict[str, str]]:
        """One web call; ``role`` sends a valid token for it, ``auth`` an exact header."""
        base = self.https_url if tls else self.broker.web_url
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(base + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if role is not None:
            req.add_header("Authorization", f"Bearer {token(role)}")
        if auth is not None:
            req.add_header("Authorization", auth)
        ctx = self.client_tls() if tls else None
        try:
            with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
                raw, status, headers = resp.read(), resp.status, _lower(resp.headers.items())
        except urllib.error.HTTPError as err:
            raw, status, headers = err.read(), err.code, _lower(err.headers.items())
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode(errors="replace")
        return status, parsed, headers


def _lower(items: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in items}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    root = tmp_path_factory.mktemp("secured")
    certs = make_certs(root / "tls")
    key_file = root / "secret.key"
    key_file.write_bytes(SECRET)
    tls_port, web_tls_port = free_port(), free_port()
    broker = BrokerProcess(
        conf={
            "authenticationEnabled": "true",
            "authenticationProviders": (
                "org.apache.pulsar.broker.authentication.AuthenticationProviderToken"
            ),
            "tokenSecretKey": f"file://{key_file}",
            "authorizationEnabled": "true",
            "superUserRoles": ADMIN,
            # The standalone's own client creates public/default with these, as in Pulsar.
            "brokerClientAuthenticationPlugin": TOKEN_PLUGIN,
            "brokerClientAuthenticationParameters": f"token:{token(ADMIN)}",
            # Expiring tokens are looked at every second (Pulsar's default is 60).
            "authenticationRefreshCheckSeconds": 1,
            "brokerServicePortTls": tls_port,
            "webServicePortTls": web_tls_port,
            "tlsCertificateFilePath": certs.cert,
            "tlsKeyFilePath": certs.key,
            "tlsTrustCertsFilePath": certs.ca,
        }
    )
    try:
        broker.start()
        yield Secured(broker, certs, tls_port, web_tls_port)
    finally:
        broker.close()


def make_client(url: str, role_token: str | None = None, **kwargs: Any) -> pulsar.Client:
    kwargs.setdefault("operation_timeout_seconds", 10)
    kwargs.setdefault("connection_timeout_ms", 3000)
    if role_token is not None:
        kwargs["authentication"] = pulsar.AuthenticationToken(role_token)
    return pulsar.Client(url, logger=quiet_logger(), **kwargs)


@dataclass
class Witness:
    """An authorized producer and consumer of the secret topic on their own connection."""

    client: pulsar.Client
    name: str
    producer: pulsar.Producer = field(init=False)
    consumer: pulsar.Consumer = field(init=False)
    counter: int = 0

    def __post_init__(self) -> None:
        self.consumer = self.client.subscribe(
            SECRET_TOPIC, f"witness-{self.name}", initial_position=pulsar.InitialPosition.Latest
        )
        self.producer = self.client.create_producer(SECRET_TOPIC, batching_enabled=False)

    def round_trip(self, n: int = 2) -> None:
        """Publish ``n`` secret messages and receive them (skipping others' messages)."""
        expected = set()
        for _ in range(n):
            payload = SECRET_PAYLOAD + f"-{self.name}-{self.counter}".encode()
            self.counter += 1
            self.producer.send(payload)
            expected.add(payload)
        while expected:
            msg = self.consumer.receive(timeout_millis=5000)
            self.consumer.acknowledge(msg)
            expected.discard(msg.data())


@pytest.fixture(scope="module")
def witnesses(secured: Secured) -> Iterator[list[Witness]]:
    plain = make_client(secured.url, token(ADMIN))
    over_tls = make_client(
        secured.tls_url, token(ADMIN), tls_trust_certs_file_path=str(secured.certs.ca)
    )
    try:
        yield [Witness(plain, "plain"), Witness(over_tls, "tls")]
    finally:
        plain.close()
        over_tls.close()


@pytest.fixture
def others_keep_working(secured: Secured, witnesses: list[Witness]) -> Iterator[None]:
    """Both witnesses work before and after the test, on the same connections."""
    for w in witnesses:
        w.round_trip()
    yield
    assert secured.broker.proc is not None and secured.broker.proc.poll() is None, "broker died"
    for w in witnesses:
        w.round_trip()


def assert_no_leak(data: bytes | str | object) -> None:
    """Nothing of the secret topic in what a refused client received."""
    raw = data if isinstance(data, bytes) else str(data).encode()
    for secret in LEAKS:
        assert secret not in raw, f"leaked {secret!r}"


def frames_text(frames: list[Frame]) -> bytes:
    return b"".join(str(f.command).encode() + (f.payload or b"") for f in frames)


def raw_connection(secured: Secured, *, tls: bool) -> RawClient:
    raw = RawClient("127.0.0.1", secured.tls_port if tls else secured.broker.port)
    if tls:
        raw.sock = secured.client_tls().wrap_socket(raw.sock, server_hostname="127.0.0.1")
    return raw


def requests_for_the_secret(topic: str = SECRET_TOPIC) -> bytes:
    """LOOKUP, PARTITIONED_METADATA, PRODUCER, SUBSCRIBE and FLOW on ``topic``, as bytes."""
    return b"".join(
        [
            commands.lookup(topic=topic, request_id=101),
            commands.partitioned_metadata(topic=topic, request_id=102),
            commands.producer(topic=topic, producer_id=1, request_id=103),
            commands.subscribe(
                topic=topic,
                subscription="spy",
                sub_type=pb.CommandSubscribe.Exclusive,
                consumer_id=2,
                request_id=104,
                initial_position=pb.CommandSubscribe.Earliest,
            ),
            commands.flow(consumer_id=2, permits=1000),
        ]
    )


# --- the happy paths ----------------------------------------------------------------------------


def test_token_client_produces_and_consumes_on_plain_and_tls_ports(
    secured: Secured, witnesses: list[Witness]
) -> None:
    """The official client's AuthenticationToken works on pulsar:// and pulsar+ssl://."""
    for w in witnesses:
        w.round_trip(5)
    status, stats, _ = secured.http(
        "GET",
        "/admin/v2/persistent/public/default/" + SECRET_TOPIC.rsplit("/", 1)[1] + "/stats",
        role=ADMIN,
        tls=True,
    )
    assert status == 200
    assert {"witness-plain", "witness-tls"} <= set(stats["subscriptions"])


# --- authentication on the binary port ----------------------------------------------------------

BAD_CREDENTIALS = {
    "missing": ("none", None),
    "empty-token": ("token", b""),
    "malformed": ("token", b"this-is-not-a-jwt"),
    "malformed-parts": ("token", b"eyJhbGciOiJIUzI1NiJ9.e30.x"),
    "wrong-signature": ("token", token(ADMIN, key=os.urandom(32)).encode()),
    "expired": ("token", expired(ADMIN).encode()),
    "alg-none": ("token", jwt.encode({"sub": ADMIN}, "", algorithm="none").encode()),
    "unknown-method": ("basic", b"admin:admin"),
}


@pytest.mark.usefixtures("others_keep_working")
@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
@pytest.mark.parametrize("case", list(BAD_CREDENTIALS))
def test_bad_credentials_get_authentication_error_and_nothing_else(
    secured: Secured, case: str, tls: bool
) -> None:
    method, data = BAD_CREDENTIALS[case]
    with raw_connection(secured, tls=tls) as raw:
        # The requests ride in the same packet as CONNECT: none of them may be served.
        raw.send(
            commands.connect(auth_method_name=method, auth_data=data) + requests_for_the_secret()
        )
        frames = raw.wait_closed(5.0)
    assert [f.type for f in frames] == [T.ERROR], frames
    err = frames[0].command.error
    assert int(err.error) == ServerError.AuthenticationError
    assert err.request_id == U64_MAX
    assert_no_leak(frames_text(frames))
    if data:
        assert data.decode(errors="replace") not in err.message


@pytest.mark.usefixtures("others_keep_working")
@pytest.mark.parametrize("case", ["missing", "wrong-signature", "expired"])
def test_official_client_with_bad_credentials_cannot_produce_or_consume(
    secured: Secured, case: str
) -> None:
    """The Python client sees an auth failure as a timeout (research/pulsar-protocol.md §2)."""
    bad = {"missing": None, "wrong-signature": token(ADMIN, key=os.urandom(32))}
    role_token = bad.get(case, expired(ADMIN))
    client = make_client(secured.url, role_token, operation_timeout_seconds=2)
    try:
        started = time.monotonic()
        with pytest.raises(pulsar.PulsarException) as info:
            client.create_producer(SECRET_TOPIC)
        assert isinstance(info.value, pulsar.Timeout | pulsar.AuthenticationError)
        assert time.monotonic() - started < 8
    finally:
        client.close()


@pytest.mark.usefixtures("others_keep_working")
def test_refresh_with_a_bad_token_closes_the_connection(secured: Secured) -> None:
    with raw_connection(secured, tls=False) as raw:
        raw.send(commands.connect(auth_method_name="token", auth_data=token(ADMIN).encode()))
        raw.expect(T.CONNECTED)
        raw.send(
            commands.auth_response(auth_method_name="token", auth_data=expired(ADMIN).encode())
        )
        raw.send(requests_for_the_secret())
        frames = raw.wait_closed(5.0)
    assert all(f.type != T.MESSAGE for f in frames)
    assert_no_leak(frames_text(frames))


def expiring(role: str, seconds: float) -> str:
    return token(role, exp=int(time.time() + seconds))


def test_expired_token_is_challenged_and_a_fresh_one_keeps_the_connection(
    secured: Secured,
) -> None:
    with raw_connection(secured, tls=False) as raw:
        raw.send(commands.connect(auth_method_name="token", auth_data=expiring(ADMIN, 1).encode()))
        raw.expect(T.CONNECTED)
        challenge = raw.expect(T.AUTH_CHALLENGE, timeout=5.0).authChallenge.challenge
        assert (challenge.auth_method_name, challenge.auth_data) == ("token", b"PulsarAuthRefresh")
        raw.send(
            commands.auth_response(
                auth_method_name="token", auth_data=expiring(ADMIN, 600).encode()
            )
        )
        time.sleep(2.5)  # two more checks: the fresh token holds
        assert all(f.type != T.AUTH_CHALLENGE for f in raw.ping_pong())


def test_expired_token_not_refreshed_closes_the_connection(secured: Secured) -> None:
    with raw_connection(secured, tls=False) as raw:
        raw.send(commands.connect(auth_method_name="token", auth_data=expiring(ADMIN, 1).encode()))
        raw.expect(T.CONNECTED)
        raw.expect(T.AUTH_CHALLENGE, timeout=5.0)
        frames = raw.wait_closed(5.0)  # no answer by the next check
    assert all(f.type != T.MESSAGE for f in frames)


def test_client_that_cannot_refresh_is_closed_when_its_token_expires(secured: Secured) -> None:
    with raw_connection(secured, tls=False) as raw:
        raw.send(
            commands.connect(
                auth_method_name="token",
                auth_data=expiring(ADMIN, 1).encode(),
                supports_auth_refresh=False,
            )
        )
        raw.expect(T.CONNECTED)
        frames = raw.wait_closed(6.0)
    assert all(f.type != T.AUTH_CHALLENGE for f in frames)


def test_official_client_refreshes_an_expiring_token_on_the_same_connection(
    secured: Secured,
) -> None:
    """A token supplier gives the client a fresh short-lived token whenever asked: the broker's
    challenges are answered and the producer keeps its connection."""
    calls: list[float] = []

    def supplier() -> str:
        calls.append(time.time())
        return expiring(ADMIN, 1.5)

    client = make_client(
        secured.broker.service_url, authentication=pulsar.AuthenticationToken(supplier)
    )
    try:
        topic = f"persistent://public/default/refresh-{uuid.uuid4().hex[:8]}"
        producer = client.create_producer(topic, batching_enabled=False)
        path = "/admin/v2/" + topic.replace("://", "/") + "/stats"

        def connected_since() -> str:
            status, stats, _ = secured.http("GET", path, role=ADMIN)
            assert status == 200, stats
            return str(stats["publishers"][0]["connectedSince"])

        since = connected_since()
        deadline = time.time() + 5
        while time.time() < deadline:
            producer.send(b"still here")
            time.sleep(0.2)
        assert len(calls) >= 3, "the broker asked for fresh credentials as they expired"
        assert connected_since() == since, "the producer never had to reconnect"
    finally:
        client.close()


# --- authorization on the binary port -----------------------------------------------------------


def test_role_without_permission_is_refused_alike_for_existing_and_unknown_topics(
    secured: Secured, witnesses: list[Witness]
) -> None:
    """mallory has a valid token and no permission: every request on the namespace is refused
    with AuthorizationError, the same way whether the topic exists or not, and no message of the
    secret topic arrives."""
    witnesses[0].round_trip()
    answers: dict[str, list[tuple[int, int]]] = {}
    for label, topic in (("secret", SECRET_TOPIC), ("unknown", f"{SECRET_TOPIC}-nope")):
        with raw_connection(secured, tls=False) as raw:
            raw.send(commands.connect(auth_method_name="token", auth_data=token(MALLORY).encode()))
            raw.expect(T.CONNECTED)
            raw.send(requests_for_the_secret(topic))
            frames = raw.ping_pong()
        codes = []
        for f in frames:
            c = f.command
            if f.type == T.LOOKUP_RESPONSE:
                assert c.lookupTopicResponse.response == pb.CommandLookupTopicResponse.Failed
                assert not c.lookupTopicResponse.brokerServiceUrl
                codes.append((f.type, int(c.lookupTopicResponse.error)))
            elif f.type == T.PARTITIONED_METADATA_RESPONSE:
                r = c.partitionMetadataResponse
                assert r.response == pb.CommandPartitionedTopicMetadataResponse.Failed
                codes.append((f.type, int(r.error)))
            else:
                assert f.type == T.ERROR, f
                codes.append((f.type, int(c.error.error)))
            text = str(c).replace(topic, "<asked>")
            assert_no_leak(text.encode() + (f.payload or b""))
        answers[label] = codes
    assert answers["secret"] == answers["unknown"]
    assert [code for _, code in answers["secret"]] == [ServerError.AuthorizationError] * 4


def test_role_without_permission_cannot_list_the_namespace(
    secured: Secured, witnesses: list[Witness]
) -> None:
    """Pattern subscriptions list a namespace's topics: that needs a permission on it too."""
    witnesses[0].round_trip()  # the secret topic exists
    with raw_connection(secured, tls=False) as raw:
        raw.send(commands.connect(auth_method_name="token", auth_data=token(MALLORY).encode()))
        raw.expect(T.CONNECTED)
        raw.send(commands.get_topics_of_namespace(request_id=7, namespace="public/default"))
        frames = raw.ping_pong()
    assert_no_leak(frames_text(frames))
    assert [(f.type, int(f.command.error.error)) for f in frames] == [
        (T.ERROR, ServerError.AuthorizationError)
    ]


@pytest.mark.usefixtures("others_keep_working")
def test_namespace_permissions_granted_and_revoked_through_the_admin_api(secured: Secured) -> None:
    ns = "/admin/v2/namespaces/public/default/permissions"
    local = SECRET_TOPIC.rsplit("/", 1)[1]
    stats = f"/admin/v2/persistent/public/default/{local}/stats"
    subs = f"/admin/v2/persistent/public/default/{local}/subscriptions"
    alice = make_client(secured.url, token(ALICE))
    try:
        # No permission: no producer, no consumer, no stats, no topic list.
        with pytest.raises(pulsar.AuthorizationError):
            alice.create_producer(SECRET_TOPIC)
        with pytest.raises(pulsar.AuthorizationError):
            alice.subscribe(SECRET_TOPIC, "alice-sub")
        for path in (stats, subs, "/admin/v2/persistent/public/default"):
            assert secured.http("GET", path, role=ALICE)[:2] == (
                403,
                {"reason": UNAUTHORIZED_REASON},
            )
        # Only the tenant's admins (here: the super user) grant; alice cannot grant herself.
        assert secured.http("POST", f"{ns}/{ALICE}", role=ALICE, body=["produce"])[0] == 403
        assert secured.http("GET", ns, role=ALICE)[0] == 403

        assert secured.http("POST", f"{ns}/{ALICE}", role=ADMIN, body=["produce"])[0] == 204
        assert secured.http("GET", ns, role=ADMIN)[1] == {ALICE: ["produce"]}
        producer = alice.create_producer(SECRET_TOPIC, batching_enabled=False)
        producer.send(b"from alice")
        with pytest.raises(pulsar.AuthorizationError):
            alice.subscribe(SECRET_TOPIC, "alice-sub")
        assert secured.http("GET", stats, role=ALICE)[0] == 200
        assert secured.http("GET", subs, role=ALICE)[0] == 403

        body = ["produce", "consume"]
        assert secured.http("POST", f"{ns}/{ALICE}", role=ADMIN, body=body)[0] == 204
        assert secured.http("GET", ns, role=ADMIN)[1] == {ALICE: ["consume", "produce"]}
        consumer = alice.subscribe(
            SECRET_TOPIC, "alice-sub", initial_position=pulsar.InitialPosition.Latest
        )
        producer.send(b"alice again")
        assert consumer.receive(timeout_millis=5000).data() == b"alice again"
        assert secured.http("GET", subs, role=ALICE)[0] == 200
        # mallory gains nothing from alice's grant
        assert secured.http("GET", stats, role=MALLORY)[0] == 403

        assert secured.http("POST", f"{ns}/{ALICE}", role=ADMIN, body=["bogus"])[0] == 422
        assert secured.http("GET", ns, role=ADMIN)[1] == {ALICE: ["consume", "produce"]}
        assert secured.http("DELETE", f"{ns}/{ALICE}", role=ADMIN)[0] == 204
        assert secured.http("GET", ns, role=ADMIN)[1] == {}
        with pytest.raises(pulsar.AuthorizationError):
            alice.create_producer(SECRET_TOPIC)
        with pytest.raises(pulsar.AuthorizationError):
            alice.subscribe(SECRET_TOPIC, "alice-sub-2")
        assert secured.http("GET", stats, role=ALICE)[0] == 403
        consumer.close()
        producer.close()
    finally:
        secured.http("DELETE", f"{ns}/{ALICE}", role=ADMIN)
        alice.close()
    # alice's subscription may delete only with consume: the admin cleans up
    secured.http(
        "DELETE", f"/admin/v2/persistent/public/default/{local}/subscription/alice-sub", role=ADMIN
    )


def test_permission_endpoints_on_a_missing_namespace(secured: Secured) -> None:
    path = "/admin/v2/namespaces/public/no-such-ns/permissions"
    assert secured.http("GET", path, role=ADMIN)[0] == 404
    assert secured.http("POST", f"{path}/x", role=ADMIN, body=["consume"])[0] == 404
    # a non-admin learns nothing about which namespaces exist
    assert secured.http("GET", path, role=MALLORY)[:2] == (403, {"reason": UNAUTHORIZED_REASON})


# --- the admin API ------------------------------------------------------------------------------


def admin_calls() -> list[tuple[str, str, Any]]:
    local = SECRET_TOPIC.rsplit("/", 1)[1]
    topic = f"/admin/v2/persistent/public/default/{local}"
    return [
        ("GET", f"{topic}/stats", None),
        ("GET", f"{topic}/internalStats", None),
        ("GET", f"{topic}/subscriptions", None),
        ("GET", "/admin/v2/persistent/public/default", None),
        ("GET", "/admin/v2/persistent/public/default/partitioned", None),
        ("GET", "/admin/v2/namespaces/public/default/permissions", None),
        ("POST", f"/admin/v2/namespaces/public/default/permissions/{MALLORY}", ["consume"]),
        ("PUT", f"/admin/v2/persistent/public/default/planted-{RUN}", None),
        ("DELETE", f"{topic}?force=true", None),
        ("DELETE", f"{topic}/subscription/witness-plain", None),
        ("GET", "/admin/v2/tenants", None),
        ("GET", "/admin/v2/namespaces/public", None),
        ("GET", "/admin/v2/brokers/health", None),
        ("GET", "/metrics", None),
    ]


def assert_admin_state_unchanged(secured: Secured) -> None:
    topics = secured.http("GET", "/admin/v2/persistent/public/default", role=ADMIN)[1]
    assert SECRET_TOPIC in topics
    assert not any(f"planted-{RUN}" in t for t in topics)
    assert (
        MALLORY
        not in secured.http("GET", "/admin/v2/namespaces/public/default/permissions", role=ADMIN)[1]
    )


AUTH_HEADERS = {
    "none": None,
    "expired": f"Bearer {expired(ADMIN)}",
    "wrong-signature": f"Bearer {token(ADMIN, key=os.urandom(32))}",
    "malformed": "Bearer not.a.token",
    "basic": "Basic " + base64.b64encode(b"admin:admin").decode(),
    "bare-token": token(ADMIN),
}


@pytest.mark.usefixtures("others_keep_working")
@pytest.mark.parametrize("header", list(AUTH_HEADERS))
def test_admin_calls_without_a_valid_token_get_401(secured: Secured, header: str) -> None:
    for tls in (False, True):
        for method, path, body in admin_calls():
            status, reply, headers = secured.http(
                method, path, auth=AUTH_HEADERS[header], body=body, tls=tls
            )
            assert (status, reply) == (401, {"reason": UNAUTHENTICATED_REASON}), (method, path)
            assert headers.get("www-authenticate", "").startswith("Bearer")
    assert_admin_state_unchanged(secured)


@pytest.mark.usefixtures("others_keep_working")
def test_admin_calls_by_a_role_without_permission_get_403(secured: Secured) -> None:
    for method, path, body in admin_calls():
        status, reply, _ = secured.http(method, path, role=MALLORY, body=body)
        assert (status, reply) == (403, {"reason": UNAUTHORIZED_REASON}), (method, path)
    assert_admin_state_unchanged(secured)


def test_public_pages_need_no_token(secured: Secured) -> None:
    status, doc, _ = secured.http("GET", "/openapi.json")
    assert status == 200 and "paths" in doc
    assert_no_leak(json.dumps(doc))


# --- TLS ----------------------------------------------------------------------------------------


@pytest.mark.usefixtures("others_keep_working")
def test_plaintext_connection_to_the_tls_port_is_refused(secured: Secured) -> None:
    with socket.create_connection(("127.0.0.1", secured.tls_port), timeout=5) as sock:
        sock.sendall(
            commands.connect(auth_method_name="token", auth_data=token(ADMIN).encode())
            + requests_for_the_secret()
        )
        received = b""
        deadline = time.monotonic() + 5
        with contextlib.suppress(ConnectionError):
            while time.monotonic() < deadline:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
        assert time.monotonic() < deadline, "the TLS port kept a plaintext connection open"
    # At most a TLS alert record (content type 21), never a Pulsar frame.
    assert received == b"" or received[0] == 21, received[:64]
    assert b"keyshared" not in received
    assert_no_leak(received)


@pytest.mark.usefixtures("others_keep_working")
def test_official_client_speaking_plaintext_to_the_tls_port_fails(secured: Secured) -> None:
    client = make_client(
        f"pulsar://127.0.0.1:{secured.tls_port}", token(ADMIN), operation_timeout_seconds=2
    )
    try:
        with pytest.raises(pulsar.PulsarException):
            client.create_producer(SECRET_TOPIC)
    finally:
        client.close()


@pytest.mark.usefixtures("others_keep_working")
def test_client_that_does_not_trust_the_certificate_fails(secured: Secured, tmp_path: Path) -> None:
    stranger = make_certs(tmp_path / "other", name="someone else")
    client = make_client(
        secured.tls_url,
        token(ADMIN),
        tls_trust_certs_file_path=str(stranger.ca),
        operation_timeout_seconds=2,
    )
    try:
        with pytest.raises(pulsar.PulsarException):
            client.create_producer(SECRET_TOPIC)
    finally:
        client.close()


def test_https_admin_and_plain_http_to_the_tls_web_port(secured: Secured) -> None:
    status, topics, _ = secured.http(
        "GET", "/admin/v2/persistent/public/default", role=ADMIN, tls=True
    )
    assert status == 200 and SECRET_TOPIC in topics
    conn = http.client.HTTPConnection("127.0.0.1", secured.web_tls_port, timeout=5)
    try:
        with pytest.raises((http.client.HTTPException, OSError)):
            conn.request(
                "GET",
                "/admin/v2/persistent/public/default",
                headers={"Authorization": f"Bearer {token(ADMIN)}"},
            )
            resp = conn.getresponse()
            assert_no_leak(resp.read())
            raise AssertionError(f"plain HTTP on the TLS port answered {resp.status}")
    finally:
        conn.close()
    # A server certificate nobody vouched for is refused by a verifying HTTPS client.
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(secured.https_url + "/openapi.json", timeout=5)


# --- other configurations -----------------------------------------------------------------------


def test_rs256_public_key_given_as_data_url(tmp_path: Path) -> None:
    """tokenPublicKey as ``data:`` (DER, what ``create-key-pair`` writes); authentication without
    authorization lets every valid role in, and nothing else."""
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public_der = private.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    good = jwt.encode({"sub": "svc"}, private, algorithm="RS256")
    conf = {
        "authenticationEnabled": "true",
        "tokenPublicKey": "data:;base64," + base64.b64encode(public_der).decode(),
        # Without authorization any valid role may create public/default at start-up.
        "brokerClientAuthenticationPlugin": TOKEN_PLUGIN,
        "brokerClientAuthenticationParameters": f"token:{good}",
    }
    topic = f"persistent://public/default/rs-{RUN}"
    with running_broker(conf=conf) as broker:
        client = make_client(broker.service_url, good)
        try:
            consumer = client.subscribe(topic, "s")
            client.create_producer(topic).send(SECRET_PAYLOAD)
            assert consumer.receive(timeout_millis=5000).data() == SECRET_PAYLOAD
        finally:
            client.close()
        # HS256 signed with the public key's bytes (algorithm confusion) and an HS256 token.
        for bad in (
            forge_hs256({"sub": "svc"}, public_der),
            token("svc"),
        ):
            with RawClient.to(broker.service_url) as raw:
                raw.send(commands.connect(auth_method_name="token", auth_data=bad.encode()))
                frames = raw.wait_closed(5.0)
            assert [int(f.command.error.error) for f in frames] == [ServerError.AuthenticationError]
        req = urllib.request.Request(f"{broker.web_url}/admin/v2/persistent/public/default")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=5)
        assert info.value.code == 401
        assert_no_leak(info.value.read())
        req.add_header("Authorization", f"Bearer {good}")
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert topic in json.loads(resp.read())


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"authorizationEnabled": "true"}, "authorizationEnabled needs authenticationEnabled"),
        ({"authenticationEnabled": "true"}, "tokenSecretKey"),
        ({"brokerServicePortTls": "16651"}, "tlsCertificateFilePath"),
    ],
)
def test_broker_refuses_to_start_with_incomplete_security(
    conf: dict[str, str], message: str
) -> None:
    """Asked for security it cannot give, the broker exits (code 2) instead of serving open."""
    broker = BrokerProcess(conf=conf)
    try:
        with pytest.raises(RuntimeError, match="exited with 2") as info:
            broker.start(timeout=20)
        assert message in str(info.value)
        assert "listening" not in str(info.value)
    finally:
        broker.close()
