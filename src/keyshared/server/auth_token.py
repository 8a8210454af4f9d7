"""Pulsar's token (JWT) authentication provider: keys, token checks, the role a token proves.

Keys are given as Pulsar gives them (``tokenSecretKey`` / ``tokenPublicKey``): ``data:;base64,...``,
``file:///path``, a plain path, or the key itself in base64. A secret key is raw bytes (HS256,
HS384, HS512); a public key is DER (``X.509 SubjectPublicKeyInfo``, what ``pulsar tokens
create-key-pair`` writes) or PEM.
"""

from __future__ import annotations

import base64
import binascii
import os
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from keyshared.broker.errors import BrokerError, ServerError

TOKEN_METHOD = "token"
HMAC_ALGORITHMS = ("HS256", "HS384", "HS512")
RSA_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
EC_ALGORITHMS = ("ES256", "ES384", "ES512")
PUBLIC_ALGORITHMS = RSA_ALGORITHMS + EC_ALGORITHMS

PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey
PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey


class KeyFormatError(ValueError):
    """A key could not be read or decoded."""


def read_key(url: str) -> bytes:
    """The bytes of a key given as ``data:``, ``file:``, a path, or base64 text (as Pulsar reads)."""
    text = url.strip()
    if text.startswith("data:"):
        return _read_data_url(text)
    if text.startswith("file:"):
        parsed = urllib.parse.urlparse(text)
        path = urllib.parse.unquote(parsed.path or parsed.netloc)
        return _read_file(path)
    if text and os.path.exists(text):
        return _read_file(text)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise KeyFormatError(
            "key is neither a data:/file: URL, an existing file, nor base64"
        ) from exc


def _read_file(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise KeyFormatError(f"cannot read key file {path}: {exc.strerror}") from exc


def _read_data_url(text: str) -> bytes:
    header, sep, data = text[len("data:") :].partition(",")
    if not sep:
        raise KeyFormatError("data: URL without a comma")
    if header.endswith(";base64"):
        try:
            return base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise KeyFormatError("data: URL with invalid base64") from exc
    return urllib.parse.unquote_to_bytes(data)


def load_public_key(raw: bytes) -> PublicKey:
    """An RSA or EC public key from DER or PEM bytes."""
    try:
        key: Any = (
            serialization.load_pem_public_key(raw)
            if raw.lstrip().startswith(b"-----")
            else serialization.load_der_public_key(raw)
        )
    except ValueError as exc:
        raise KeyFormatError("cannot decode the public key (expected DER or PEM)") from exc
    if not isinstance(key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey):
        raise KeyFormatError(f"unsupported public key type {type(key).__name__}")
    return key


def load_private_key(raw: bytes) -> PrivateKey:
    """An RSA or EC private key from PKCS#8 DER or PEM bytes."""
    try:
        key: Any = (
            serialization.load_pem_private_key(raw, password=None)
            if raw.lstrip().startswith(b"-----")
            else serialization.load_der_private_key(raw, password=None)
        )
    except (ValueError, TypeError) as exc:
        raise KeyFormatError("cannot decode the private key (expected PKCS#8 DER or PEM)") from exc
    if not isinstance(key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey):
        raise KeyFormatError(f"unsupported private key type {type(key).__name__}")
    return key


def algorithm_family(alg: str) -> tuple[str, ...]:
    """The algorithms verifiable with the kind of key ``alg`` uses (never ``none``)."""
    if alg in HMAC_ALGORITHMS:
        return HMAC_ALGORITHMS
    if alg in RSA_ALGORITHMS:
        return RSA_ALGORITHMS
    if alg in EC_ALGORITHMS:
        return EC_ALGORITHMS
    raise KeyFormatError(f"unsupported signature algorithm {alg!r}")


def hmac_algorithms_for(secret: bytes) -> list[str]:
    """The HMAC algorithms ``secret`` is strong enough for (RFC 7518 3.2: at least the hash size).

    As Pulsar (jjwt) does, a key shorter than 256 bits is refused outright.
    """
    if len(secret) < 32:
        raise KeyFormatError(f"the secret key has {len(secret) * 8} bits; at least 256 are needed")
    return [
        alg for alg, size in (("HS256", 32), ("HS384", 48), ("HS512", 64)) if len(secret) >= size
    ]


def _auth_error(message: str) -> BrokerError:
    return BrokerError(ServerError.AuthenticationError, message)


@dataclass
class TokenAuthenticator:
    """Validates JWTs and returns the role in ``auth_claim`` (``sub`` by default).

    Exactly one of ``secret_key`` (HMAC) and ``public_key`` is set. Expiry (``exp``) and
    not-before (``nbf``) are enforced with ``leeway`` seconds of clock skew; when ``audience`` is
    set, the ``audience_claim`` claim must name it.
    """

    secret_key: bytes | None = None
    public_key: PublicKey | None = None
    public_alg: str = "RS256"
    auth_claim: str = "sub"
    audience_claim: str = "aud"
    audience: str = ""
    leeway: float = 0.0
    _key: Any = field(init=False, repr=False)
    _algorithms: list[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if (self.secret_key is None) == (self.public_key is None):
            raise KeyFormatError("give exactly one of a secret key and a public key")
        if self.secret_key is not None:
            self._key = self.secret_key
            self._algorithms = hmac_algorithms_for(self.secret_key)
        else:
            family = algorithm_family(self.public_alg)
            if family == HMAC_ALGORITHMS:
                raise KeyFormatError(
                    f"tokenPublicAlg {self.public_alg} is not a public-key algorithm"
                )
            expected = rsa.RSAPublicKey if family == RSA_ALGORITHMS else ec.EllipticCurvePublicKey
            if not isinstance(self.public_key, expected):
                raise KeyFormatError(
                    f"the public key does not fit tokenPublicAlg {self.public_alg}"
                )
            self._key = self.public_key
            self._algorithms = list(family)

    def authenticate(self, method: str, data: bytes) -> str:
        """The role proved by a binary-protocol CONNECT or AUTH_RESPONSE (method ``token``)."""
        return self.authenticate_session(method, data)[0]

    def authenticate_session(self, method: str, data: bytes) -> tuple[str, float | None]:
        """As :meth:`authenticate`, with when the credentials expire (the token's ``exp``, in
        epoch seconds; None if it has none): the connection asks for fresh ones then."""
        if method != TOKEN_METHOD:
            # "none" (no credentials) lands here too: there is no anonymous role.
            raise _auth_error(f"Unsupported authentication method: {method or 'none'}")
        try:
            token = data.decode("ascii")
        except UnicodeDecodeError:
            raise _auth_error("Failed to authenticate: malformed token") from None
        return self._verify(token)

    def authenticate_http(self, authorization: str | None) -> str:
        """The role proved by an HTTP ``Authorization: Bearer <token>`` header."""
        if not authorization:
            raise _auth_error("Authentication required")
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _auth_error("Authentication required: use Authorization: Bearer <token>")
        return self.authenticate_token(token.strip())

    def authenticate_token(self, token: str) -> str:
        """Verify ``token`` and return its role; BrokerError(AuthenticationError) otherwise."""
        return self._verify(token)[0]

    def _verify(self, token: str) -> tuple[str, float | None]:
        # Pulsar's clients may prefix the token the way the HTTP header does.
        if token.startswith("Bearer "):
            token = token[len("Bearer ") :]
        try:
            claims = jwt.decode(
                token,
                self._key,
                algorithms=self._algorithms,
                leeway=self.leeway,
                options={"verify_aud": False, "require": [self.auth_claim]},
            )
        except jwt.ExpiredSignatureError:
            raise _auth_error("Failed to authenticate: token expired") from None
        except jwt.ImmatureSignatureError:
            raise _auth_error("Failed to authenticate: token not valid yet") from None
        except jwt.InvalidSignatureError:
            raise _auth_error("Failed to authenticate: invalid token signature") from None
        except jwt.MissingRequiredClaimError:
            raise _auth_error("Failed to authenticate: token has no role claim") from None
        except jwt.InvalidAlgorithmError:
            raise _auth_error("Failed to authenticate: token signature algorithm refused") from None
        except jwt.PyJWTError:
            raise _auth_error("Failed to authenticate: malformed token") from None
        if self.audience and not _has_audience(claims.get(self.audience_claim), self.audience):
            raise _auth_error("Failed to authenticate: token audience does not match")
        role = claims.get(self.auth_claim)
        if not isinstance(role, str) or not role:
            raise _auth_error("Failed to authenticate: token has no role claim")
        exp = claims.get("exp")
        return role, float(exp) if isinstance(exp, (int, float)) else None


def _has_audience(claim: object, audience: str) -> bool:
    if isinstance(claim, str):
        return claim == audience
    if isinstance(claim, list):
        return audience in claim
    return False
