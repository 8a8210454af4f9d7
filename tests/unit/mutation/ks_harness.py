"""A Key_Shared subscription on an in-memory ledger, stepped by hand on the simulator's loop.

The real subscription, dispatcher and cursor (as in tests/sim), without a random schedule: a test
publishes, joins, acks and leaves in the order it chooses, and :meth:`Harness.settle` runs every
queued callback and due timer, so each step's outcome is deterministic. ``sub_type`` makes it a
Shared, Exclusive or Failover subscription instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from keyshared.broker.consumer import Consumer, KeySharedMeta, OutboundMessage, SubType
from keyshared.broker.dispatch.key_shared import KeySharedDispatcher
from keyshared.broker.subscription import AckItem, Subscription
from keyshared.config import BrokerConfig
from keyshared.storage.cursor import ManagedCursor
from keyshared.storage.memory import InMemoryLedger
from keyshared.storage.position import EARLIEST, Position
from tests.sim.loop import SimLoop
from tests.sim.world import SimTopic, SimTransport, payload


class _Transport(SimTransport):
    """The simulator's transport, keeping Failover's active-consumer notices."""

    active_changes: list[tuple[str, bool]]

    def active_consumer_change(self, consumer: Consumer, is_active: bool) -> None:
        """Failover told ``consumer`` whether it is the active one."""
        self.active_changes.append((consumer.consumer_name, is_active))


class Harness:
    """One subscription; ``received[name]`` lists (key, position) as each consumer got them."""

    def __init__(
        self,
        config: BrokerConfig | None = None,
        *,
        mode: str = "AUTO_SPLIT",
        sub_type: SubType = SubType.Key_Shared,
    ) -> None:
        self.config = config if config is not None else BrokerConfig()
        self.mode = mode
        self.sub_type = sub_type
        self.loop = SimLoop()
        self.ledger = InMemoryLedger()
        self.topic = SimTopic(self.config)
        self._installed = self.loop.installed()
        self._installed.__enter__()
        self.cursor = ManagedCursor(
            "sub", self.ledger, None, durable=True, initial_position=EARLIEST
        )
        self.sub = Subscription(
            cast(Any, self.topic),
            "sub",
            self.cursor,
            durable=True,
            config=self.config,
            scheduler=self.loop,
        )
        self.sub.sub_type = sub_type
        self.consumers: dict[str, Consumer] = {}
        self.received: dict[str, list[tuple[str, Position]]] = {}
        self.keys: dict[Position, str] = {}
        # What each consumer was sent, as sent (redelivery counts, ack sets).
        self.sent: dict[str, list[OutboundMessage]] = {}
        # Failover's active-consumer notices, in order: (consumer name, is it the active one).
        self.active_changes: list[tuple[str, bool]] = []

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """End the read parked at the tail, then uninstall the loop.

        Left pending, the parked read's task was freed by the collector during some later
        test, where asyncio logged 'Task was destroyed but it is pending' into that test's
        caplog. The dispatcher is closed first, so the cancelled read starts no other."""
        disp = self.sub.dispatcher
        if disp is not None:
            disp.close()
        self.cursor.cancel_pending_read()
        self.loop.run_ready()
        self._installed.__exit__(None, None, None)

    @property
    def dispatcher(self) -> KeySharedDispatcher:
        """The subscription's dispatcher (created by the first join)."""
        disp = self.sub.dispatcher
        assert isinstance(disp, KeySharedDispatcher)
        return disp

    def settle(self, max_timers: int = 50) -> None:
        """Run what is queued, and timers (the retry backoff, unblocking) until none is left."""
        self.loop.run_ready()
        for _ in range(max_timers):
            if not self.loop.fire_next_timer():
                break
            self.loop.run_ready()

    def publish(self, *keys: str, batch: int = 1) -> list[Position]:
        """One entry per key (a batch of ``batch`` messages), then settle."""
        out = []
        for key in keys:
            pos = self.ledger.add_entry(payload(key, batch, False))
            self.keys[pos] = key
            out.append(pos)
        self.settle()
        return out

    def join(
        self,
        name: str,
        permits: int,
        *,
        meta: KeySharedMeta | None = None,
        consumer_id: int | None = None,
        no_meta: bool = False,
        priority: int = 0,
    ) -> Consumer:
        """A consumer joins with ``permits`` (FLOW), then settle; ``no_meta``: a SUBSCRIBE
        without keySharedMeta (as older clients send)."""
        key_shared = self.sub_type is SubType.Key_Shared
        if meta is None and not no_meta and key_shared:
            meta = KeySharedMeta(mode=self.mode)
        transport = _Transport(self._on_messages, lambda c: None)
        transport.active_changes = self.active_changes
        consumer = Consumer(
            consumer_id=len(self.consumers) if consumer_id is None else consumer_id,
            consumer_name=name,
            subscription=self.sub,
            sub_type=self.sub_type,
            transport=transport,
            priority_level=priority,
            key_shared_meta=meta,
            track_pending_acks=key_shared or self.sub_type is SubType.Shared,
        )
        self.consumers[name] = consumer
        self.received.setdefault(name, [])
        self.sub.add_consumer(consumer)
        if permits:
            self.flow(name, permits)
        self.settle()
        return consumer

    def flow(self, name: str, permits: int) -> None:
        """FLOW ``permits`` more, then settle."""
        consumer = self.consumers[name]
        consumer.add_permits(permits)
        disp = self.sub.dispatcher
        assert disp is not None
        disp.consumer_flow(consumer, permits)
        self.settle()

    def _on_messages(self, consumer: Consumer, messages: Sequence[OutboundMessage]) -> None:
        self.sent.setdefault(consumer.consumer_name, []).extend(messages)
        for m in messages:
            pos = m.entry.position
            self.received[consumer.consumer_name].append((self.keys[pos], pos))

    def held(self, name: str) -> list[Position]:
        """What ``name`` holds unacked, ascending."""
        return sorted(self.consumers[name].pending_acks or {})

    def ack(self, name: str, positions: Sequence[Position] | None = None) -> None:
        """Ack ``positions`` (default: all ``name`` holds), then settle."""
        consumer = self.consumers[name]
        chosen = list(consumer.pending_acks or {}) if positions is None else list(positions)
        self.sub.acknowledge(consumer, False, [AckItem(p) for p in chosen])
        self.settle()

    def leave(self, name: str) -> None:
        """``name`` leaves, then settle."""
        self.sub.remove_consumer(self.consumers.pop(name))
        self.settle()

    def got(self, name: str) -> list[Position]:
        """Positions ``name`` received, in order."""
        return [p for _, p in self.received[name]]
