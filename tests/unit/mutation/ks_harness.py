"""A Key_Shared subscription on an in-memory ledger, stepped by hand on the simulator's loop.

The real subscription, dispatcher and cursor (as in tests/sim), without a random schedule: a test
publishes, joins, acks and leaves in the order it chooses, and :meth:`Harness.settle` runs every
queued callback and due timer, so each step's outcome is deterministic.
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


class Harness:
    """One subscription; ``received[name]`` lists (key, position) as each consumer got them."""

    def __init__(self, config: BrokerConfig | None = None, *, mode: str = "AUTO_SPLIT") -> None:
        self.config = config if config is not None else BrokerConfig()
        self.mode = mode
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
        self.sub.sub_type = SubType.Key_Shared
        self.consumers: dict[str, Consumer] = {}
        self.received: dict[str, list[tuple[str, Position]]] = {}
        self.keys: dict[Position, str] = {}

    def close(self) -> None:
        """Uninstall the loop."""
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
    ) -> Consumer:
        """A consumer joins with ``permits`` (FLOW), then settle; ``no_meta``: a SUBSCRIBE
        without keySharedMeta (as older clients send)."""
        if meta is None and not no_meta:
            meta = KeySharedMeta(mode=self.mode)
        consumer = Consumer(
            consumer_id=len(self.consumers) if consumer_id is None else consumer_id,
            consumer_name=name,
            subscription=self.sub,
            sub_type=SubType.Key_Shared,
            transport=SimTransport(self._on_messages, lambda c: None),
            key_shared_meta=meta,
            track_pending_acks=True,
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
