"""Topics: ``/admin/v2/persistent/{tenant}/{namespace}/...`` as Pulsar's ``PersistentTopics``.

Lists, create and delete (partitioned or not), partition metadata, stats, internal stats,
partitioned stats, subscriptions, unload, last message id, message id by time, and the topic
policies this broker honours (``deduplicationEnabled``, ``retention``, ``messageTTL``).
Subscription operations are in ``admin.routes_subscriptions``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query
from fastapi.responses import Response

from keyshared.admin.policy_models import (
    DEDUPLICATION,
    MESSAGE_TTL,
    RETENTION_SIZE,
    RETENTION_TIME,
    RetentionPolicies,
    check_ttl,
    retention_of,
)
from keyshared.admin.rest import (
    PathInt64,
    Resolver,
    RestError,
    as_rest_error,
    message_id_json,
    no_content,
)
from keyshared.admin.routes_quotas import check_retention_fits
from keyshared.admin.topic_ops import unload_topic
from keyshared.broker.backlog_quota import POLICY_NAME as BACKLOG_QUOTAS
from keyshared.broker.errors import BrokerError
from keyshared.broker.replication import merge_replication_stats
from keyshared.broker.service import BrokerService
from keyshared.broker.topic_name import TopicName

_NS = "/admin/v2/persistent/{tenant}/{namespace}"
_TOPIC = _NS + "/{topic}"
# Pulsar's maxNumPartitionsPerPartitionedTopic is unlimited by default; a bound keeps one
# request from creating millions of partitions on a single-process broker.
MAX_PARTITIONS = 4096


def topic_routes(service: BrokerService) -> APIRouter:
    """The topic routes of ``service``."""
    router = APIRouter(tags=["persistent topic"])
    resolve = Resolver(service)
    store = service.policies

    # --- lists ---------------------------------------------------------------------------
    @router.get(_NS)
    async def list_topics(tenant: str, namespace: str) -> list[str]:
        """Topics of the namespace: non-partitioned topics and every partition."""
        return resolve.topics_of(resolve.namespace(tenant, namespace))

    @router.get(_NS + "/partitioned")
    async def list_partitioned(tenant: str, namespace: str) -> list[str]:
        """Partitioned topics of the namespace."""
        return sorted(service.list_partitioned_topics(resolve.namespace(tenant, namespace)))

    # --- create and delete ---------------------------------------------------------------
    @router.put(_TOPIC, status_code=204)
    async def create_topic(
        tenant: str,
        namespace: str,
        topic: str,
        properties: Annotated[dict[str, str] | None, Body()] = None,
    ) -> Response:
        """Create a non-partitioned topic (409 if it exists)."""
        name = resolve.topic_name(tenant, namespace, topic)
        if resolve.exists(name) or resolve.partitions(name) > 0:
            raise RestError(409, "This topic already exists")
        try:
            service.create_topic(name)
        except BrokerError as exc:
            raise as_rest_error(exc) from None
        return no_content()

    @router.delete(_TOPIC, status_code=204)
    async def delete_topic(
        tenant: str, namespace: str, topic: str, force: bool = Query(False)
    ) -> Response:
        """Delete a topic; refused (412) while clients are attached unless forced."""
        name = resolve.topic_name(tenant, namespace, topic)
        if not service.topic_exists(name):
            raise RestError(404, "Topic not found")
        try:
            await service.delete_topic(name, force=force)
        except BrokerError as exc:
            err = as_rest_error(exc)
            raise RestError(412 if err.status == 409 else err.status, err.reason) from None
        return no_content()

    @router.put(_TOPIC + "/partitions", status_code=204)
    async def create_partitioned(
        tenant: str, namespace: str, topic: str, partitions: Annotated[int, Body()]
    ) -> Response:
        """Create a partitioned topic with ``partitions`` partitions (body: the number)."""
        name = resolve.topic_name(tenant, namespace, topic)
        return create_partitioned_topic(service, name, partitions, exists=resolve.exists)

    @router.post(_TOPIC + "/partitions", status_code=204)
    async def update_partitioned(
        tenant: str, namespace: str, topic: str, partitions: Annotated[int, Body()]
    ) -> Response:
        """Grow a partitioned topic (shrinking is refused)."""
        name = resolve.topic_name(tenant, namespace, topic)
        return grow_partitioned_topic(service, name, partitions)

    @router.get(_TOPIC + "/partitions")
    async def get_partitions(tenant: str, namespace: str, topic: str) -> dict[str, int]:
        """``PartitionedTopicMetadata`` (0 partitions for a non-partitioned topic)."""
        return {"partitions": resolve.partitions(resolve.topic_name(tenant, namespace, topic))}

    @router.delete(_TOPIC + "/partitions", status_code=204)
    async def delete_partitioned(
        tenant: str, namespace: str, topic: str, force: bool = Query(False)
    ) -> Response:
        """Delete a partitioned topic and all its partitions."""
        name = resolve.topic_name(tenant, namespace, topic)
        if resolve.partitions(name) == 0:
            raise RestError(404, "Partitioned topic does not exist")
        try:
            await service.delete_partitioned_topic(name, force=force)
        except BrokerError as exc:
            err = as_rest_error(exc)
            raise RestError(412 if err.status == 409 else err.status, err.reason) from None
        return no_content()

    # --- stats -------------------------------------------------------------------------------
    @router.get(_TOPIC + "/stats")
    async def topic_stats(tenant: str, namespace: str, topic: str) -> Any:
        """``TopicStats``."""
        return resolve.topic(resolve.topic_name(tenant, namespace, topic)).stats()

    @router.get(_TOPIC + "/internalStats")
    async def topic_internal_stats(tenant: str, namespace: str, topic: str) -> Any:
        """``PersistentTopicInternalStats``."""
        return resolve.topic(resolve.topic_name(tenant, namespace, topic)).internal_stats()

    @router.get(_TOPIC + "/partitioned-stats")
    async def partitioned_stats(
        tenant: str, namespace: str, topic: str, perPartition: bool = Query(True)
    ) -> Any:
        """``PartitionedTopicStats``: sums over the partitions, optionally each partition's."""
        name = resolve.topic_name(tenant, namespace, topic)
        n = resolve.partitions(name)
        if n == 0:
            raise RestError(404, "Partitioned topic not found")
        parts = {t.name.full: t.stats() for t in resolve.topics_for(name)}
        return aggregate_partitioned(n, parts, per_partition=perPartition)

    @router.get(_TOPIC + "/subscriptions")
    async def topic_subscriptions(tenant: str, namespace: str, topic: str) -> list[str]:
        """Subscription names (of every partition, for a partitioned topic)."""
        name = resolve.topic_name(tenant, namespace, topic)
        subs: set[str] = set()
        for t in resolve.topics_for(name):
            subs.update(t.subscriptions)
        return sorted(subs)

    # --- lifecycle and ids ---------------------------------------------------------------
    @router.put(_TOPIC + "/unload", status_code=204)
    async def unload(tenant: str, namespace: str, topic: str) -> Response:
        """Close the topic and its clients' sessions; it is loaded again on next use."""
        name = resolve.topic_name(tenant, namespace, topic)
        targets = [name.partition(i) for i in range(resolve.partitions(name))] or [name]
        if not any(resolve.exists(t) for t in targets):
            raise RestError(404, "Topic not found")
        for target in targets:
            loaded = service.topics.get(target.full)
            if loaded is not None:
                await unload_topic(service, loaded)
        return no_content()

    @router.get(_TOPIC + "/lastMessageId")
    async def last_message_id(tenant: str, namespace: str, topic: str) -> dict[str, int]:
        """The last stored message's id (``BatchMessageIdImpl`` for a batch)."""
        name = resolve.topic_name(tenant, namespace, topic)
        resolve.not_partitioned(name, "Get last message id")
        pos, batch = await resolve.topic(name).last_message_id()
        return message_id_json(pos, name.partition_index, batch)

    @router.get(_TOPIC + "/messageid/{timestamp}")
    async def message_id_by_time(
        tenant: str, namespace: str, topic: str, timestamp: PathInt64
    ) -> dict[str, int]:
        """The id of the first message published at or after ``timestamp`` (ms)."""
        name = resolve.topic_name(tenant, namespace, topic)
        resolve.not_partitioned(name, "Get message ID by timestamp")
        t = resolve.topic(name)
        pos = await t.find_position_by_time(timestamp)
        if pos > t.ledger.last_add_confirmed:
            raise RestError(404, "Message ID not found")
        return message_id_json(pos, name.partition_index)

    # --- topic policies ------------------------------------------------------------------
    def topic_policy(tenant: str, namespace: str, topic: str) -> tuple[TopicName, dict[str, Any]]:
        name = resolve.policy_topic(tenant, namespace, topic)
        return name, store.topic(name.full)

    def applied(name: TopicName, key: str) -> Any:
        return store.effective(name, key)

    def set_topic(name: TopicName, **values: Any) -> None:
        store.update_topic(name.full, values)

    @router.get(_TOPIC + "/deduplicationEnabled")
    async def get_topic_deduplication(
        tenant: str, namespace: str, topic: str, applied_: bool = Query(False, alias="applied")
    ) -> bool | None:
        """The topic's deduplication setting (with ``applied``: the one in force)."""
        name, own = topic_policy(tenant, namespace, topic)
        value = applied(name, DEDUPLICATION) if applied_ else own.get(DEDUPLICATION)
        return None if value is None else bool(value)

    @router.post(_TOPIC + "/deduplicationEnabled", status_code=204)
    async def set_topic_deduplication(
        tenant: str, namespace: str, topic: str, enabled: Annotated[bool, Body()]
    ) -> Response:
        """Enable or disable deduplication on the topic (over the namespace's setting)."""
        name, _ = topic_policy(tenant, namespace, topic)
        set_topic(name, **{DEDUPLICATION: enabled})
        return no_content()

    @router.delete(_TOPIC + "/deduplicationEnabled", status_code=204)
    async def remove_topic_deduplication(tenant: str, namespace: str, topic: str) -> Response:
        """Fall back to the namespace's (or broker's) deduplication setting."""
        name, _ = topic_policy(tenant, namespace, topic)
        set_topic(name, **{DEDUPLICATION: None})
        return no_content()

    @router.get(_TOPIC + "/retention")
    async def get_topic_retention(
        tenant: str, namespace: str, topic: str, applied_: bool = Query(False, alias="applied")
    ) -> dict[str, int] | None:
        """The topic's ``RetentionPolicies`` (with ``applied``: the one in force)."""
        name, own = topic_policy(tenant, namespace, topic)
        if applied_:
            return {
                RETENTION_TIME: int(applied(name, RETENTION_TIME)),
                RETENTION_SIZE: int(applied(name, RETENTION_SIZE)),
            }
        return retention_of(own)

    @router.post(_TOPIC + "/retention", status_code=204)
    async def set_topic_retention(
        tenant: str, namespace: str, topic: str, retention: Annotated[RetentionPolicies, Body()]
    ) -> Response:
        """Set the topic's retention (over the namespace's)."""
        name, _ = topic_policy(tenant, namespace, topic)
        retention.validate_pulsar()
        check_retention_fits(
            store.topic_value(name.full, BACKLOG_QUOTAS),
            retention.retentionTimeInMinutes,
            retention.retentionSizeInMB,
            "topic",
        )
        set_topic(
            name,
            **{
                RETENTION_TIME: retention.retentionTimeInMinutes,
                RETENTION_SIZE: retention.retentionSizeInMB,
            },
        )
        return no_content()

    @router.delete(_TOPIC + "/retention", status_code=204)
    async def remove_topic_retention(tenant: str, namespace: str, topic: str) -> Response:
        """Fall back to the namespace's (or broker's) retention."""
        name, _ = topic_policy(tenant, namespace, topic)
        set_topic(name, **{RETENTION_TIME: None, RETENTION_SIZE: None})
        return no_content()

    @router.get(_TOPIC + "/messageTTL")
    async def get_topic_message_ttl(
        tenant: str, namespace: str, topic: str, applied_: bool = Query(False, alias="applied")
    ) -> int | None:
        """The topic's message TTL in seconds (with ``applied``: the one in force)."""
        name, own = topic_policy(tenant, namespace, topic)
        value = applied(name, MESSAGE_TTL) if applied_ else own.get(MESSAGE_TTL)
        return None if value is None else int(value)

    @router.post(_TOPIC + "/messageTTL", status_code=204)
    async def set_topic_message_ttl(
        tenant: str,
        namespace: str,
        topic: str,
        messageTTL: Annotated[int, Query(ge=-(2**31), le=2**31 - 1)],
    ) -> Response:
        """Set the topic's message TTL in seconds (query parameter, as in Pulsar)."""
        name, _ = topic_policy(tenant, namespace, topic)
        set_topic(name, **{MESSAGE_TTL: check_ttl(messageTTL)})
        return no_content()

    @router.delete(_TOPIC + "/messageTTL", status_code=204)
    async def remove_topic_message_ttl(tenant: str, namespace: str, topic: str) -> Response:
        """Fall back to the namespace's (or broker's) message TTL."""
        name, _ = topic_policy(tenant, namespace, topic)
        set_topic(name, **{MESSAGE_TTL: None})
        return no_content()

    return router


# --- partitioned-topic metadata, for both domains ---------------------------------------------
def check_partitions(n: int) -> int:
    """``n`` if it is a partition count this broker accepts, else 406."""
    if not 0 < n <= MAX_PARTITIONS:
        raise RestError(
            406,
            f"The number of partitions should be more than 0 and less than or equal to "
            f"{MAX_PARTITIONS}",
        )
    return n


def check_partition_limit(service: BrokerService, n: int) -> None:
    """406 when ``n`` passes ``maxNumPartitionsPerPartitionedTopic`` (0: no limit)."""
    limit = service.config.maxNumPartitionsPerPartitionedTopic
    if limit > 0 and n > limit:
        raise RestError(406, f"Number of partitions should be less than or equal to {limit}")


def create_partitioned_topic(
    service: BrokerService,
    name: TopicName,
    partitions: int,
    *,
    exists: Callable[[TopicName], bool],
) -> Response:
    """PUT ``.../partitions``: 406 for a bad count, 409 when ``name`` is a partitioned topic or
    ``exists`` (as a non-partitioned one), 412 for a partition's name."""
    check_partitions(partitions)
    check_partition_limit(service, partitions)
    if service.partitions_of(name) > 0 or exists(name):
        raise RestError(409, "This topic already exists")
    if name.partition_index >= 0:
        raise RestError(412, "A partitioned topic's name cannot end with -partition-N")
    try:
        service.create_partitioned_topic(name, partitions)
    except BrokerError as exc:
        raise as_rest_error(exc) from None
    return no_content()


def grow_partitioned_topic(service: BrokerService, name: TopicName, partitions: int) -> Response:
    """POST ``.../partitions``: 406 for a bad count, 409 unless ``name`` is partitioned and
    ``partitions`` more than it has."""
    check_partitions(partitions)
    check_partition_limit(service, partitions)
    current = service.partitions_of(name)
    if current == 0:
        raise RestError(409, "Partitioned topic does not exist")
    if partitions <= current:
        raise RestError(409, "Number of partitions can only grow")
    try:
        service.update_partitioned_topic(name, partitions)
    except BrokerError as exc:
        raise as_rest_error(exc) from None
    return no_content()


_SUMMED = (
    "msgRateIn",
    "msgThroughputIn",
    "msgRateOut",
    "msgThroughputOut",
    "bytesInCounter",
    "msgInCounter",
    "bytesOutCounter",
    "msgOutCounter",
    "storageSize",
    "backlogSize",
)


def aggregate_partitioned(n: int, parts: dict[str, Any], *, per_partition: bool) -> dict[str, Any]:
    """``PartitionedTopicStats``: sums over partitions, subscriptions merged by name."""
    out: dict[str, Any] = {k: 0 for k in _SUMMED}
    out["metadata"] = {"partitions": n}
    out["publishers"] = []
    subs: dict[str, Any] = {}
    for st in parts.values():
        for k in _SUMMED:
            out[k] += st[k]
        out["publishers"].extend(st["publishers"])
        for name, s in st["subscriptions"].items():
            agg = subs.setdefault(
                name,
                {
                    "msgBacklog": 0,
                    "unackedMessages": 0,
                    "msgOutCounter": 0,
                    "bytesOutCounter": 0,
                    "type": s["type"],
                    "consumers": [],
                },
            )
            for k in ("msgBacklog", "unackedMessages", "msgOutCounter", "bytesOutCounter"):
                agg[k] += s[k]
            agg["consumers"].extend(s["consumers"])
    out["subscriptions"] = subs
    out["replication"] = merge_replication_stats(st["replication"] for st in parts.values())
    out["averageMsgSize"] = (
        out["bytesInCounter"] / out["msgInCounter"] if out["msgInCounter"] else 0
    )
    out["partitions"] = parts if per_partition else {}
    return out
