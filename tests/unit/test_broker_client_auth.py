"""The standalone's own client (brokerClientAuthentication*) and whether it may create
public/default, as Pulsar's standalone decides it."""

from __future__ import annotations

import json
from pathlib import Path

import jwt
import pytest
from passlib.hash import apr_md5_crypt

from keyshared.config import BrokerConfig, ConfigError
from keyshared.server.authz import parse_roles
from keyshared.server.broker_client_auth import (
    broker_client_credentials,
    may_create_default_namespace,
)
from keyshared.server.security import build_authenticator
from tests.certs import make_certs, make_client_cert

SECRET = b"s" * 32
TOKEN_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"


def config(tmp_path: Path, **keys: str) -> BrokerConfig:
    (tmp_path / "secret.key").write_bytes(SECRET)
    (tmp_path / ".htpasswd").write_text(f"root:{apr_md5_crypt.hash('pw')}\n")
    cfg = BrokerConfig()
    base = {
        "authenticationEnabled": "true",
        "authenticationProviders": "org.apache.pulsar.broker.authentication."
        "AuthenticationProviderToken,org.apache.pulsar.broker.authentication."
        "AuthenticationProviderBasic",
        "tokenSecretKey": f"file://{tmp_path / 'secret.key'}",
        "basicAuthConf": str(tmp_path / ".htpasswd"),
        "authorizationEnabled": "true",
        "superUserRoles": "admin,root",
    }
    for key, value in {**base, **keys}.items():
        assert cfg.set(key, value)
    return cfg


def decide(cfg: BrokerConfig) -> tuple[bool, str]:
    authn = build_authenticator(cfg) if cfg.authenticationEnabled else None
    return may_create_default_namespace(cfg, authn, set(parse_roles(cfg.superUserRoles)))


def tok(role: str, key: bytes = SECRET) -> str:
    return jwt.encode({"sub": role}, key, algorithm="HS256")


def test_without_authentication_the_namespace_is_created(tmp_path: Path) -> None:
    assert decide(config(tmp_path, authenticationEnabled="false", authorizationEnabled="false"))[0]


def test_no_credentials_with_authentication_on_is_refused_as_in_pulsar(tmp_path: Path) -> None:
    allowed, why = decide(config(tmp_path))
    assert not allowed and "401" in why
    # An anonymous role is not enough under authorization: it is not a super user.
    allowed, why = decide(config(tmp_path, anonymousUserRole="anonymous"))
    assert not allowed and "anonymous is not a super user" in why
    # Without authorization, the anonymous client may.
    assert decide(config(tmp_path, anonymousUserRole="anon", authorizationEnabled="false"))[0]


def test_a_super_users_token_in_each_form(tmp_path: Path) -> None:
    (tmp_path / "admin.token").write_text(tok("admin") + "\n")
    for params in (
        f"token:{tok('admin')}",
        f"file://{tmp_path / 'admin.token'}",
        json.dumps({"token": tok("admin")}),
    ):
        cfg = config(
            tmp_path,
            brokerClientAuthenticationPlugin=TOKEN_PLUGIN,
            brokerClientAuthenticationParameters=params,
        )
        assert decide(cfg) == (True, ""), params


def test_a_token_that_is_not_a_super_users_or_is_forged(tmp_path: Path) -> None:
    plain = config(
        tmp_path,
        brokerClientAuthenticationPlugin=TOKEN_PLUGIN,
        brokerClientAuthenticationParameters=f"token:{tok('alice')}",
    )
    assert decide(plain) == (False, "HTTP 401 Unauthorized: alice is not a super user")
    forged = config(
        tmp_path,
        brokerClientAuthenticationPlugin="token",
        brokerClientAuthenticationParameters=f"token:{tok('admin', b'x' * 32)}",
    )
    allowed, why = decide(forged)
    assert not allowed and "401" in why


def test_basic_credentials(tmp_path: Path) -> None:
    plugin = "org.apache.pulsar.client.impl.auth.AuthenticationBasic"
    good = json.dumps({"userId": "root", "password": "pw"})
    bad = json.dumps({"userId": "root", "password": "nope"})
    assert decide(config(tmp_path, brokerClientAuthenticationPlugin=plugin,
                         brokerClientAuthenticationParameters=good))[0]  # fmt: skip
    assert not decide(config(tmp_path, brokerClientAuthenticationPlugin=plugin,
                             brokerClientAuthenticationParameters=bad))[0]  # fmt: skip


def test_tls_credentials_are_the_certificates_common_name(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "tls")
    cert, key = make_client_cert(certs, "admin")
    cfg = config(
        tmp_path,
        brokerClientAuthenticationPlugin="org.apache.pulsar.client.impl.auth.AuthenticationTls",
        brokerClientAuthenticationParameters=f"tlsCertFile:{cert},tlsKeyFile:{key}",
    )
    assert broker_client_credentials(cfg).data == b"admin"
    # The TLS provider is not among this broker's providers: refused.
    assert not decide(cfg)[0]


@pytest.mark.parametrize(
    ("plugin", "params", "names"),
    [
        ("org.example.MyAuth", "x", "org.example.MyAuth is not supported"),
        (TOKEN_PLUGIN, "", "no token"),
        ("org.apache.pulsar.client.impl.auth.AuthenticationBasic", "{}", "userId"),
        ("tls", "tlsKeyFile:/k", "no tlsCertFile"),
    ],
)
def test_unusable_plugins_and_parameters_are_named(
    tmp_path: Path, plugin: str, params: str, names: str
) -> None:
    cfg = config(
        tmp_path,
        brokerClientAuthenticationPlugin=plugin,
        brokerClientAuthenticationParameters=params,
    )
    with pytest.raises(ConfigError, match=names):
        broker_client_credentials(cfg)
