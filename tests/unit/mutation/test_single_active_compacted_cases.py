"""Exclusive consumers reading the compacted view, on a real topic and storage without a
network: what ``make mutate`` found no test saying of ``SingleActiveDispatcher``'s compacted
reads (bench/results/mutation/report.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from keyshared.broker.consumer import Consumer, OutboundMessage, SubType
from keyshared.broker.service import BrokerService
from keyshared.broker.subscription import AckItem, Subscription
from keyshared.broker.topic import PersistentTopic
from keyshared.broker.topic_name import TopicName
from keyshared.config import BrokerConfig
from keyshared.protocol import pulsar_api_pb2 as pb
from keyshared.protocol.metadata import encode_batch, encode_payload_section
from keyshared.storage.position import Position
from keyshared.storage.store import Storage, StorageConfig
from tests.sim.world import SimTransport

NAME = TopicName.parse("persistent://public/default/compacted-reads")


def single(key: str, value: bytes) -> bytes:
    md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, partition_key=key)
    return encode_payload_section(md, value)


def batch(*keys: str) -> bytes:
    md = pb.MessageMetadata(
        producer_name="p", sequence_id=0, publish_time=1, num_messages_in_batch=len(keys)
    )
    body = encode_batch((pb.SingleMessageMetadata(partition_key=k), k.encode()) for k in keys)
    return encode_payload_section(md, body)


async def publish(topic: PersistentTopic, *payloads: bytes) -> list[Position]:
    out = []
    for data in payloads:
        pos, fut = topic.ledger.add_entry(data)
        await fut
        out.append(pos)
    return out


class Reader:
    """One Exclusive ``read_compacted`` consumer on its own subscription, and what it got."""

    def __init__(self, topic: PersistentTopic, name: str) -> None:
        self.got: list[OutboundMessage] = []

        def on_messages(_c: Consumer, messages: Sequence[OutboundMessage]) -> None:
            self.got.extend(messages)

        def make(sub: Subscription) -> Consumer:
            return Consumer(
                consumer_id=len(name),
                consumer_name=name,
                subscription=sub,
                sub_type=SubType.Exclusive,
                transport=SimTransport(on_messages, lambda c: None),
                read_compacted=True,
            )

        self.consumer = topic.subscribe(
            make,
            subscription=name,
            sub_type=SubType.Exclusive,
            durable=True,
            initial_position_earliest=True,
            start_message_id=None,
        )

    def flow(self, permits: int) -> None:
        self.consumer.add_permits(permits)
        disp = self.consumer.subscription.dispatcher
        assert disp is not None
        disp.consumer_flow(self.consumer, permits)

    @property
    def positions(self) -> list[Position]:
        return [m.entry.position for m in self.got]


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_compacted_reads_keep_each_readers_place_and_the_batch_indexes_that_survive(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        storage = Storage(tmp_path, StorageConfig(journal_sync_data=False)).open()
        service = BrokerService(BrokerConfig(), storage)
        topic = service.get_topic(NAME, create=True)
        # Index 0 of the batch (key a) is compacted out by the later a; index 1 (key b) stays.
        first, kept_c, last_a = await publish(
            topic, batch("a", "b"), single("c", b"1"), single("a", b"2")
        )
        await topic.compactor.trigger()
        assert topic.compactor.status == "SUCCESS"

        one = Reader(topic, "one")
        one.flow(1)
        await settle()
        assert one.positions == [first]
        # The compacted view's ack set: only index 1 still to be delivered (a set bit).
        assert one.got[0].ack_set == [0b10]

        # A second reader starts from the start of the view, not where the first one is.
        two = Reader(topic, "two")
        two.flow(10)
        await settle()
        assert two.positions == [first, kept_c, last_a]
        one.flow(10)
        await settle()
        assert one.positions == [first, kept_c, last_a]
        assert [m.ack_set for m in one.got[1:]] == [None, None]
        await service.close()
        await storage.close()

    asyncio.run(scenario())


def test_a_compacted_batch_read_again_carries_the_indexes_acked_since(tmp_path: Path) -> None:
    async def scenario() -> None:
        storage = Storage(tmp_path, StorageConfig(journal_sync_data=False)).open()
        service = BrokerService(BrokerConfig(), storage)
        topic = service.get_topic(NAME, create=True)
        (kept,) = await publish(topic, batch("x", "y"))
        await topic.compactor.trigger()
        reader = Reader(topic, "one")
        reader.flow(10)
        await settle()
        assert reader.positions == [kept] and reader.got[0].ack_set is None
        # Index 0 acked on its own, then everything unacked is asked for again.
        sub = reader.consumer.subscription
        sub.acknowledge(reader.consumer, False, [AckItem(kept, [0b10])])
        disp = sub.dispatcher
        assert disp is not None
        disp.redeliver(reader.consumer, None)
        await settle()
        assert reader.positions == [kept, kept]
        assert reader.got[1].ack_set == [0b10]
        await service.close()
        await storage.close()

    asyncio.run(scenario())
