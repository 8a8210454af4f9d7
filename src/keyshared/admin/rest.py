"""What the admin routes share: Pulsar-style errors and resolving names to broker objects.

Pulsar answers an admin error with an HTTP status and a body ``{"reason": "..."}``; the status
codes follow its resources (404 missing, 405 not allowed on this kind of topic, 406 bad partition
count, 409 already exists or busy, 412 precondition failed).
"""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import FastAPI, Path, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.service import TENANTS_PREFIX, BrokerService
from keyshared.broker.subscription import Subscription
from keyshared.broker.topic import PersistentTopic
from keyshared.broker.topic_name import TopicName
from keyshared.storage.position import EARLIEST, LATEST, Position

# Pulsar's NamedEntity rule for tenant, namespace and cluster names.
_NAME = re.compile(r"^[-=:.\w]+$")
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
PathInt64 = Annotated[int, Path(ge=INT64_MIN, le=INT64_MAX)]
QueryInt64 = Annotated[int, Query(ge=INT64_MIN, le=INT64_MAX)]


class RestError(Exception):
    """An admin error: an HTTP status and Pulsar's ``reason`` text."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def install_rest_errors(app: FastAPI) -> None:
    """Answer :class:`RestError` as Pulsar does: the status with ``{"reason": ...}``; and an
    admin path or method keyshared does not implement with 404 / 405 and a reason naming it."""

    @app.exception_handler(RestError)
    async def rest_error(_: Request, exc: RestError) -> Response:
        return JSONResponse({"reason": exc.reason}, status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        what = f"{request.method} {request.url.path}"
        if exc.status_code == 404 and exc.detail == "Not Found":
            reason = f"Not implemented by keyshared: {what}"
        elif exc.status_code == 405:
            reason = f"Method not allowed by keyshared: {what}"
        else:
            reason = str(exc.detail)
        return JSONResponse(
            {"reason": reason}, status_code=exc.status_code, headers=getattr(exc, "headers", None)
        )


class MessageIdData(BaseModel):
    """Pulsar's ``ResetCursorData`` / ``MessageIdImpl`` as JSON.

    ``ledgerId``/``entryId`` of ``Long.MAX_VALUE`` mean *latest*, negative ones *earliest*, as the
    Java admin client sends ``MessageId.latest`` and ``MessageId.earliest``.
    """

    model_config = ConfigDict(extra="ignore")

    ledgerId: Int64 = INT64_MAX
    entryId: Int64 = INT64_MAX
    partitionIndex: Int64 = -1
    batchIndex: Int64 = -1
    isExcluded: bool = False
    # Jackson names Lombok's ``isExcluded()`` getter "excluded": accept both spellings.
    excluded: bool = False

    @classmethod
    def of(cls, body: MessageIdData | str | None, default: str = "latest") -> MessageIdData:
        """The id a body names: an object, or Pulsar's ``"latest"`` / ``"earliest"`` string."""
        if isinstance(body, MessageIdData):
            return body
        word = (body or default).strip().lower()
        if word == "latest":
            return cls()
        if word == "earliest":
            return cls(ledgerId=-1, entryId=-1)
        raise RestError(412, f"Invalid value {body!r} for the position: use latest or earliest")

    @property
    def exclude(self) -> bool:
        """Whether the position itself is excluded (start right after it)."""
        return self.isExcluded or self.excluded

    def position(self) -> Position:
        """The position this id names (EARLIEST / LATEST for the sentinels)."""
        if self.ledgerId >= INT64_MAX:
            return LATEST
        if self.ledgerId < 0:
            return EARLIEST
        return Position(self.ledgerId, max(self.entryId, 0))


def message_id_json(pos: Position, partition: int = -1, batch: int | None = None) -> dict[str, int]:
    """A ``MessageIdImpl`` (or ``BatchMessageIdImpl`` with ``batch``) as Pulsar serialises it."""
    out = {"ledgerId": pos.ledger_id, "entryId": pos.entry_id, "partitionIndex": partition}
    if batch is not None:
        out["batchIndex"] = batch
    return out


def check_name(kind: str, name: str) -> str:
    """``name`` if it is a valid tenant / namespace / cluster name, else 412."""
    if not _NAME.match(name):
        raise RestError(412, f"Invalid {kind} name {name!r}")
    return name


class Resolver:
    """Turns path parameters into the broker's tenants, namespaces, topics and subscriptions."""

    def __init__(self, service: BrokerService) -> None:
        self.service = service

    # --- tenants and namespaces ----------------------------------------------------------
    def tenant_exists(self, tenant: str) -> bool:
        """True if ``tenant`` exists."""
        return self.service.storage.metadata.get(TENANTS_PREFIX + tenant) is not None

    def tenant(self, tenant: str) -> str:
        """An existing tenant's name, else 404 (412 for an invalid name)."""
        check_name("tenant", tenant)
        if not self.tenant_exists(tenant):
            raise RestError(404, "Tenant does not exist")
        return tenant

    def namespace(self, tenant: str, namespace: str) -> str:
        """``tenant/namespace`` if it exists, else 404 (412 for an invalid name)."""
        check_name("tenant", tenant)
        check_name("namespace", namespace)
        ns = f"{tenant}/{namespace}"
        if not self.service.namespace_exists(ns):
            raise RestError(404, "Namespace does not exist")
        return ns

    def namespaces_of(self, tenant: str) -> list[str]:
        """``tenant/ns`` names of the tenant's namespaces."""
        return self.service.policies.namespaces_of(tenant)

    def topics_of(self, namespace: str) -> list[str]:
        """Every topic of ``namespace`` as Pulsar lists them: non-partitioned topics and all
        partitions of partitioned topics (created or not yet used)."""
        service = self.service
        names = set(service.list_topics(namespace))
        for base in service.list_partitioned_topics(namespace):
            name = TopicName.parse(base)
            names.update(name.partition(i).full for i in range(service.partitions_of(name)))
        return sorted(names)

    # --- topics --------------------------------------------------------------------------
    def topic_name(
        self, tenant: str, namespace: str, topic: str, domain: str = "persistent"
    ) -> TopicName:
        """The topic's name (``domain``: persistent or non-persistent) in an existing namespace
        (412 invalid, 404 missing)."""
        try:
            name = self.service.parse_topic(f"{domain}://{tenant}/{namespace}/{topic}")
        except BrokerError as exc:
            raise RestError(412, exc.message) from None
        self.namespace(tenant, namespace)
        return name

    def policy_topic(self, tenant: str, namespace: str, topic: str) -> TopicName:
        """The name of an existing topic (or partitioned topic) whose policies are asked for;
        404 "Topic not found" otherwise, as Pulsar refuses policies of a missing topic."""
        name = self.topic_name(tenant, namespace, topic)
        if not self.exists(name) and self.partitions(name) == 0:
            raise RestError(404, "Topic not found")
        return name

    def partitions(self, name: TopicName) -> int:
        """Partitions of ``name`` (0 when it is not a partitioned topic)."""
        return self.service.partitions_of(name)

    def exists(self, name: TopicName) -> bool:
        """True for a created topic, or a partition of an existing partitioned topic."""
        service = self.service
        if service.topic_exists(name):
            return True
        index = name.partition_index
        return 0 <= index < service.partitions_of(name.partitioned_base)

    def topic(self, name: TopicName) -> PersistentTopic:
        """The loaded topic ``name`` (loaded now if needed), else 404."""
        if not self.exists(name):
            raise RestError(404, "Topic not found")
        return self.service.get_topic(name, create=False)

    def topics_for(self, name: TopicName) -> list[PersistentTopic]:
        """The topic itself, or every partition of a partitioned topic; 404 if neither."""
        n = self.partitions(name)
        if n > 0:
            return [self.service.get_topic(name.partition(i), create=False) for i in range(n)]
        return [self.topic(name)]

    def not_partitioned(self, name: TopicName, what: str) -> None:
        """405 for operations Pulsar refuses on a partitioned topic."""
        if self.partitions(name) > 0:
            raise RestError(405, f"{what} on a partitioned topic is not allowed")

    @staticmethod
    def subscription(topic: PersistentTopic, sub: str) -> Subscription:
        """The subscription ``sub`` of ``topic``, else 404."""
        s = topic.subscriptions.get(sub)
        if s is None:
            raise RestError(404, "Subscription not found")
        return s


def broker_error_status(code: ServerError) -> int:
    """The HTTP status Pulsar's admin uses for a broker error code."""
    return _HTTP_STATUS.get(code, 500)


_HTTP_STATUS = {
    ServerError.TopicNotFound: 404,
    ServerError.SubscriptionNotFound: 404,
    ServerError.ConsumerNotFound: 404,
    ServerError.NotAllowedError: 409,
    ServerError.InvalidTopicName: 412,
    ServerError.AuthenticationError: 401,
    ServerError.AuthorizationError: 403,
    ServerError.ServiceNotReady: 503,
}


def as_rest_error(exc: BrokerError) -> RestError:
    """A broker error as an admin error."""
    status = getattr(exc, "http_status", None)
    return RestError(status or broker_error_status(exc.code), exc.message)


def no_content() -> Response:
    """204, Pulsar's answer to a successful change."""
    return Response(status_code=204)
