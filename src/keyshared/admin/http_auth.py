"""Bearer-token authentication and role checks in front of the whole web application.

An ASGI wrapper rather than per-route dependencies, so that every route (present and future) is
covered: a path it does not know needs a super user. What a path needs follows Pulsar's admin
resources (``PulsarAuthorizationProvider``):

- topic stats, metadata and topic lists: ``produce`` or ``consume`` on the namespace;
- anything about a subscription (list, create, delete, peek, skip, reset, hash blockers):
  ``consume``;
- creating, deleting and configuring topics and namespaces, permissions: the tenant's admin;
- tenants, brokers, metrics: a super user.

A tenant admin or super user passes every check of its tenant. Refusals are 401 (no or bad
token) or 403 (role not allowed) with a fixed reason that names nothing, and are decided before
the application runs, so they do not reveal whether a topic or namespace exists.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from keyshared.broker.errors import BrokerError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PUBLIC = "public"
SUPER_USER = "super"
TENANT_ADMIN = "tenant"
NAMESPACE = "namespace"

_PUBLIC_PATHS = frozenset({"/", "/favicon.ico", "/docs", "/docs/oauth2-redirect", "/redoc"})
_PUBLIC_PATHS |= {"/openapi.json", "/index.html"}
_PUBLIC_PREFIXES = ("/static/", "/assets/")
_TOPIC_DOMAINS = frozenset({"persistent", "non-persistent"})
_TOPIC_LOOKUP_GETS = frozenset(
    {
        "stats",
        "internalStats",
        "partitioned-stats",
        "partitioned-internalStats",
        "partitions",
        "lastMessageId",
    }
)

_TOPIC_CONSUME = frozenset({"subscriptions", "subscription", "examinemessage", "messageid"})

UNAUTHENTICATED_REASON = "Authentication required"
UNAUTHORIZED_REASON = "Not authorized to access this resource"


@dataclass(frozen=True, slots=True)
class Access:
    """What a request needs: nothing, a super user, a tenant's admin, or a namespace action."""

    kind: str
    tenant: str = ""
    namespace: str = ""
    action: str = ""


def required_access(method: str, path: str) -> Access:
    """The access a ``method`` on ``path`` needs (a super user for anything unknown)."""
    if path in _PUBLIC_PATHS or path.startswith(_PUBLIC_PREFIXES):
        return Access(PUBLIC)
    parts = [p for p in path.split("/") if p]
    read = method in ("GET", "HEAD")
    if parts[:3] == ["lookup", "v2", "topic"] and len(parts) >= 6 and read:
        # HTTP lookup: the same permission as the binary protocol's LOOKUP.
        return Access(NAMESPACE, parts[4], f"{parts[4]}/{parts[5]}", "lookup")
    if parts[:2] != ["admin", "v2"]:
        return Access(SUPER_USER)
    parts = parts[2:]
    if len(parts) >= 2 and parts[0] == "tenants":
        return Access(TENANT_ADMIN, parts[1]) if read and len(parts) == 2 else Access(SUPER_USER)
    if parts and parts[0] == "namespaces":
        if len(parts) == 2:
            return Access(TENANT_ADMIN, parts[1]) if read else Access(SUPER_USER)
        if len(parts) >= 3:
            tenant, ns = parts[1], f"{parts[1]}/{parts[2]}"
            if read and parts[3:] == ["topics"]:
                return Access(NAMESPACE, tenant, ns, "lookup")
            return Access(TENANT_ADMIN, tenant)
    if len(parts) >= 4 and parts[0] == "schemas":
        # Reading a schema (or asking if one is compatible) is a lookup; uploading one needs
        # produce; deleting a topic's schemas is the tenant admin's.
        tenant, ns = parts[1], f"{parts[1]}/{parts[2]}"
        if read or parts[4:] == ["compatibility"]:
            return Access(NAMESPACE, tenant, ns, "lookup")
        if method == "POST":
            return Access(NAMESPACE, tenant, ns, "produce")
        return Access(TENANT_ADMIN, tenant)
    if len(parts) >= 3 and parts[0] in _TOPIC_DOMAINS:
        return _topic_access(read, parts[1], f"{parts[1]}/{parts[2]}", parts[3:])
    return Access(SUPER_USER)


def _topic_access(read: bool, tenant: str, ns: str, rest: list[str]) -> Access:
    """Access for ``/admin/v2/persistent/{tenant}/{namespace}/...rest``."""
    if not rest or rest == ["partitioned"]:
        # Listing a namespace's topics; any other method on it is unknown, so administrative.
        return Access(NAMESPACE, tenant, ns, "lookup") if read else Access(TENANT_ADMIN, tenant)
    tail = rest[1:]
    if not tail:
        return Access(NAMESPACE, tenant, ns, "lookup") if read else Access(TENANT_ADMIN, tenant)
    if tail[0] in _TOPIC_CONSUME or (read and tail[0] == "ledger"):
        # Get-message-by-id reads data, as examinemessage does: Pulsar asks for consume.
        return Access(NAMESPACE, tenant, ns, "consume")
    if read and tail[0] in _TOPIC_LOOKUP_GETS:
        return Access(NAMESPACE, tenant, ns, "lookup")
    return Access(TENANT_ADMIN, tenant)


class HttpAuthenticator(Protocol):
    """Turns an ``Authorization`` header into a role (server.auth_token.TokenAuthenticator)."""

    def authenticate_http(
        self, authorization: str | None, client_cert_cn: str | None = None
    ) -> str:
        """The role, or raise BrokerError(AuthenticationError)."""


class HttpAuthorizer(Protocol):
    """The decisions of server.authz.NamespaceAuthorizer."""

    def is_super_user(self, role: str | None) -> bool:
        """True for a super user."""

    def is_tenant_admin(self, role: str | None, tenant: str) -> bool:
        """True for a super user or an admin of ``tenant``."""

    def can(self, role: str | None, tenant: str, namespace: str, action: str) -> bool:
        """May ``role`` do the topic ``action`` in ``namespace``?"""


class SecuredApp:
    """Wraps an ASGI application: authenticate every non-public request, then check its role."""

    def __init__(
        self,
        app: ASGIApp,
        authenticator: HttpAuthenticator,
        authorizer: HttpAuthorizer | None,
        *,
        public_metrics: bool = False,
    ) -> None:
        self.app = app
        self.authenticator = authenticator
        self.authorizer = authorizer
        self.public_metrics = public_metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve ``scope`` if allowed, else answer 401/403 (HTTP) or close 1008 (WebSocket)."""
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        method = scope.get("method", "GET") if kind == "http" else "GET"
        if self.public_metrics and path.rstrip("/") == "/metrics":
            access = Access(PUBLIC)
        else:
            access = required_access(method, path)
        if access.kind != PUBLIC:
            status = self._refusal(scope, access)
            if status:
                await _refuse(kind, status, send, receive)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope, access: Access) -> int:
        """0 if the request may go on, else the HTTP status refusing it."""
        authorization = None
        for name, value in scope.get("headers", ()):
            if name.lower() == b"authorization":
                authorization = value.decode("latin-1")
                break
        # The client certificate of an HTTPS request (admin/web_tls.py), for the TLS provider.
        tls = scope.get("extensions", {}).get("tls") or {}
        try:
            role = self.authenticator.authenticate_http(authorization, tls.get("client_cert_cn"))
        except BrokerError:
            return 401
        scope.setdefault("state", {})["role"] = role
        authz = self.authorizer
        if authz is None:
            return 0  # authentication without authorization: any authenticated role may do all
        if access.kind == SUPER_USER:
            allowed = authz.is_super_user(role)
        elif access.kind == TENANT_ADMIN:
            allowed = authz.is_tenant_admin(role, access.tenant)
        else:
            allowed = authz.can(role, access.tenant, access.namespace, access.action)
        return 0 if allowed else 403


async def _refuse(kind: str, status: int, send: Send, receive: Receive) -> None:
    if kind == "websocket":
        await receive()  # websocket.connect
        await send({"type": "websocket.close", "code": 1008})
        return
    reason = UNAUTHENTICATED_REASON if status == 401 else UNAUTHORIZED_REASON
    body = orjson.dumps({"reason": reason})
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="keyshared"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
