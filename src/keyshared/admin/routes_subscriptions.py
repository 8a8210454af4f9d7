"""Subscription admin and message inspection on Pulsar's ``PersistentTopics`` paths.

``PUT/DELETE .../subscription/{sub}`` create (at a ``MessageId``, default latest) and delete;
``.../skip/{n}``, ``.../skip_all`` (clear-backlog), ``.../resetcursor/{timestamp}`` and
``.../resetcursor`` (body ``ResetCursorData``) move the cursor, each starting a new cursor epoch
so a read in flight cannot land afterwards; ``.../position/{n}`` (peek), ``examinemessage`` and
``ledger/{l}/entry/{e}`` read one entry without moving anything. On a partitioned topic, create,
delete, skip-all and reset-by-time apply to every partition, and reset to a message id to the
partition it names; skip, peek and examine are refused (405) as in Pulsar.
``POST/GET .../replicatedSubscriptionStatus`` (and ``PUT ...?replicated=true``) turn on, off and
show the replication of a subscription's state to the other clusters.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Body, Query
from fastapi.responses import Response

from keyshared.admin.messages import entry_response
from keyshared.admin.rest import (
    MessageIdData,
    PathInt64,
    QueryInt64,
    Resolver,
    RestError,
    no_content,
)
from keyshared.admin.topic_ops import nth_entry, nth_unacked
from keyshared.broker.service import BrokerService
from keyshared.broker.subscription import Subscription
from keyshared.broker.topic import PersistentTopic
from keyshared.broker.topic_name import TopicName
from keyshared.storage.position import EARLIEST, LATEST, Position

_TOPIC = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"
_SUB = _TOPIC + "/subscription/{subName}"


def subscription_routes(service: BrokerService) -> APIRouter:
    """The subscription and message routes of ``service``."""
    router = APIRouter(tags=["subscriptions"])
    resolve = Resolver(service)

    def subscriptions(name: TopicName, sub: str) -> list[Subscription]:
        """``sub`` on the topic, or on every partition that has it; 404 if none has it."""
        found = [s for t in resolve.topics_for(name) if (s := t.subscriptions.get(sub))]
        if not found:
            raise RestError(404, "Subscription not found")
        return found

    def single(tenant: str, namespace: str, topic: str, what: str) -> PersistentTopic:
        name = resolve.topic_name(tenant, namespace, topic)
        resolve.not_partitioned(name, what)
        return resolve.topic(name)

    async def read(t: PersistentTopic, pos: Position | None) -> Response:
        entry = await t.ledger.read_entry(pos) if pos is not None else None
        if entry is None:
            raise RestError(404, "Message not found")
        return entry_response(entry)

    # --- create and delete -------------------------------------------------------------------
    @router.put(_TOPIC + "/subscription/{subscriptionName}", status_code=204)
    async def create_subscription(
        tenant: str,
        namespace: str,
        topic: str,
        subscriptionName: str,
        message_id: Annotated[MessageIdData | str | None, Body()] = None,
        replicated: bool = Query(False),
    ) -> Response:
        """Create a durable subscription at ``messageId`` (latest when not given)."""
        name = resolve.topic_name(tenant, namespace, topic)
        start = MessageIdData.of(message_id).position()
        targets = resolve.topics_for(name)
        if any(subscriptionName in t.subscriptions for t in targets):
            raise RestError(409, "Subscription already exists for topic")
        for t in targets:
            sub = t._create_subscription(subscriptionName, True, start == EARLIEST, None)
            if start not in (EARLIEST, LATEST):
                sub.reset_cursor(start)
            if replicated:
                t.replicated_subscriptions.set_replicated(sub, True)
        return no_content()

    # --- replicated subscriptions -----------------------------------------------------------
    @router.post(_SUB + "/replicatedSubscriptionStatus", status_code=204)
    async def set_replicated_status(
        tenant: str, namespace: str, topic: str, subName: str, enabled: Annotated[bool, Body()]
    ) -> Response:
        """Turn the replication of a durable subscription's state on or off (on every
        partition that has it); 405 when this broker has ``enableReplicatedSubscriptions``
        off."""
        for s in subscriptions(resolve.topic_name(tenant, namespace, topic), subName):
            if not s.topic.replicated_subscriptions.set_replicated(s, enabled):
                raise RestError(405, "Replicated subscriptions are not enabled on this broker")
        return no_content()

    @router.get(_SUB + "/replicatedSubscriptionStatus")
    async def get_replicated_status(
        tenant: str, namespace: str, topic: str, subName: str
    ) -> dict[str, bool]:
        """Whether the subscription is replicated, by topic (partition) name."""
        subs = subscriptions(resolve.topic_name(tenant, namespace, topic), subName)
        return {s.topic.name.full: s.replicated for s in subs}

    @router.delete(_SUB, status_code=204)
    async def delete_subscription(
        tenant: str, namespace: str, topic: str, subName: str, force: bool = Query(False)
    ) -> Response:
        """Delete a subscription; refused (412) while consumers are attached unless forced."""
        name = resolve.topic_name(tenant, namespace, topic)
        subs = subscriptions(name, subName)
        if not force and any(s.consumers for s in subs):
            raise RestError(412, "Subscription has active connected consumers")
        for s in subs:
            s.disconnect_all()
            s.topic.remove_subscription(subName)
        return no_content()

    # --- cursor moves --------------------------------------------------------------------
    @router.post(_SUB + "/skip_all", status_code=204)
    async def skip_all(tenant: str, namespace: str, topic: str, subName: str) -> Response:
        """Clear the backlog: everything stored so far is acknowledged."""
        for s in subscriptions(resolve.topic_name(tenant, namespace, topic), subName):
            s.clear_backlog()
        return no_content()

    @router.post(_SUB + "/skip/{numMessages}", status_code=204)
    async def skip(
        tenant: str, namespace: str, topic: str, subName: str, numMessages: PathInt64
    ) -> Response:
        """Acknowledge the next ``numMessages`` unacknowledged entries."""
        t = single(tenant, namespace, topic, "Skip messages")
        if numMessages < 0:
            raise RestError(412, "Number of messages to skip must be >= 0")
        resolve.subscription(t, subName).skip(numMessages)
        return no_content()

    @router.post(_SUB + "/resetcursor/{timestamp}", status_code=204)
    async def reset_cursor_by_time(
        tenant: str, namespace: str, topic: str, subName: str, timestamp: PathInt64
    ) -> Response:
        """Reset to the first message published at or after ``timestamp`` (ms); consumers are
        disconnected and reconnect at the new position."""
        for s in subscriptions(resolve.topic_name(tenant, namespace, topic), subName):
            s.reset_cursor(await s.topic.find_position_by_time(timestamp))
        return no_content()

    @router.post(_SUB + "/resetcursor", status_code=204)
    async def reset_cursor(
        tenant: str,
        namespace: str,
        topic: str,
        subName: str,
        body: Annotated[MessageIdData | str, Body()],
    ) -> Response:
        """Reset to a message id (after it with ``isExcluded``); consumers are disconnected."""
        message_id = MessageIdData.of(body)
        name = resolve.topic_name(tenant, namespace, topic)
        if resolve.partitions(name) > 0:
            index = message_id.partitionIndex
            if not 0 <= index < resolve.partitions(name):
                raise RestError(405, "Reset cursor on a partitioned topic needs a partition index")
            name = name.partition(index)
        s = resolve.subscription(resolve.topic(name), subName)
        pos = message_id.position()
        if message_id.exclude and pos not in (EARLIEST, LATEST):
            pos = s.topic.ledger.next_position(pos)
        s.reset_cursor(pos)
        return no_content()

    # --- reading messages ----------------------------------------------------------------
    @router.get(_SUB + "/position/{messagePosition}")
    async def peek(
        tenant: str, namespace: str, topic: str, subName: str, messagePosition: PathInt64
    ) -> Response:
        """The ``messagePosition``-th (1-based) unacknowledged entry of the subscription."""
        t = single(tenant, namespace, topic, "Peek messages")
        s = resolve.subscription(t, subName)
        if messagePosition < 1:
            raise RestError(412, "Message position must be >= 1")
        return await read(t, nth_unacked(s, messagePosition))

    @router.get(_TOPIC + "/examinemessage")
    async def examine(
        tenant: str,
        namespace: str,
        topic: str,
        initialPosition: Literal["earliest", "latest"] = Query("latest"),
        messagePosition: QueryInt64 = 1,
    ) -> Response:
        """The ``messagePosition``-th entry from the earliest or the latest one."""
        t = single(tenant, namespace, topic, "Examine message")
        if messagePosition < 1:
            raise RestError(412, "Message position must be >= 1")
        pos = nth_entry(t.ledger, messagePosition, from_latest=initialPosition == "latest")
        return await read(t, pos)

    @router.get(_TOPIC + "/ledger/{ledgerId}/entry/{entryId}")
    async def get_message_by_id(
        tenant: str, namespace: str, topic: str, ledgerId: PathInt64, entryId: PathInt64
    ) -> Response:
        """The entry at ``ledgerId:entryId``."""
        t = single(tenant, namespace, topic, "Get message by id")
        return await read(t, Position(ledgerId, entryId))

    return router
