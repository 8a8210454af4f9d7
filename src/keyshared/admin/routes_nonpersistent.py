"""Non-persistent topics: ``/admin/v2/non-persistent/{tenant}/{namespace}/...``.

As Pulsar's ``NonPersistentTopics`` resource: the loaded topics of a namespace, partitioned-topic
metadata (create, grow, read, delete), stats, partitioned stats, internal stats, subscriptions
and delete. What needs stored messages or a cursor (last message id, skip, expiry, reset-cursor)
is refused with 405, as Pulsar refuses it on a non-persistent topic.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query
from fastapi.responses import Response

from keyshared.admin.rest import Resolver, RestError, no_content
from keyshared.admin.routes_topics import (
    aggregate_partitioned,
    create_partitioned_topic,
    grow_partitioned_topic,
)
from keyshared.broker.nonpersistent_topic import NON_PERSISTENT, NonPersistentTopic
from keyshared.broker.service import BrokerService
from keyshared.broker.topic_name import TopicName

_NS = "/admin/v2/non-persistent/{tenant}/{namespace}"
_TOPIC = _NS + "/{topic}"


def nonpersistent_routes(service: BrokerService) -> APIRouter:
    """The non-persistent topic routes of ``service``."""
    router = APIRouter(tags=["non-persistent topic"])
    resolve = Resolver(service)
    topics = service.nonpersistent

    def topic_name(tenant: str, namespace: str, topic: str) -> TopicName:
        return resolve.topic_name(tenant, namespace, topic, NON_PERSISTENT)

    def loaded(name: TopicName) -> NonPersistentTopic:
        topic = topics.loaded(name)
        if topic is None:
            raise RestError(404, "Topic not found")
        return topic

    # --- lists ---------------------------------------------------------------------------------
    @router.get(_NS)
    async def list_topics(tenant: str, namespace: str) -> list[str]:
        """The namespace's loaded non-persistent topics (Pulsar lists those a broker serves)."""
        return topics.names(resolve.namespace(tenant, namespace))

    @router.get(_NS + "/partitioned")
    async def list_partitioned(tenant: str, namespace: str) -> list[str]:
        """Partitioned non-persistent topics of the namespace."""
        return topics.list_partitioned(resolve.namespace(tenant, namespace))

    # --- partitioned metadata (kept in the metadata store, as Pulsar keeps it) ---------------
    @router.put(_TOPIC + "/partitions", status_code=204)
    async def create_partitioned(
        tenant: str, namespace: str, topic: str, partitions: Annotated[int, Body()]
    ) -> Response:
        """Create a partitioned non-persistent topic (409 while it is loaded unpartitioned)."""
        name = topic_name(tenant, namespace, topic)
        return create_partitioned_topic(
            service, name, partitions, exists=lambda n: topics.loaded(n) is not None
        )

    @router.post(_TOPIC + "/partitions", status_code=204)
    async def update_partitioned(
        tenant: str, namespace: str, topic: str, partitions: Annotated[int, Body()]
    ) -> Response:
        """Grow a partitioned non-persistent topic."""
        return grow_partitioned_topic(service, topic_name(tenant, namespace, topic), partitions)

    @router.get(_TOPIC + "/partitions")
    async def get_partitions(tenant: str, namespace: str, topic: str) -> dict[str, int]:
        """``PartitionedTopicMetadata`` (0 partitions for a non-partitioned topic)."""
        return {"partitions": service.partitions_of(topic_name(tenant, namespace, topic))}

    @router.delete(_TOPIC + "/partitions", status_code=204)
    async def delete_partitioned(
        tenant: str, namespace: str, topic: str, force: bool = Query(False)
    ) -> Response:
        """Delete a partitioned non-persistent topic (its loaded partitions are closed)."""
        name = topic_name(tenant, namespace, topic)
        n = service.partitions_of(name)
        if n == 0:
            raise RestError(404, "Partitioned topic does not exist")
        parts = [t for i in range(n) if (t := topics.loaded(name.partition(i))) is not None]
        if not force and any(busy(t) for t in parts):
            raise RestError(412, f"Topic {name} has active producers/subscriptions")
        for t in parts:
            await t.close()
        await service.delete_partitioned_topic(name, force=force)
        return no_content()

    @router.delete(_TOPIC, status_code=204)
    async def delete_topic(
        tenant: str, namespace: str, topic: str, force: bool = Query(False)
    ) -> Response:
        """Delete (unload) a topic; refused (412) while clients are attached unless forced."""
        t = loaded(topic_name(tenant, namespace, topic))
        if busy(t) and not force:
            raise RestError(412, f"Topic {t.name} has active producers/subscriptions")
        await t.close()
        return no_content()

    # --- stats ---------------------------------------------------------------------------------
    @router.get(_TOPIC + "/stats")
    async def topic_stats(tenant: str, namespace: str, topic: str) -> Any:
        """``NonPersistentTopicStats``."""
        return loaded(topic_name(tenant, namespace, topic)).stats()

    @router.get(_TOPIC + "/internalStats")
    async def topic_internal_stats(tenant: str, namespace: str, topic: str) -> Any:
        """What Pulsar's non-persistent internal stats hold."""
        return loaded(topic_name(tenant, namespace, topic)).internal_stats()

    @router.get(_TOPIC + "/partitioned-stats")
    async def partitioned_stats(
        tenant: str, namespace: str, topic: str, perPartition: bool = Query(True)
    ) -> Any:
        """Sums over the loaded partitions, optionally each partition's stats."""
        name = topic_name(tenant, namespace, topic)
        n = service.partitions_of(name)
        if n == 0:
            raise RestError(404, "Partitioned topic not found")
        parts = {
            t.name.full: t.stats()
            for i in range(n)
            if (t := topics.loaded(name.partition(i))) is not None
        }
        out = aggregate_partitioned(n, parts, per_partition=perPartition)
        out["msgDropRate"] = sum(p["msgDropRate"] for p in parts.values())
        return out

    @router.get(_TOPIC + "/subscriptions")
    async def topic_subscriptions(tenant: str, namespace: str, topic: str) -> list[str]:
        """The topic's subscriptions."""
        return sorted(loaded(topic_name(tenant, namespace, topic)).subscriptions)

    # --- what a non-persistent topic cannot do -------------------------------------------------
    def refused(what: str, tenant: str, namespace: str, topic: str) -> RestError:
        """405 for ``what``, once the topic's name and namespace passed (412 and 404 first)."""
        topic_name(tenant, namespace, topic)
        return RestError(405, f"{what} on a non-persistent topic is not allowed")

    @router.get(_TOPIC + "/lastMessageId")
    async def last_message_id(tenant: str, namespace: str, topic: str) -> Any:
        """Refused: nothing is stored."""
        raise refused("GetLastMessageId", tenant, namespace, topic)

    @router.post(_TOPIC + "/subscription/{sub}/skip/{n}")
    @router.post(_TOPIC + "/subscription/{sub}/skip_all")
    async def skip(tenant: str, namespace: str, topic: str, sub: str) -> Any:
        """Refused: there is no backlog."""
        raise refused("Skip messages", tenant, namespace, topic)

    @router.post(_TOPIC + "/subscription/{sub}/expireMessages/{seconds}")
    @router.post(_TOPIC + "/all_subscription/expireMessages/{seconds}")
    async def expire(tenant: str, namespace: str, topic: str) -> Any:
        """Refused: there is no backlog."""
        raise refused("Expiry messages", tenant, namespace, topic)

    @router.post(_TOPIC + "/subscription/{sub}/resetcursor/{timestamp}")
    @router.post(_TOPIC + "/subscription/{sub}/resetcursor")
    async def reset_cursor(tenant: str, namespace: str, topic: str, sub: str) -> Any:
        """Refused: there is no cursor."""
        raise refused("Reset-cursor", tenant, namespace, topic)

    return router


def busy(topic: NonPersistentTopic) -> bool:
    """Producers or consumers attached."""
    return bool(topic.producers) or any(s.consumers for s in topic.subscriptions.values())
