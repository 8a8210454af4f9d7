"""Delayed delivery: entries with ``deliver_at_time`` wait here until they are due.

Pulsar's InMemoryDelayedDeliveryTracker. Nothing is persisted: after a restart the cursor
reads the backlog again and every entry still due in the future is tracked again, so none is
lost and none is delivered early. Due entries go to the dispatcher's replay queue.
"""

from __future__ import annotations

import heapq

from keyshared.storage.position import Position


class DelayedDeliveryTracker:
    """Positions by the time they become due (milliseconds since the epoch)."""

    __slots__ = ("_heap", "_positions", "last_tick_ms", "tick_ms")

    def __init__(self, tick_ms: int) -> None:
        self.tick_ms = max(tick_ms, 1)
        # When the timer last woke the dispatcher (Pulsar's lastTickRun); 0: never.
        self.last_tick_ms = 0
        self._heap: list[tuple[int, Position]] = []
        self._positions: set[Position] = set()

    def __len__(self) -> int:
        return len(self._positions)

    def __contains__(self, pos: Position) -> bool:
        return pos in self._positions

    def add(self, pos: Position, deliver_at_ms: int) -> None:
        """Hold ``pos`` until ``deliver_at_ms``."""
        if pos in self._positions:
            return
        self._positions.add(pos)
        heapq.heappush(self._heap, (deliver_at_ms, pos))

    def pop_due(self, now_ms: int) -> list[Position]:
        """Positions due at ``now_ms``, removed from the tracker, in position order.

        Never early: an entry is due once its time has come. The tick only spaces the timer
        that wakes the dispatcher (see ``next_wakeup_ms``).
        """
        heap = self._heap
        out: list[Position] = []
        while heap and heap[0][0] <= now_ms:
            _, pos = heapq.heappop(heap)
            if pos in self._positions:
                self._positions.discard(pos)
                out.append(pos)
        out.sort()
        return out

    def next_due_ms(self) -> int | None:
        """When the earliest tracked entry becomes due."""
        heap = self._heap
        while heap and heap[0][1] not in self._positions:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def next_wakeup_ms(self, now_ms: int) -> int | None:
        """When the timer should wake the dispatcher: at once for an overdue entry, else at the
        next due time but no sooner than a tick (``delayedDeliveryTickTimeMillis``) after the
        last wake-up, as Pulsar's tracker spaces its timer: entries falling due close together
        are released by one wake-up, each up to a tick late, never early."""
        due = self.next_due_ms()
        if due is None:
            return None
        if due <= now_ms:
            return now_ms
        return max(due, self.last_tick_ms + self.tick_ms)

    def ticked(self, now_ms: int) -> None:
        """The timer woke the dispatcher at ``now_ms``: the next wake-up is a tick away."""
        self.last_tick_ms = now_ms

    def remove_up_to(self, pos: Position) -> None:
        """Forget positions at or before ``pos`` (acked)."""
        if self._positions:
            self._positions = {p for p in self._positions if p > pos}

    def clear(self) -> None:
        """Forget everything."""
        self._heap.clear()
        self._positions.clear()
