"""Pulsar's basic authentication provider: users and password hashes from ``basicAuthConf``.

The file holds htpasswd lines ``user:hash``, as Pulsar's ``AuthenticationProviderBasic`` reads
them: Apache's MD5 form (``$apr1$...``) and the traditional ``crypt`` form; bcrypt lines
(``$2y$``/``$2b$``/``$2a$``, what ``htpasswd -B`` writes) are accepted too. The hashes are checked
by passlib and bcrypt, never by hand. Credentials arrive as ``user:password`` in the CONNECT
command (method ``basic``) or in an HTTP ``Authorization: Basic base64(user:password)`` header.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

from keyshared.broker.errors import BrokerError, ServerError

BASIC_METHOD = "basic"
_FAILED = "Unknown user or invalid password"


class BasicConfigError(ValueError):
    """``basicAuthConf`` could not be read or holds a malformed line."""


def read_basic_conf(value: str) -> bytes:
    """The bytes of ``basicAuthConf``: ``file:``/``data:`` URL, a path, or base64, as Pulsar."""
    if value.startswith("file:"):
        path = value[len("file:") :]
        while path.startswith("//"):
            path = path[1:]
        return _read(Path(path))
    if value.startswith("data:"):
        _, _, payload = value.partition(",")
        try:
            return base64.b64decode(payload, validate=True)
        except binascii.Error as exc:
            raise BasicConfigError(f"basicAuthConf: bad data URL: {exc}") from exc
    if Path(value).exists():
        return _read(Path(value))
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error:
        raise BasicConfigError(
            "basicAuthConf: not a file, a data: URL or base64 (Not supported config)"
        ) from None


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise BasicConfigError(f"basicAuthConf: cannot read {path}: {exc}") from exc


def parse_htpasswd(text: str) -> dict[str, str]:
    """``{user: hash}`` from htpasswd lines; a line without exactly one ``:`` is an error."""
    users: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.strip().split(":")
        if len(parts) != 2 or not parts[0]:
            raise BasicConfigError(
                f"basicAuthConf line {number}: The format of the password auth conf file is invalid"
            )
        users[parts[0]] = parts[1]
    return users


def verify_password(password: str, hashed: str) -> bool:
    """Does ``password`` match the htpasswd ``hashed`` value?"""
    # Imported here: passlib and bcrypt are only needed when basic authentication is on.
    if hashed.startswith("$apr1$"):
        from passlib.hash import apr_md5_crypt

        return bool(apr_md5_crypt.verify(password, hashed))
    if hashed.startswith(("$2y$", "$2b$", "$2a$")):
        import bcrypt

        # bcrypt does not know htpasswd's $2y$ prefix; it is the same algorithm as $2b$.
        normal = "$2b$" + hashed[4:] if hashed.startswith("$2y$") else hashed
        try:
            return bool(bcrypt.checkpw(password.encode(), normal.encode()))
        except ValueError:
            return False
    if len(hashed) == 13:
        from passlib.hash import des_crypt

        try:
            return bool(des_crypt.verify(password, hashed))
        except ValueError:
            return False
    return False


class BasicAuthenticator:
    """Checks ``user:password`` against the users of ``basicAuthConf``."""

    method = BASIC_METHOD

    def __init__(self, users: dict[str, str]) -> None:
        self.users = users

    @classmethod
    def from_conf(cls, value: str) -> BasicAuthenticator:
        """Load ``basicAuthConf`` (see :func:`read_basic_conf`)."""
        if not value:
            raise BasicConfigError(
                "AuthenticationProviderBasic needs basicAuthConf "
                "(No basic authentication config provided)"
            )
        try:
            text = read_basic_conf(value).decode()
        except UnicodeDecodeError as exc:
            raise BasicConfigError(f"basicAuthConf is not text: {exc}") from exc
        return cls(parse_htpasswd(text))

    def authenticate_credentials(self, data: bytes) -> str:
        """The user named by ``user:password`` if the password matches its hash."""
        try:
            text = data.decode()
        except UnicodeDecodeError:
            raise _auth_error("Base64 decoded params are invalid") from None
        parts = text.split(":")
        if len(parts) != 2:
            raise _auth_error("Base64 decoded params are invalid")
        user, password = parts
        hashed = self.users.get(user)
        if hashed is None or not verify_password(password, hashed):
            # The same answer for an unknown user and a wrong password, as Pulsar.
            raise _auth_error(_FAILED)
        return user

    def authenticate_header(self, authorization: str) -> str:
        """The user proved by an ``Authorization: Basic ...`` header."""
        scheme, _, encoded = authorization.strip().partition(" ")
        if scheme.lower() != "basic" or not encoded.strip():
            raise _auth_error('Authentication token has to be started with "Basic "')
        try:
            raw = base64.b64decode(encoded.strip(), validate=True)
        except binascii.Error as exc:
            raise _auth_error(f"Base64 decoding is failure: {exc}") from None
        return self.authenticate_credentials(raw)


def _auth_error(message: str) -> BrokerError:
    return BrokerError(ServerError.AuthenticationError, message)
