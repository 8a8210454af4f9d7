"""Security pieces without a broker: keys, token checks, permission decisions, path rules, config,
and the ``keyshared tokens`` command."""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.parse
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from keyshared.admin.http_auth import (
    NAMESPACE,
    PUBLIC,
    SUPER_USER,
    TENANT_ADMIN,
    Access,
    required_access,
)
from keyshared.broker.errors import BrokerError, ServerError
from keyshared.cli import main as cli_main
from keyshared.config import BrokerConfig, ConfigError
from keyshared.server.auth_token import (
    KeyFormatError,
    TokenAuthenticator,
    load_public_key,
    read_key,
)
from keyshared.server.authz import NamespaceAuthorizer, parse_roles
from keyshared.server.security import build_security
from keyshared.tokens import create_token, parse_relative_time

SECRET = bytes(range(32))


def hs(claims: dict[str, object], key: bytes = SECRET, alg: str = "HS256") -> bytes:
    return jwt.encode(claims, key, algorithm=alg).encode()


def rejected(auth: TokenAuthenticator, method: str, data: bytes) -> str:
    with pytest.raises(BrokerError) as info:
        auth.authenticate(method, data)
    assert info.value.code == ServerError.AuthenticationError
    return info.value.message


# --- key forms ----------------------------------------------------------------------------------


def test_read_key_accepts_pulsars_forms(tmp_path: Path) -> None:
    f = tmp_path / "secret.key"
    f.write_bytes(SECRET)
    b64 = base64.b64encode(SECRET).decode()
    assert read_key(f"data:;base64,{b64}") == SECRET
    assert read_key(f"data:application/octet-stream;base64,{b64}") == SECRET
    assert read_key("data:," + urllib.parse.quote_from_bytes(SECRET)) == SECRET
    assert read_key(f"file://{f}") == SECRET
    assert read_key(f"file:{f}") == SECRET
    assert read_key(str(f)) == SECRET
    assert read_key(b64) == SECRET


@pytest.mark.parametrize(
    "url", ["data:;base64,!!!", "data:nocomma", "file:///no/such/key", "not base64 at all!"]
)
def test_read_key_refuses_what_it_cannot_read(url: str) -> None:
    with pytest.raises(KeyFormatError):
        read_key(url)


def test_public_key_in_der_and_pem() -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
    der = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    pem = key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    assert load_public_key(der).public_numbers() == key.public_numbers()
    assert load_public_key(pem).public_numbers() == key.public_numbers()
    with pytest.raises(KeyFormatError):
        load_public_key(b"garbage")


# --- token checks -------------------------------------------------------------------------------


def test_valid_hs256_token_gives_its_subject() -> None:
    auth = TokenAuthenticator(secret_key=SECRET)
    assert auth.authenticate("token", hs({"sub": "alice"})) == "alice"
    assert auth.authenticate_http("Bearer " + hs({"sub": "bob"}).decode()) == "bob"


@pytest.mark.parametrize(
    ("method", "data", "why"),
    [
        ("none", b"", "Unsupported authentication method"),
        ("", b"", "Unsupported authentication method"),
        ("basic", b"alice:secret", "Unsupported authentication method"),
        ("token", b"", "malformed"),
        ("token", b"not-a-jwt", "malformed"),
        ("token", b"a.b.c", "malformed"),
        ("token", b"\xff\xfe", "malformed"),
        ("token", hs({"sub": "alice"}, key=bytes(32 * [7])), "signature"),
        ("token", hs({"sub": "alice", "exp": int(time.time()) - 5}), "expired"),
        # A day ahead: the parameters are made at collection, and a loaded run of the whole
        # suite can reach this test more than ten minutes later.
        ("token", hs({"sub": "alice", "nbf": int(time.time()) + 86_400}), "not valid yet"),
        ("token", hs({"role": "alice"}), "no role"),
        ("token", hs({"sub": ""}), "no role"),
        ("token", jwt.encode({"sub": "alice"}, "", algorithm="none").encode(), "refused"),
    ],
    ids=[
        "none",
        "empty-method",
        "basic",
        "empty",
        "garbage",
        "bad-base64",
        "non-ascii",
        "wrong-signature",
        "expired",
        "not-yet-valid",
        "no-sub",
        "empty-sub",
        "alg-none",
    ],
)
def test_bad_credentials_are_refused(method: str, data: bytes, why: str) -> None:
    message = rejected(TokenAuthenticator(secret_key=SECRET), method, data)
    assert why in message
    # The refusal never echoes the credentials.
    if data:
        assert data.decode(errors="replace") not in message


def test_tampered_claims_break_the_signature() -> None:
    header, _, sig = hs({"sub": "alice"}).decode().split(".")
    forged = base64.urlsafe_b64encode(b'{"sub":"admin"}').rstrip(b"=").decode()
    assert "signature" in rejected(
        TokenAuthenticator(secret_key=SECRET), "token", f"{header}.{forged}.{sig}".encode()
    )


@pytest.mark.parametrize("header", [None, "", "Basic YWxpY2U6eA==", "Bearer", "Bearer   "])
def test_http_without_a_bearer_token_is_refused(header: str | None) -> None:
    with pytest.raises(BrokerError) as info:
        TokenAuthenticator(secret_key=SECRET).authenticate_http(header)
    assert info.value.code == ServerError.AuthenticationError


@pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")
def test_short_secret_keys_are_refused_and_hmac_strength_follows_key_length() -> None:
    with pytest.raises(KeyFormatError):
        TokenAuthenticator(secret_key=b"too-short")
    auth32 = TokenAuthenticator(secret_key=SECRET)
    assert "refused" in rejected(auth32, "token", hs({"sub": "a"}, alg="HS512"))
    key64 = bytes(range(64))
    auth64 = TokenAuthenticator(secret_key=key64)
    assert auth64.authenticate("token", hs({"sub": "a"}, key=key64, alg="HS512")) == "a"


def test_rs256_public_key_and_algorithm_confusion() -> None:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public_pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    auth = TokenAuthenticator(public_key=load_public_key(public_pem), public_alg="RS256")
    good = jwt.encode({"sub": "svc"}, private, algorithm="RS256").encode()
    assert auth.authenticate("token", good) == "svc"
    # A token HMAC-signed with the public key as the secret must not pass.
    header = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').rstrip(b"=")
    body = base64.urlsafe_b64encode(b'{"sub":"admin"}').rstrip(b"=")
    import hashlib
    import hmac

    sig = hmac.new(public_pem, header + b"." + body, hashlib.sha256).digest()
    forged = header + b"." + body + b"." + base64.urlsafe_b64encode(sig).rstrip(b"=")
    assert "refused" in rejected(auth, "token", forged)
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert "signature" in rejected(
        auth, "token", jwt.encode({"sub": "svc"}, other, algorithm="RS256").encode()
    )


def test_public_alg_must_fit_the_key() -> None:
    rsa_pub = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
    ec_pub = ec.generate_private_key(ec.SECP256R1()).public_key()
    with pytest.raises(KeyFormatError):
        TokenAuthenticator(public_key=rsa_pub, public_alg="ES256")
    with pytest.raises(KeyFormatError):
        TokenAuthenticator(public_key=ec_pub, public_alg="RS256")
    with pytest.raises(KeyFormatError):
        TokenAuthenticator(public_key=rsa_pub, public_alg="HS256")


def test_custom_role_claim_audience_and_clock_skew() -> None:
    auth = TokenAuthenticator(
        secret_key=SECRET, auth_claim="role", audience_claim="aud", audience="keyshared", leeway=30
    )
    assert auth.authenticate("token", hs({"role": "r", "aud": "keyshared"})) == "r"
    assert auth.authenticate("token", hs({"role": "r", "aud": ["x", "keyshared"]})) == "r"
    assert "audience" in rejected(auth, "token", hs({"role": "r", "aud": "other"}))
    assert "audience" in rejected(auth, "token", hs({"role": "r"}))
    recently = int(time.time()) - 10
    assert auth.authenticate("token", hs({"role": "r", "aud": "keyshared", "exp": recently})) == "r"
    # Without a configured audience an aud claim is ignored, as in Pulsar.
    plain = TokenAuthenticator(secret_key=SECRET)
    assert plain.authenticate("token", hs({"sub": "s", "aud": "anything"})) == "s"


# --- authorization decisions --------------------------------------------------------------------


class Store:
    def __init__(self) -> None:
        self.grants: dict[str, dict[str, list[str]]] = {}
        self.admins: dict[str, list[str]] = {}

    def namespace_permissions(self, namespace: str) -> dict[str, list[str]]:
        return self.grants.get(namespace, {})

    def tenant_admin_roles(self, tenant: str) -> list[str]:
        return self.admins.get(tenant, [])

    def namespace_exists(self, namespace: str) -> bool:
        return namespace in self.grants


def authz_error(authz: NamespaceAuthorizer, role: str | None, topic: str, action: str) -> str:
    with pytest.raises(BrokerError) as info:
        authz.check(role, topic, action)
    assert info.value.code == ServerError.AuthorizationError
    return info.value.message


def test_namespace_permissions_super_users_and_tenant_admins() -> None:
    store = Store()
    store.grants["acme/orders"] = {"producer": ["produce"], "reader": ["consume"]}
    store.grants["acme/billing"] = {}
    store.grants["other/orders"] = {}
    store.admins["acme"] = ["acme-admin"]
    authz = NamespaceAuthorizer(store, parse_roles(" root , ops,"))
    t = "persistent://acme/orders/o1"
    for role in ("root", "ops", "acme-admin"):
        for action in ("lookup", "produce", "consume"):
            authz.check(role, t, action)
    authz.check("producer", t, "produce")
    authz.check("producer", t, "lookup")
    authz.check("reader", t, "consume")
    authz.check("reader", t, "lookup")
    authz_error(authz, "producer", t, "consume")
    authz_error(authz, "reader", t, "produce")
    for action in ("lookup", "produce", "consume"):
        authz_error(authz, "stranger", t, action)
        authz_error(authz, None, t, action)
        # A grant on one namespace and admin of one tenant give nothing elsewhere.
        authz_error(authz, "producer", "persistent://acme/billing/b", action)
        authz_error(authz, "acme-admin", "persistent://other/orders/o1", action)
    message = authz_error(authz, "stranger", t, "produce")
    assert "orders/o1" in message  # names only what was asked for
    store.grants["acme/orders"].pop("producer")
    authz_error(authz, "producer", t, "produce")  # a revoke applies to the next check
    assert not authz.is_super_user(None)
    assert authz.is_tenant_admin("acme-admin", "acme")
    assert not authz.is_tenant_admin("acme-admin", "other")
    with pytest.raises(BrokerError) as info:
        authz.check("root", "bad/name", "produce")
    assert info.value.code == ServerError.InvalidTopicName
    # A namespace that does not exist: not found for anyone, as Pulsar's clients expect.
    for role in ("root", "stranger", None):
        with pytest.raises(BrokerError) as info:
            authz.check(role, "persistent://acme/nowhere/t", "produce")
        assert info.value.code == ServerError.TopicNotFound
        assert info.value.message == "Namespace acme/nowhere does not exist"
    authz.check_namespace("reader", "acme/orders", "lookup")
    authz.check_namespace("acme-admin", "acme/billing", "lookup")
    for role in ("stranger", None, "producer"):
        with pytest.raises(BrokerError) as info:
            authz.check_namespace(role, "acme/billing", "lookup")
        assert info.value.code == ServerError.AuthorizationError
    with pytest.raises(BrokerError) as info:
        authz.check_namespace("root", "no-slash", "lookup")
    assert info.value.code == ServerError.InvalidTopicName


# --- which admin path needs what ----------------------------------------------------------------

T = "/admin/v2/persistent/acme/orders/o1"
S = "/admin/v2/schemas/acme/orders/o1"


@pytest.mark.parametrize(
    ("method", "path", "access"),
    [
        ("GET", "/", Access(PUBLIC)),
        ("GET", "/openapi.json", Access(PUBLIC)),
        ("GET", "/static/app.js", Access(PUBLIC)),
        ("GET", "/metrics", Access(SUPER_USER)),
        ("GET", "/metrics/", Access(SUPER_USER)),
        ("GET", "/admin/v2/brokers/health", Access(SUPER_USER)),
        ("GET", "/admin/v2/tenants", Access(SUPER_USER)),
        ("GET", "/admin/v2/tenants/acme", Access(TENANT_ADMIN, "acme")),
        ("PUT", "/admin/v2/tenants/acme", Access(SUPER_USER)),
        ("GET", "/admin/v2/namespaces/acme", Access(TENANT_ADMIN, "acme")),
        ("PUT", "/admin/v2/namespaces/acme/orders", Access(TENANT_ADMIN, "acme")),
        ("GET", "/admin/v2/namespaces/acme/orders/permissions", Access(TENANT_ADMIN, "acme")),
        (
            "POST",
            "/admin/v2/namespaces/acme/orders/permissions/r",
            Access(TENANT_ADMIN, "acme"),
        ),
        ("GET", "/admin/v2/namespaces/acme/orders/retention", Access(TENANT_ADMIN, "acme")),
        (
            "GET",
            "/admin/v2/namespaces/acme/orders/topics",
            Access(NAMESPACE, "acme", "acme/orders", "lookup"),
        ),
        (
            "GET",
            "/admin/v2/persistent/acme/orders",
            Access(NAMESPACE, "acme", "acme/orders", "lookup"),
        ),
        (
            "GET",
            "/admin/v2/persistent/acme/orders/partitioned",
            Access(NAMESPACE, "acme", "acme/orders", "lookup"),
        ),
        ("GET", T + "/stats", Access(NAMESPACE, "acme", "acme/orders", "lookup")),
        ("GET", T + "/internalStats", Access(NAMESPACE, "acme", "acme/orders", "lookup")),
        ("GET", T + "/partitioned-stats", Access(NAMESPACE, "acme", "acme/orders", "lookup")),
        ("GET", T + "/partitions", Access(NAMESPACE, "acme", "acme/orders", "lookup")),
        ("GET", T + "/subscriptions", Access(NAMESPACE, "acme", "acme/orders", "consume")),
        (
            "GET",
            T + "/subscription/s/position/1",
            Access(NAMESPACE, "acme", "acme/orders", "consume"),
        ),
        ("PUT", T + "/subscription/s", Access(NAMESPACE, "acme", "acme/orders", "consume")),
        (
            "POST",
            T + "/subscription/s/resetcursor/0",
            Access(NAMESPACE, "acme", "acme/orders", "consume"),
        ),
        (
            "GET",
            T + "/subscription/s/hashBlockers",
            Access(NAMESPACE, "acme", "acme/orders", "consume"),
        ),
        ("GET", T + "/examinemessage", Access(NAMESPACE, "acme", "acme/orders", "consume")),
        (
            "GET",
            T + "/messageid/1700000000000",
            Access(NAMESPACE, "acme", "acme/orders", "consume"),
        ),
        ("PUT", T, Access(TENANT_ADMIN, "acme")),
        ("DELETE", T, Access(TENANT_ADMIN, "acme")),
        ("PUT", T + "/partitions", Access(TENANT_ADMIN, "acme")),
        ("PUT", T + "/unload", Access(TENANT_ADMIN, "acme")),
        ("POST", T + "/stats", Access(TENANT_ADMIN, "acme")),
        ("GET", T + "/somethingNew", Access(TENANT_ADMIN, "acme")),
        # Schemas: reading is a lookup, uploading needs produce, deleting is administrative.
        ("GET", S + "/schema", Access(NAMESPACE, "acme", "acme/orders", "lookup")),
        ("GET", S + "/schema/3", Access(NAMESPACE, "acme", "acme/orders", "lookup")),
        ("GET", S + "/schemas", Access(NAMESPACE, "acme", "acme/orders", "lookup")),
        ("POST", S + "/compatibility", Access(NAMESPACE, "acme", "acme/orders", "lookup")),
        ("POST", S + "/schema", Access(NAMESPACE, "acme", "acme/orders", "produce")),
        ("DELETE", S + "/schema", Access(TENANT_ADMIN, "acme")),
        ("GET", "/admin/v2/clusters", Access(SUPER_USER)),
        ("GET", "/admin/v2/persistent/acme", Access(SUPER_USER)),
        ("GET", "/some/new/page", Access(SUPER_USER)),
        ("GET", "/admin/v3/anything", Access(SUPER_USER)),
    ],
)
def test_required_access(method: str, path: str, access: Access) -> None:
    assert required_access(method, path) == access


# --- configuration ------------------------------------------------------------------------------


def cfg(**values: object) -> BrokerConfig:
    c = BrokerConfig()
    c.update({k: str(v) for k, v in values.items()})
    return c


B64 = "data:;base64," + base64.b64encode(SECRET).decode()


@pytest.mark.parametrize(
    ("values", "why"),
    [
        ({"authorizationEnabled": "true"}, "authorizationEnabled needs authenticationEnabled"),
        ({"authenticationEnabled": "true"}, "exactly one of tokenSecretKey, tokenPublicKey"),
        (
            {"authenticationEnabled": "true", "tokenSecretKey": B64, "tokenPublicKey": B64},
            "exactly one",
        ),
        (
            {
                "authenticationEnabled": "true",
                "tokenSecretKey": B64,
                "authenticationProviders": "org.apache.pulsar.broker.authentication."
                "AuthenticationProviderSasl",
            },
            "unsupported authenticationProviders",
        ),
        (
            {
                "authenticationEnabled": "true",
                "authenticationProviders": "org.apache.pulsar.broker.authentication."
                "AuthenticationProviderTls",
            },
            "AuthenticationProviderTls needs a TLS port",
        ),
        (
            {"authenticationEnabled": "true", "tokenSecretKey": "data:;base64,c2hvcnQ="},
            "at least 256",
        ),
        ({"authenticationEnabled": "true", "tokenSecretKey": "file:///nope"}, "tokenSecretKey"),
        ({"authenticationEnabled": "true", "tokenPublicKey": B64}, "tokenPublicKey"),
        ({"brokerServicePortTls": 6651}, "tlsCertificateFilePath and tlsKeyFilePath"),
        (
            {"webServicePortTls": 8443, "tlsCertificateFilePath": "/x", "tlsKeyFilePath": "/y"},
            "cannot load",
        ),
    ],
)
def test_security_config_errors(values: dict[str, object], why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        build_security(cfg(**values), Store())


def test_security_config_builds_what_is_asked() -> None:
    assert build_security(cfg(), None) == (None, None, None, None)
    authn, authz, broker_tls, web_tls = build_security(
        cfg(
            authenticationEnabled="true",
            authorizationEnabled="true",
            tokenSecretKey=B64,
            superUserRoles="admin",
            authenticationProviders="org.apache.pulsar.broker.authentication."
            "AuthenticationProviderToken",
        ),
        Store(),
    )
    assert authn is not None and authz is not None and broker_tls is None and web_tls is None
    assert authn.authenticate("token", hs({"sub": "admin"})) == "admin"
    assert authz.is_super_user("admin")


# --- keyshared tokens ---------------------------------------------------------------------------


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli_main(["tokens", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_tokens_secret_key_create_show_validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key_file = tmp_path / "secret.key"
    assert run_cli(capsys, "create-secret-key", "--output", str(key_file))[0] == 0
    assert len(key_file.read_bytes()) == 32
    assert key_file.stat().st_mode & 0o077 == 0
    code, out, _ = run_cli(capsys, "create-secret-key", "-a", "HS512", "--base64")
    assert code == 0 and len(base64.b64decode(out.strip())) == 64

    code, out, _ = run_cli(
        capsys, "create", "--secret-key", f"file://{key_file}", "--subject", "alice", "-e", "1h"
    )
    token = out.strip()
    assert code == 0
    auth = TokenAuthenticator(secret_key=key_file.read_bytes())
    assert auth.authenticate("token", token.encode()) == "alice"
    claims = jwt.decode(token, options={"verify_signature": False})
    assert 3590 <= claims["exp"] - time.time() <= 3610

    code, out, _ = run_cli(capsys, "show", token)
    header, sep, payload = out.strip().partition("\n---\n")
    assert code == 0 and sep and json.loads(header)["alg"] == "HS256"
    assert json.loads(payload)["sub"] == "alice"

    assert run_cli(capsys, "validate", token, "-sk", str(key_file))[0] == 0
    other = tmp_path / "other.key"
    other.write_bytes(os.urandom(32))
    code, _, err = run_cli(capsys, "validate", token, "-sk", str(other))
    assert code == 1 and "signature" in err


def test_tokens_key_pair_and_rs256(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    priv, pub = tmp_path / "private.key", tmp_path / "public.key"
    code, _, _ = run_cli(
        capsys,
        "create-key-pair",
        "--output-private-key",
        str(priv),
        "--output-public-key",
        str(pub),
    )
    assert code == 0
    # DER, as pulsar tokens writes them
    serialization.load_der_private_key(priv.read_bytes(), password=None)
    public = load_public_key(pub.read_bytes())
    code, out, _ = run_cli(capsys, "create", "--private-key", f"file://{priv}", "-s", "svc")
    assert code == 0
    token = out.strip()
    assert jwt.get_unverified_header(token)["alg"] == "RS256"
    assert TokenAuthenticator(public_key=public).authenticate("token", token.encode()) == "svc"
    data_url = "data:;base64," + base64.b64encode(pub.read_bytes()).decode()
    assert run_cli(capsys, "validate", token, "--public-key", data_url)[0] == 0


def test_tokens_expired_and_bad_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    expired = create_token("a", secret_key=SECRET, expiry_seconds=10, now=time.time() - 100)
    code, _, err = run_cli(capsys, "validate", expired, "-sk", B64)
    assert code == 1 and "expired" in err
    assert run_cli(capsys, "create", "-s", "a")[0] == 2  # no key
    code, _, err = run_cli(capsys, "create", "-s", "a", "-sk", B64, "-e", "soon")
    assert code == 1 and "relative time" in err
    assert run_cli(capsys, "show", "nonsense")[0] == 1
    assert run_cli(capsys)[0] == 2
    assert parse_relative_time("90") == 90
    assert parse_relative_time("2w") == 14 * 86400
    assert parse_relative_time("1y") == 365 * 86400
