"""An individual ACK applied as one command leaves what its ids applied one by one leave.

``Subscription.acknowledge`` hands a command's whole-entry ids to the cursor together (one
range-set pass per command); batch-index ids, duplicates, ids of another consumer and ids
nobody holds are mixed in. Two identical Key_Shared subscriptions over the same entries get
the same ids: one in a single ACK, the other through ``Subscription._ack_one`` id by id, the
way every id was applied before the command was batched. Cursor, pending acks and counts
must agree.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from keyshared.broker.consumer import Consumer, KeySharedMeta, OutboundMessage, SubType
from keyshared.broker.dispatch.base import LoopScheduler
from keyshared.broker.entry_meta import parse_entry_meta
from keyshared.broker.subscription import AckItem, Subscription
from keyshared.config import BrokerConfig
from keyshared.storage.cursor import ManagedCursor
from keyshared.storage.memory import InMemoryLedger
from keyshared.storage.position import EARLIEST, Position
from tests.sim.world import SimTopic, SimTransport, payload

ENTRIES = 60
BATCH = 4  # every third entry is a batch of this many messages


class World:
    """A Key_Shared subscription with two consumers that received every entry."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        config = BrokerConfig()
        self.topic = SimTopic(config)
        ledger = InMemoryLedger()
        for i in range(ENTRIES):
            data = payload(f"key-{i % 7}", BATCH if i % 3 == 0 else 1, False)
            self.topic.meta_cache.put(ledger.add_entry(data), parse_entry_meta(data))
        cursor = ManagedCursor("s", ledger, None, durable=True, initial_position=EARLIEST)
        self.sub = Subscription(
            self.topic,  # type: ignore[arg-type]
            "s",
            cursor,
            durable=True,
            config=config,
            scheduler=LoopScheduler(loop),
        )
        self.received: dict[Consumer, list[Position]] = {}
        self.consumers = []
        for n in range(2):
            c = Consumer(
                consumer_id=n,
                consumer_name=f"c{n}",
                subscription=self.sub,
                sub_type=SubType.Key_Shared,
                transport=SimTransport(self._on_messages, lambda c: None),
                key_shared_meta=KeySharedMeta(),
                track_pending_acks=True,
            )
            self.sub.add_consumer(c)
            self.consumers.append(c)
        for c in self.consumers:
            c.add_permits(10_000)
            self.sub.dispatcher.consumer_flow(c, 10_000)  # type: ignore[union-attr]

    def _on_messages(self, consumer: Consumer, messages: Any) -> None:
        out: list[OutboundMessage] = list(messages)
        self.received.setdefault(consumer, []).extend(m.entry.position for m in out)

    def state(self) -> Any:
        cursor = self.sub.cursor
        return (
            cursor.mark_delete_position,
            str(cursor.individually_deleted),
            dict(cursor.batch_deleted_indexes),
            [
                sorted(
                    (p, pa.batch_size, pa.acked_indexes) for p, pa in (c.pending_acks or {}).items()
                )
                for c in self.consumers
            ],
            [(c.unacked_messages, c.msg_ack_counter) for c in self.consumers],
        )


def _one_by_one(sub: Subscription, consumer: Consumer, items: list[AckItem]) -> None:
    """The ACK handling the batched one replaced: ``_ack_one`` per id, then the same kick."""
    before = sub.cursor.mark_delete_position
    acked = sum(sub._ack_one(consumer, item) for item in items)
    after = sub.cursor.mark_delete_position
    if after != before:
        sub._mark_delete_moved(after)
    if acked or after != before:
        sub.kick_dispatch()


def _ids(world: World, rng: random.Random) -> list[tuple[int, AckItem]]:
    """(acking consumer, id): whole entries, batch indexes, repeats, strangers."""
    out: list[tuple[int, AckItem]] = []
    for n, c in enumerate(world.consumers):
        for pos in world.received.get(c, []):
            roll = rng.random()
            size = world.topic.meta_cache.batch_size(pos) or 1
            if size > 1 and roll < 0.5:
                # Wire ack set: a set bit is an index still unacked.
                bits = rng.getrandbits(size)
                out.append((n, AckItem(pos, [bits])))
            elif roll < 0.8:
                out.append((n, AckItem(pos)))
            if rng.random() < 0.1:
                out.append((1 - n, AckItem(pos)))  # acked by the other consumer
            if rng.random() < 0.2:
                out.append((n, AckItem(pos)))  # twice in one command
    out.append((0, AckItem(Position(0, ENTRIES + 5))))  # past the end
    rng.shuffle(out)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_one_ack_command_equals_ids_one_by_one(seed: int) -> None:
    loop = asyncio.new_event_loop()
    try:
        together, apart = World(loop), World(loop)
        for _ in range(10):
            loop.run_until_complete(asyncio.sleep(0))
        assert together.received and together.state() == apart.state()
        ids = _ids(together, random.Random(seed))
        for n in range(2):
            mine = [item for who, item in ids if who == n]
            together.sub.acknowledge(together.consumers[n], False, mine)
            _one_by_one(apart.sub, apart.consumers[n], mine)
        assert together.state() == apart.state()
        for world in (together, apart):
            world.sub.dispatcher.close()  # type: ignore[union-attr]
            world.sub.cursor.close()
    finally:
        loop.close()
