"""The consumer commands of a connection: SUBSCRIBE, FLOW, ACK, SEEK, ..., and MESSAGE out."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from keyshared.broker.consumer import Consumer, KeySharedMeta, OutboundMessage, SubType
from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.nonpersistent_topic import NonPersistentTopic
from keyshared.broker.subscription import AckItem
from keyshared.protocol import encode_message_header, pb
from keyshared.server import schema_commands
from keyshared.server.connection_core import (
    _INT64_MAX,
    _U64,
    ConnectionCore,
    T,
    _non_persistent,
    _u64,
    _wire_error,
    position_of,
)
from keyshared.storage.position import EARLIEST, LATEST, Position


class ConsumerCommands(ConnectionCore):
    """Consumers on a connection; the broker's ``ConsumerTransport`` side of it."""

    def _on_consumer_stats(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.consumerStats
        consumer = self.consumers.get(r.consumer_id)
        resp = pb.CommandConsumerStatsResponse(request_id=r.request_id)
        if consumer is None:
            resp.error_code = _wire_error(ServerError.ConsumerNotFound)
            resp.error_message = "Consumer not found"
        else:
            resp.consumerName = consumer.consumer_name
            resp.availablePermits = max(consumer.available_permits, 0)
            resp.unackedMessages = consumer.unacked_messages
            resp.blockedConsumerOnUnackedMsgs = consumer.blocked_on_unacked
            if not _non_persistent(consumer):
                resp.msgBacklog = consumer.subscription.cursor.number_of_entries_in_backlog
            resp.type = SubType(consumer.sub_type).name
        self.send_command(T(type=T.CONSUMER_STATS_RESPONSE, consumerStatsResponse=resp))

    # --- consumers ---------------------------------------------------------------------------
    def _on_subscribe(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.subscribe
        if not r.durable and r.start_message_rollback_duration_sec > 0:
            self._spawn(self._subscribe_rolled_back(r))
            return
        self._subscribe(r, None)

    async def _subscribe_rolled_back(self, r: pb.CommandSubscribe) -> None:
        """A reader starting ``start_message_rollback_duration_sec`` back: find where first."""
        try:
            name = self.service.parse_topic(r.topic)
            self._authorize(name.full, "consume")
            topic = self.service.get_any_topic(name, create=r.force_topic_creation)
            since_ms = int(time.time() * 1000) - r.start_message_rollback_duration_sec * 1000
            rollback_to = (
                None
                if isinstance(topic, NonPersistentTopic)
                else await topic.find_position_by_time(since_ms)
            )
        except BrokerError as exc:
            self._error(r.request_id, exc.code, exc.message)
            return
        self._subscribe(r, rollback_to)

    def _subscribe(self, r: pb.CommandSubscribe, rollback_to: Position | None) -> None:
        request_id = r.request_id
        if r.consumer_id in self.consumers:
            # The client re-sent SUBSCRIBE (e.g. after a timeout): it already exists.
            self._success(request_id)
            return
        try:
            name = self.service.parse_topic(r.topic)
            self._authorize(name.full, "consume")
            if self.service.partitions_of(name) > 0:
                raise BrokerError(
                    ServerError.NotAllowedError, f"{name} is partitioned: subscribe to partitions"
                )
            topic = self.service.get_any_topic(name, create=r.force_topic_creation)
            if r.HasField("schema"):
                self.service.schemas.for_consumer(
                    name,
                    schema_commands.schema_tuple(r.schema),
                    idle=schema_commands.topic_is_idle(topic),
                )
            sub_type = SubType(r.subType)
            if r.read_compacted and sub_type not in (SubType.Exclusive, SubType.Failover):
                raise BrokerError(
                    ServerError.NotAllowedError,
                    "readCompacted only allowed on failover or exclusive subscriptions",
                )
            ksm = None
            if sub_type is SubType.Key_Shared:
                meta = r.keySharedMeta
                ksm = KeySharedMeta(
                    mode="STICKY" if meta.keySharedMode == pb.STICKY else "AUTO_SPLIT",
                    ranges=[(ir.start, ir.end) for ir in meta.hashRanges],
                    allow_out_of_order_delivery=meta.allowOutOfOrderDelivery,
                )
            start = None
            if r.HasField("start_message_id"):
                start = position_of(r.start_message_id)
                if start.ledger_id >= _INT64_MAX:
                    start = LATEST
                elif start.ledger_id < 0:
                    start = EARLIEST
            consumer_name = r.consumer_name
            durable = r.durable
            # Non-persistent consumers hold nothing unacked (Pulsar: maxUnackedMessages 0); the
            # subscription gives the others their maxUnackedMessagesPerConsumer.
            tracks = sub_type in (SubType.Shared, SubType.Key_Shared) and not isinstance(
                topic, NonPersistentTopic
            )

            def factory(sub: Any) -> Consumer:
                return Consumer(
                    consumer_id=r.consumer_id,
                    consumer_name=consumer_name,
                    subscription=sub,
                    sub_type=sub_type,
                    transport=self,
                    priority_level=r.priority_level,
                    metadata={kv.key: kv.value for kv in r.metadata},
                    key_shared_meta=ksm,
                    track_pending_acks=tracks,
                    read_compacted=r.read_compacted,
                )

            consumer = topic.subscribe(
                factory,
                subscription=r.subscription,
                sub_type=sub_type,
                durable=durable,
                initial_position_earliest=r.initialPosition == pb.CommandSubscribe.Earliest,
                start_message_id=start,
                rollback_to=rollback_to,
                **_replicated_state(r, topic),
            )
        except BrokerError as exc:
            self._error(request_id, exc.code, exc.message)
            return
        except ValueError as exc:
            self._error(request_id, ServerError.NotAllowedError, str(exc))
            return
        self.consumers[r.consumer_id] = consumer
        self._success(request_id)

    def _on_flow(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.flow
        consumer = self.consumers.get(r.consumer_id)
        if consumer is None:
            return
        if consumer.add_permits(r.messagePermits):
            disp = consumer.subscription.dispatcher
            if disp is not None:
                disp.consumer_flow(consumer, r.messagePermits)

    def _on_ack(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.ack
        consumer = self.consumers.get(r.consumer_id)
        if consumer is None:
            return
        items = [
            AckItem(position_of(mid), list(mid.ack_set) if len(mid.ack_set) else None)
            for mid in r.message_id
        ]
        consumer.subscription.acknowledge(consumer, r.ack_type == pb.CommandAck.Cumulative, items)
        if r.HasField("request_id"):
            self.send_command(
                T(
                    type=T.ACK_RESPONSE,
                    ackResponse=pb.CommandAckResponse(
                        consumer_id=r.consumer_id, request_id=r.request_id
                    ),
                )
            )

    def _on_redeliver(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.redeliverUnacknowledgedMessages
        consumer = self.consumers.get(r.consumer_id)
        if consumer is None:
            return
        positions = [position_of(mid) for mid in r.message_ids] if len(r.message_ids) else None
        consumer.subscription.redeliver_unacknowledged(consumer, positions)

    def _on_seek(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.seek
        consumer = self.consumers.get(r.consumer_id)
        if consumer is None:
            # Pulsar answers an unknown consumer id with MetadataError here (ServerCnx).
            self._error(r.request_id, ServerError.MetadataError, "Consumer not found")
            return
        self._spawn(self._seek(consumer, r))

    async def _seek(self, consumer: Consumer, r: pb.CommandSeek) -> None:
        if _non_persistent(consumer):
            # Pulsar's NonPersistentSubscription.resetCursor: nothing to move, success.
            self._success(r.request_id)
            return
        sub = consumer.subscription
        topic = sub.topic
        try:
            if r.HasField("message_id"):
                target = position_of(r.message_id)
                if target.ledger_id < 0:
                    target = topic.ledger.first_position or topic.ledger.next_position(
                        topic.ledger.last_add_confirmed
                    )
                elif target.ledger_id >= _INT64_MAX:
                    target = topic.ledger.next_position(topic.ledger.last_add_confirmed)
            elif r.HasField("message_publish_time"):
                target = await topic.find_position_by_time(r.message_publish_time)
            else:
                raise BrokerError(ServerError.NotAllowedError, "SEEK needs a message id or a time")
            sub.reset_cursor(target)
        except BrokerError as exc:
            self._error(r.request_id, exc.code, exc.message)
            return
        self._success(r.request_id)

    def _on_get_last_message_id(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.getLastMessageId
        consumer = self.consumers.get(r.consumer_id)
        if consumer is None:
            # Pulsar answers an unknown consumer id with MetadataError here (ServerCnx).
            self._error(r.request_id, ServerError.MetadataError, "Consumer not found")
            return
        self._spawn(self._get_last_message_id(consumer, r.request_id))

    async def _get_last_message_id(self, consumer: Consumer, request_id: int) -> None:
        if _non_persistent(consumer):
            self._error(
                request_id,
                ServerError.NotAllowedError,
                "GetLastMessageId is not supported on non-persistent topic",
            )
            return
        topic = consumer.subscription.topic
        try:
            compacted = None
            if consumer.read_compacted:
                compacted = await topic.compactor.last_message_id()
            last, batch_index = compacted or await topic.last_message_id()
        except Exception as exc:
            self._error(request_id, ServerError.PersistenceError, f"Read failed: {exc}")
            return
        partition = topic.name.partition_index
        mid = pb.MessageIdData(
            ledgerId=_u64(last.ledger_id), entryId=_u64(last.entry_id), partition=partition
        )
        if batch_index >= 0:
            mid.batch_index = batch_index
        mdp = consumer.subscription.cursor.mark_delete_position
        self.send_command(
            T(
                type=T.GET_LAST_MESSAGE_ID_RESPONSE,
                getLastMessageIdResponse=pb.CommandGetLastMessageIdResponse(
                    last_message_id=mid,
                    request_id=request_id,
                    consumer_mark_delete_position=pb.MessageIdData(
                        ledgerId=_u64(mdp.ledger_id), entryId=_u64(mdp.entry_id)
                    ),
                ),
            )
        )

    def _on_unsubscribe(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.unsubscribe
        consumer = self.consumers.get(r.consumer_id)
        if consumer is None:
            # Pulsar answers an unknown consumer id with MetadataError here (ServerCnx).
            self._error(r.request_id, ServerError.MetadataError, "Consumer not found")
            return
        sub = consumer.subscription
        try:
            sub.topic.unsubscribe(sub.name, consumer)
        except BrokerError as exc:
            self._error(r.request_id, exc.code, exc.message)
            return
        self.consumers.pop(r.consumer_id, None)
        self._success(r.request_id)

    def _on_close_consumer(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.close_consumer
        consumer = self.consumers.pop(r.consumer_id, None)
        if consumer is not None:
            consumer.subscription.remove_consumer(consumer)
        self._success(r.request_id)

    # --- ConsumerTransport -------------------------------------------------------------------
    def send_messages(self, consumer: Consumer, messages: Sequence[OutboundMessage]) -> None:
        """Write MESSAGE frames, all in one write."""
        if self.closed or self.transport is None:
            return
        cid = consumer.consumer_id
        partition = consumer.subscription.topic.name.partition_index
        # Header and stored payload go out as separate buffers: the payload is never copied.
        frames: list[bytes] = []
        append = frames.append
        for m in messages:
            entry = m.entry
            pos = entry.position
            data = entry.data
            append(
                encode_message_header(
                    cid,
                    _u64(pos.ledger_id),
                    _u64(pos.entry_id),
                    len(data),
                    entry.checksum,
                    redelivery_count=m.redelivery_count,
                    partition=partition,
                    ack_set=m.ack_set,
                )
            )
            append(data)
        self.write_many(frames)

    def close_consumer(self, consumer: Consumer) -> None:
        """Broker-initiated close: the client re-subscribes."""
        self.consumers.pop(consumer.consumer_id, None)
        self.send_command(
            T(
                type=T.CLOSE_CONSUMER,
                close_consumer=pb.CommandCloseConsumer(
                    consumer_id=consumer.consumer_id, request_id=_U64 - 1
                ),
            )
        )

    def active_consumer_change(self, consumer: Consumer, is_active: bool) -> None:
        """Tell a Failover consumer whether it is active."""
        self.send_command(
            T(
                type=T.ACTIVE_CONSUMER_CHANGE,
                active_consumer_change=pb.CommandActiveConsumerChange(
                    consumer_id=consumer.consumer_id, is_active=is_active
                ),
            )
        )


def _replicated_state(r: pb.CommandSubscribe, topic: Any) -> dict[str, bool]:
    """``replicate_subscription_state`` for a persistent topic's durable subscription."""
    if isinstance(topic, NonPersistentTopic) or not (r.durable and r.replicate_subscription_state):
        return {}
    return {"replicate_subscription_state": True}
