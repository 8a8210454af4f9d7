"""What every dispatcher shares: the scheduler seam, the read loop's bookkeeping, sending."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from keyshared.broker.consumer import Consumer, OutboundMessage, PendingAck
from keyshared.broker.entry_meta import EntryMeta
from keyshared.storage.entry import Entry
from keyshared.storage.position import Position

if TYPE_CHECKING:
    from keyshared.broker.subscription import Subscription


class TimerHandle(Protocol):
    """A scheduled callback that can be cancelled."""

    def cancel(self) -> None:
        """Cancel the callback."""


class Scheduler(Protocol):
    """The only clock the dispatchers see, so a simulator can replace the event loop."""

    def call_soon(self, callback: Callable[[], None]) -> TimerHandle:
        """Run ``callback`` on the next turn."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        """Run ``callback`` after ``delay`` seconds."""


class LoopScheduler:
    """The production scheduler: the running asyncio loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop callbacks run on."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def call_soon(self, callback: Callable[[], None]) -> TimerHandle:
        """Run ``callback`` on the next loop iteration."""
        return self.loop.call_soon(callback)

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        """Run ``callback`` after ``delay`` seconds."""
        return self.loop.call_later(delay, callback)


def on_done(awaitable: Any, callback: Callable[[Any], None]) -> None:
    """Run ``callback(future)`` when ``awaitable`` completes (coroutines become tasks)."""
    fut = asyncio.ensure_future(awaitable)
    fut.add_done_callback(callback)


def _unacked_count(ack_set: Sequence[int]) -> int:
    """Bits set in a wire ack set (set bit = index still unacked)."""
    return sum((w & 0xFFFFFFFFFFFFFFFF).bit_count() for w in ack_set)


class Backoff:
    """Pulsar's dispatcher retry backoff: initial, doubling, capped."""

    def __init__(self, initial_ms: int, max_ms: int) -> None:
        self.initial = max(initial_ms, 0) / 1000.0
        self.max = max(max_ms, 0) / 1000.0
        self._next = self.initial

    def next(self) -> float:
        """The next delay in seconds."""
        delay = self._next
        self._next = min(self._next * 2, self.max) if self._next else self.max
        return delay

    def reset(self) -> None:
        """Back to the initial delay."""
        self._next = self.initial


class Dispatcher:
    """Base of the dispatchers: owns the consumer list and sends entries to consumers."""

    def __init__(self, subscription: Subscription, scheduler: Scheduler) -> None:
        self.subscription = subscription
        self.cursor = subscription.cursor
        self.scheduler = scheduler
        self.config = subscription.config
        self.consumers: list[Consumer] = []
        self.closed = False
        self._read_scheduled = False
        self.have_pending_read = False
        self.have_pending_replay_read = False
        # Bumped whenever in-flight reads must be forgotten (cursor moved, consumers gone): a
        # completion of an older generation is dropped, so it can neither dispatch stale
        # entries nor clear the flag of a newer read.
        self.read_generation = 0
        self.read_batch_size = max(1, self.config.dispatcherMinReadBatchSize)
        self.backoff = Backoff(
            self.config.dispatcherRetryBackoffInitialTimeInMs,
            self.config.dispatcherRetryBackoffMaxTimeInMs,
        )
        self._backoff_handle: TimerHandle | None = None
        self._throttle_handle: TimerHandle | None = None

    # --- to be provided by subclasses ----------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        """Attach ``consumer`` (may raise BrokerError)."""
        raise NotImplementedError

    def remove_consumer(self, consumer: Consumer) -> None:
        """Detach ``consumer``; what it held goes to the others."""
        raise NotImplementedError

    def redeliver(self, consumer: Consumer, positions: Sequence[Any] | None) -> None:
        """Redeliver what ``consumer`` holds unacked (all, or just ``positions``)."""
        raise NotImplementedError

    def read_more_now(self) -> None:
        """One step of the read loop."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget in-flight state after the cursor was moved by hand (seek, reset-cursor)."""
        raise NotImplementedError

    def pending_hash(self, meta: EntryMeta) -> int:
        """The hash a pending ack remembers (Key_Shared keeps its selector slot)."""
        return meta.key_hash

    def stats(self) -> dict[str, Any]:
        """Dispatcher-specific subscription stats."""
        return {}

    def consumer_stats(self, consumer: Consumer) -> dict[str, Any]:
        """Dispatcher-specific consumer stats."""
        return {}

    # --- shared machinery ----------------------------------------------------------------
    def consumer_flow(self, consumer: Consumer, permits: int) -> None:
        """The consumer sent FLOW; try to read."""
        self.read_more()

    def on_writable(self) -> None:
        """A consumer's connection drained its write buffer."""
        self.read_more()

    def read_more(self) -> None:
        """Schedule one step of the read loop (coalesced)."""
        if self._read_scheduled or self.closed:
            return
        self._read_scheduled = True
        self.scheduler.call_soon(self._run_read)

    def read_more_with_backoff(self) -> None:
        """Retry a read after the backoff delay."""
        if self._backoff_handle is not None or self.closed:
            return

        def fire() -> None:
            self._backoff_handle = None
            self.read_more()

        self._backoff_handle = self.scheduler.call_later(self.backoff.next(), fire)

    def rate_budget(self, wanted: int) -> int:
        """How many of ``wanted`` entries the dispatch rate limits let a read take now.

        0 means throttled: nothing may be read, and a read is scheduled for when the limits
        have refilled (Pulsar reschedules the read too). Throttling only delays reads, so
        every ordering rule of the dispatchers holds as without it.
        """
        throttle = self.subscription.dispatch_throttle
        if throttle is None:
            return wanted
        allowed = throttle.budget(wanted)
        if allowed <= 0 and self._throttle_handle is None and not self.closed:

            def fire() -> None:
                self._throttle_handle = None
                self.read_more()

            self._throttle_handle = self.scheduler.call_later(throttle.retry_delay(), fire)
        return allowed

    def _run_read(self) -> None:
        self._read_scheduled = False
        if not self.closed:
            self.read_more_now()

    def read_outcome(self, fut: Any, gen: int, *, replay: bool) -> Any | None:
        """The result of a finished read, or None when the dispatcher must ignore it.

        Ignored: a read of an older generation (its completion must not clear the flag of the
        read that replaced it), a cancelled read, a closed dispatcher, and a failed read (logged,
        then retried after the backoff).
        """
        if gen != self.read_generation:
            return None
        if replay:
            self.have_pending_replay_read = False
        else:
            self.have_pending_read = False
        if fut.cancelled() or self.closed:
            return None
        exc = fut.exception()
        if exc is not None:
            self.subscription.topic.log_read_error(exc)
            self.read_more_with_backoff()
            return None
        result = fut.result()
        # Marker entries never reach consumers, whichever dispatcher reads them.
        if isinstance(result, list):
            return self.subscription.hide_markers(result)
        if result.entries:
            result.entries = self.subscription.hide_markers(result.entries)
        return result

    def forget_reads(self) -> None:
        """Drop every read in flight: its completion will be ignored."""
        self.cursor.cancel_pending_read()
        self.read_generation += 1
        self.have_pending_read = False
        self.have_pending_replay_read = False

    def cancel_parked_read(self) -> bool:
        """Cancel the normal read if the cursor still holds it (reading, or waiting for entries).

        A read the cursor already finished has moved the read position past its entries, and
        its result is on its way to ``_read_complete``: forgetting it would skip those entries
        until the next rewind. Such a read is left alone. Returns whether a read was cancelled.
        """
        if not self.have_pending_read or not self.cursor.has_pending_read:
            return False
        self.forget_reads()
        return True

    def grow_read_batch(self) -> None:
        """Double the read batch after a full read, as Pulsar does, up to the configured max."""
        self.read_batch_size = min(self.read_batch_size * 2, self.config.dispatcherMaxReadBatchSize)

    def send_to_consumer(
        self,
        consumer: Consumer,
        entries: Sequence[Entry],
        *,
        track: bool = False,
        ack_sets: Mapping[Position, list[int]] | None = None,
        metas: Sequence[EntryMeta] | None = None,
        hashes: Sequence[int] | None = None,
    ) -> int:
        """Write ``entries`` to ``consumer``; returns the number of messages sent.

        ``ack_sets`` overrides the cursor's ack set of some batch entries (compacted reads).
        ``metas`` and ``hashes``, parallel to ``entries``, are their metadata and pending-ack
        hashes when the caller already has them (the routing looked them up once).
        """
        sub = self.subscription
        topic = sub.topic
        counts = sub.redelivery_counts
        cursor = self.cursor
        out: list[OutboundMessage] = []
        messages = 0
        acked_indexes = 0
        nbytes = 0
        pending = consumer.pending_acks if track else None
        for i, entry in enumerate(entries):
            pos = entry.position
            meta = metas[i] if metas is not None else topic.entry_meta(entry)
            ack_set = cursor.get_ack_set(pos) if meta.num_messages > 1 else None
            if ack_sets is not None:
                ack_set = ack_sets.get(pos, ack_set)
            already = meta.num_messages - _unacked_count(ack_set) if ack_set is not None else 0
            acked_indexes += already
            messages += meta.num_messages
            nbytes += len(entry.data)
            out.append(OutboundMessage(entry, counts.get(pos, 0), ack_set))
            if pending is not None:
                # Indexes acked before this send are not held: they never count as unacked.
                h = hashes[i] if hashes is not None else self.pending_hash(meta)
                pending[pos] = PendingAck(meta.num_messages, h, already)
        consumer.record_sent(len(out), messages, acked_indexes, nbytes)
        topic.record_out(messages - acked_indexes, nbytes)
        if sub.dispatch_throttle is not None:
            sub.dispatch_throttle.dispatched(messages - acked_indexes, nbytes)
        consumer.transport.send_messages(consumer, out)
        return messages

    def close(self) -> None:
        """Stop dispatching."""
        self.closed = True
        if self._backoff_handle is not None:
            self._backoff_handle.cancel()
            self._backoff_handle = None
        if self._throttle_handle is not None:
            self._throttle_handle.cancel()
            self._throttle_handle = None
