"""A small HTTP client for the admin REST API (standard library only, so the CLI starts fast)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_NO_BODY = object()


class AdminError(Exception):
    """An admin call failed: the HTTP status (0 when the broker was not reached) and why."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(slots=True)
class HttpResult:
    """A response: status, headers (lower-case names) and body bytes."""

    status: int
    headers: dict[str, str]
    data: bytes


def parse_auth_params(params: str | None) -> str | None:
    """The token in pulsar-admin's ``--auth-params`` forms: ``token:XXX``, ``file:PATH``
    (``file:///path`` too), a JSON object ``{"token": "XXX"}``, or a bare token."""
    if not params:
        return None
    text = params.strip()
    if text.startswith("{"):
        value = json.loads(text).get("token")
        return str(value) if value else None
    if text.startswith("token:"):
        return text[len("token:") :]
    if text.startswith("file:"):
        path = urllib.parse.urlparse(text).path if text.startswith("file://") else text[5:]
        return Path(path).read_text().strip()
    return text


class AdminHttp:
    """Calls ``/admin/v2/...`` on one broker, with an optional Bearer token."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        trust_certs: str | None = None,
        allow_insecure: bool = False,
    ) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self._ssl: ssl.SSLContext | None = None
        if self.url.startswith("https://"):
            ctx = ssl.create_default_context(cafile=trust_certs)
            if allow_insecure:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            self._ssl = ctx

    def request(
        self,
        method: str,
        path: str,
        body: Any = _NO_BODY,
        query: dict[str, Any] | None = None,
    ) -> HttpResult:
        """One call; raises :class:`AdminError` for an error status or no connection."""
        url = self.url + path
        if query:
            url += "?" + urllib.parse.urlencode(
                {k: _query_value(v) for k, v in query.items() if v is not None}
            )
        data = None if body is _NO_BODY else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._ssl) as resp:
                headers = {k.lower(): v for k, v in resp.headers.items()}
                return HttpResult(resp.status, headers, resp.read())
        except urllib.error.HTTPError as err:
            raise AdminError(err.code, _reason(err.code, err.read())) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise AdminError(0, f"cannot reach {self.url}: {reason}") from None

    def call(
        self,
        method: str,
        path: str,
        body: Any = _NO_BODY,
        query: dict[str, Any] | None = None,
    ) -> Any:
        """One call; the parsed JSON answer (None for an empty one)."""
        result = self.request(method, path, body, query)
        if not result.data:
            return None
        try:
            return json.loads(result.data)
        except ValueError:
            return result.data.decode(errors="replace")


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _reason(status: int, raw: bytes) -> str:
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        for key in ("reason", "detail", "message"):
            if key in parsed:
                value = parsed[key]
                return value if isinstance(value, str) else json.dumps(value)
    text = raw.decode(errors="replace").strip()
    return text or f"HTTP {status}"
