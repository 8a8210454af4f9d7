"""The compactor on a real storage, without a network: commit order, the crash between the
metadata record and the compaction cursor, and reads of the compacted view by original id."""

from __future__ import annotations

import asyncio
from pathlib import Path

from keyshared.broker.compaction import COMPACTION_SUBSCRIPTION, RECORD_PREFIX
from keyshared.broker.service import BrokerService
from keyshared.broker.topic import PersistentTopic
from keyshared.broker.topic_name import TopicName
from keyshared.config import BrokerConfig
from keyshared.protocol import pulsar_api_pb2 as pb
from keyshared.protocol.metadata import encode_payload_section
from keyshared.storage.position import Position
from keyshared.storage.store import Storage, StorageConfig

NAME = TopicName.parse("persistent://public/default/compactor")


def section(key: str, value: bytes) -> bytes:
    md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, partition_key=key)
    return encode_payload_section(md, value)


async def publish(topic: PersistentTopic, items: list[tuple[str, bytes]]) -> list[Position]:
    out = []
    futures = []
    for key, value in items:
        pos, fut = topic.ledger.add_entry(section(key, value))
        out.append(pos)
        futures.append(fut)
    await asyncio.gather(*futures)
    return out


def open_service(path: Path) -> tuple[Storage, BrokerService]:
    storage = Storage(path, StorageConfig(journal_sync_data=False)).open()
    return storage, BrokerService(BrokerConfig(), storage)


async def view_of(topic: PersistentTopic) -> list[tuple[Position, bytes]]:
    view = topic.compactor.view()
    assert view is not None
    records = await view.read(Position(-1, -1), 1000)
    return [(r.position, r.data) for r in records]


def test_commit_and_repair_after_a_crash_between_record_and_cursor(tmp_path: Path) -> None:
    async def scenario() -> None:
        storage, service = open_service(tmp_path)
        topic = service.get_topic(NAME, create=True)
        first = await publish(topic, [("a", b"1"), ("b", b"2"), ("a", b"3")])
        await topic.compactor.trigger()
        assert topic.compactor.status_json() == {"status": "SUCCESS", "lastError": ""}
        assert topic.compactor.horizon == first[-1]
        cursor = topic.subscriptions[COMPACTION_SUBSCRIPTION].cursor
        assert cursor.mark_delete_position == first[-1]
        assert [p for p, _ in await view_of(topic)] == [first[1], first[2]]
        old_name = topic.compactor.compacted_ledger_name

        second = await publish(topic, [("b", b"4")])
        await topic.compactor.trigger()
        assert [p for p, _ in await view_of(topic)] == [first[2], second[0]]
        await asyncio.sleep(0.05)  # the previous compacted ledger is deleted in the background
        assert old_name not in storage.managed_ledger_names()

        # A crash after the record named a newer horizon but before the cursor moved: the
        # cursor still sits at the first horizon when the broker comes back.
        third = await publish(topic, [("c", b"5")])
        record = storage.metadata.get_json(RECORD_PREFIX + NAME.full)
        assert isinstance(record, dict)
        record["horizon"] = [third[0].ledger_id, third[0].entry_id]
        storage.metadata.put_json(RECORD_PREFIX + NAME.full, record)
        await service.close()
        await storage.close()

        storage, service = open_service(tmp_path)
        topic = service.get_topic(NAME, create=False)
        cursor = topic.subscriptions[COMPACTION_SUBSCRIPTION].cursor
        assert topic.compactor.horizon == third[0]
        # Repaired: the record wins, so nothing is compacted twice from the topic.
        assert cursor.mark_delete_position == third[0]
        await service.close()
        await storage.close()

    asyncio.run(scenario())


def test_threshold_creates_the_cursor_and_triggers(tmp_path: Path) -> None:
    async def scenario() -> None:
        storage, service = open_service(tmp_path)
        service.config.brokerServiceCompactionThresholdInBytes = 100
        topic = service.get_topic(NAME, create=True)
        assert not topic.compactor.check_threshold(now=0.0)
        # Under the threshold, the compaction cursor is created (so nothing is trimmed before
        # compaction sees it) but nothing runs.
        assert COMPACTION_SUBSCRIPTION in topic.subscriptions
        await publish(topic, [("k", b"x" * 200)])
        # Checked at most once per monitor interval.
        assert not topic.compactor.check_threshold(now=1.0)
        assert topic.compactor.check_threshold(now=1000.0)
        assert topic.compactor._task is not None
        await topic.compactor._task
        assert topic.compactor.status == "SUCCESS"
        assert topic.compactor.backlog_bytes() == 0
        await service.close()
        await storage.close()

    asyncio.run(scenario())
