"""``keyshared tokens``: keys and JWTs for token authentication, as ``pulsar tokens`` makes them.

- ``create-secret-key [-a HS256] [-o FILE] [-b]``: a random HMAC key (raw bytes, or base64 with
  ``--base64``), for ``tokenSecretKey``.
- ``create-key-pair [-a RS256] --output-private-key F --output-public-key F``: a key pair (PKCS#8
  and X.509 DER, as Pulsar writes them); the public one is for ``tokenPublicKey``.
- ``create -s ROLE (--secret-key URL | --private-key URL) [-e 1h] [-a ALG] [--headers k=v]``:
  print a token whose ``sub`` is ROLE. Keys are given as Pulsar takes them: ``file:///path``,
  ``data:;base64,...``, a path, or base64.
- ``show TOKEN``: print its header and claims; ``validate TOKEN (--secret-key|--public-key)``:
  print the claims of a valid token, or fail.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from keyshared.server.auth_token import (
    EC_ALGORITHMS,
    HMAC_ALGORITHMS,
    PUBLIC_ALGORITHMS,
    RSA_ALGORITHMS,
    KeyFormatError,
    TokenAuthenticator,
    hmac_algorithms_for,
    load_private_key,
    load_public_key,
    read_key,
)

_SECRET_BYTES = {"HS256": 32, "HS384": 48, "HS512": 64}
_RSA_BITS = {"256": 2048, "384": 3072, "512": 4096}
_EC_CURVES: dict[str, ec.EllipticCurve] = {
    "ES256": ec.SECP256R1(),
    "ES384": ec.SECP384R1(),
    "ES512": ec.SECP521R1(),
}
_EC_ALG_BY_CURVE = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
_RELATIVE = re.compile(r"^\s*(\d+)\s*([smhdwy]?)\s*$")


class UsageError(Exception):
    """Bad arguments or inputs; printed without a traceback."""


def parse_relative_time(text: str) -> int:
    """Seconds in ``10s``, ``5m``, ``1h``, ``3d``, ``2w``, ``1y`` (a bare number is seconds)."""
    m = _RELATIVE.match(text)
    if not m:
        raise UsageError(f"invalid relative time {text!r} (use e.g. 30s, 10m, 1h, 3d, 2w, 1y)")
    return int(m.group(1)) * _UNITS[m.group(2) or "s"]


def create_secret_key(algorithm: str = "HS256") -> bytes:
    """A random secret key long enough for ``algorithm``."""
    if algorithm not in _SECRET_BYTES:
        raise UsageError(f"{algorithm} is not an HMAC algorithm ({', '.join(HMAC_ALGORITHMS)})")
    return secrets.token_bytes(_SECRET_BYTES[algorithm])


def create_key_pair(algorithm: str = "RS256") -> tuple[bytes, bytes]:
    """(private key PKCS#8 DER, public key X.509 DER) for ``algorithm``."""
    private: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
    if algorithm in RSA_ALGORITHMS:
        private = rsa.generate_private_key(public_exponent=65537, key_size=_RSA_BITS[algorithm[2:]])
    elif algorithm in EC_ALGORITHMS:
        private = ec.generate_private_key(_EC_CURVES[algorithm])
    else:
        raise UsageError(f"{algorithm} has no key pair ({', '.join(PUBLIC_ALGORITHMS)})")
    private_der = private.private_bytes(
        serialization.Encoding.DER,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public_der = private.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private_der, public_der


def create_token(
    subject: str,
    *,
    secret_key: bytes | None = None,
    private_key: bytes | None = None,
    algorithm: str | None = None,
    expiry_seconds: int | None = None,
    headers: dict[str, str] | None = None,
    now: float | None = None,
) -> str:
    """A signed token for ``subject`` (with ``exp`` when ``expiry_seconds`` is given)."""
    claims: dict[str, Any] = {"sub": subject}
    if expiry_seconds is not None:
        claims["exp"] = int((time.time() if now is None else now) + expiry_seconds)
    key: Any
    if secret_key is not None:
        allowed = hmac_algorithms_for(secret_key)
        # Like jjwt's signWith(key): the strongest HMAC the key allows, unless one is asked for.
        alg = algorithm or allowed[-1]
        if alg not in allowed:
            raise UsageError(f"{alg} cannot be used with this secret key (allowed: {allowed})")
        key = secret_key
    elif private_key is not None:
        key = load_private_key(private_key)
        if algorithm is not None:
            alg = algorithm
        elif isinstance(key, ec.EllipticCurvePrivateKey):
            alg = _EC_ALG_BY_CURVE.get(key.curve.name, "ES256")
        else:
            alg = "RS256"
        want = rsa.RSAPrivateKey if alg in RSA_ALGORITHMS else ec.EllipticCurvePrivateKey
        if alg not in PUBLIC_ALGORITHMS or not isinstance(key, want):
            raise UsageError(f"{alg} does not fit this private key")
    else:
        raise UsageError("give --secret-key or --private-key")
    return jwt.encode(claims, key, algorithm=alg, headers=headers or None)


# --- command line ------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keyshared tokens", description="Keys and tokens for token authentication."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("create-secret-key", help="create a secret key (tokenSecretKey)")
    p.add_argument("-a", "--signature-algorithm", default="HS256", choices=HMAC_ALGORITHMS)
    p.add_argument("-o", "--output", help="write the key to this file (default: stdout)")
    p.add_argument("-b", "--base64", action="store_true", help="encode the key in base64")

    p = sub.add_parser("create-key-pair", help="create a private/public key pair")
    p.add_argument("-a", "--signature-algorithm", default="RS256", choices=PUBLIC_ALGORITHMS)
    p.add_argument("--output-private-key", required=True, help="file for the private key")
    p.add_argument("--output-public-key", required=True, help="file for the public key")

    p = sub.add_parser("create", help="create a token")
    p.add_argument("-s", "--subject", required=True, help="the role the token proves")
    keys = p.add_mutually_exclusive_group(required=True)
    keys.add_argument("-sk", "--secret-key", help="secret key (file:///..., data:..., base64)")
    keys.add_argument("-pk", "--private-key", help="private key (file:///..., data:..., base64)")
    p.add_argument("-e", "--expiry-time", help="relative expiry, e.g. 1h, 3d, 1y (default: none)")
    p.add_argument(
        "-a", "--signature-algorithm", choices=HMAC_ALGORITHMS + PUBLIC_ALGORITHMS, default=None
    )
    p.add_argument(
        "-hs", "--headers", action="append", default=[], metavar="KEY=VALUE", help="extra header"
    )

    for name, helptext in (("show", "print a token's header and claims"), ("validate", None)):
        p = sub.add_parser(name, help=helptext or "check a token's signature and expiry")
        p.add_argument("token", nargs="?", help="the token (or -i, -f, or $TOKEN)")
        p.add_argument("-i", "--stdin", action="store_true", help="read the token from stdin")
        p.add_argument("-f", "--token-file", help="read the token from a file")
        if name == "validate":
            keys = p.add_mutually_exclusive_group(required=True)
            keys.add_argument("-sk", "--secret-key", help="secret key")
            keys.add_argument("-pk", "--public-key", help="public key")
            p.add_argument(
                "-a", "--signature-algorithm", default="RS256", choices=PUBLIC_ALGORITHMS
            )
    return parser


def _write(path: str | None, data: bytes, mode: int = 0o600) -> None:
    if path is None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    target = Path(path)
    # Secret and private keys are never readable by others, not even for a moment.
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _token_arg(args: argparse.Namespace) -> str:
    if args.token:
        return str(args.token).strip()
    if args.stdin:
        return sys.stdin.readline().strip()
    if args.token_file:
        return Path(args.token_file).read_text().strip()
    env = os.environ.get("TOKEN")
    if env:
        return env.strip()
    raise UsageError("give the token as an argument, with --stdin, --token-file, or in $TOKEN")


def _b64url_json(part: str) -> Any:
    padded = part + "=" * (-len(part) % 4)
    return json.loads(base64.urlsafe_b64decode(padded))


def _run(args: argparse.Namespace) -> int:
    cmd = args.command
    if cmd == "create-secret-key":
        key = create_secret_key(args.signature_algorithm)
        _write(args.output, base64.b64encode(key) if args.base64 else key)
    elif cmd == "create-key-pair":
        private_der, public_der = create_key_pair(args.signature_algorithm)
        _write(args.output_private_key, private_der)
        _write(args.output_public_key, public_der, 0o644)
    elif cmd == "create":
        headers = {}
        for item in args.headers:
            k, sep, v = item.partition("=")
            if not sep or not k:
                raise UsageError(f"--headers takes KEY=VALUE, not {item!r}")
            headers[k] = v
        token = create_token(
            args.subject,
            secret_key=read_key(args.secret_key) if args.secret_key else None,
            private_key=read_key(args.private_key) if args.private_key else None,
            algorithm=args.signature_algorithm,
            expiry_seconds=parse_relative_time(args.expiry_time) if args.expiry_time else None,
            headers=headers,
        )
        print(token)
    elif cmd == "show":
        parts = _token_arg(args).split(".")
        if len(parts) != 3:
            raise UsageError("not a JWT (expected three dot-separated parts)")
        try:
            header, claims = _b64url_json(parts[0]), _b64url_json(parts[1])
        except ValueError as exc:
            raise UsageError(f"not a JWT: {exc}") from exc
        print(json.dumps(header))
        print("---")
        print(json.dumps(claims))
    else:  # validate
        token = _token_arg(args)
        if args.secret_key:
            auth = TokenAuthenticator(secret_key=read_key(args.secret_key))
        else:
            public = load_public_key(read_key(args.public_key))
            alg = args.signature_algorithm
            if isinstance(public, ec.EllipticCurvePublicKey) and alg in RSA_ALGORITHMS:
                alg = _EC_ALG_BY_CURVE.get(public.curve.name, "ES256")
            auth = TokenAuthenticator(public_key=public, public_alg=alg)
        auth.authenticate_token(token)
        print(json.dumps(jwt.decode(token, options={"verify_signature": False})))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``keyshared tokens ARGS``; returns the exit code."""
    from keyshared.broker.errors import BrokerError

    try:
        args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        return _run(args)
    except (UsageError, KeyFormatError, OSError) as exc:
        print(f"keyshared tokens: {exc}", file=sys.stderr)
        return 1
    except BrokerError as exc:
        print(f"keyshared tokens: invalid token: {exc.message}", file=sys.stderr)
        return 1
