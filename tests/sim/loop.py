"""A deterministic event loop for the simulation: one FIFO of callbacks and a virtual clock.

It is at once the asyncio loop that the cursor's futures and tasks run on and the dispatcher's
:class:`~keyshared.broker.dispatch.base.Scheduler`. Every callback, whether a dispatcher's
``call_soon`` or an asyncio task step or future callback, goes into one FIFO queue, as on a
real loop. Nothing runs by itself: the simulator decides, step by step, whether to run the next
queued callback, fire the earliest timer (advancing the virtual clock to it), or deliver an
outside event (a client command, a storage read completing). So an outside event can land
between any two callbacks, which covers every interleaving a real asyncio loop allows (and a
few more, since a real loop runs the callbacks ready at the start of an iteration together).

Why not a real asyncio loop: its ready queue cannot be inspected or stepped one callback at a
time through public API, each iteration polls a selector, and its timers follow the wall clock.
This class implements the part of the loop API that ``asyncio.Future`` and ``asyncio.Task``
use (``call_soon`` with ``context``, ``get_debug``, ``create_future``, ``create_task``,
``call_exception_handler``), and is installed with ``asyncio._set_running_loop`` (the hook that
loop implementations such as uvloop use) so ``asyncio.get_running_loop()`` and
``asyncio.ensure_future()`` find it.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
from collections import deque
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any


class SimHandle:
    """A queued callback; ``cancel()`` makes it a no-op (both loop and Scheduler handles)."""

    __slots__ = ("args", "callback", "cancelled", "context", "when")

    def __init__(
        self,
        callback: Callable[..., object],
        args: tuple[Any, ...],
        context: contextvars.Context | None,
        when: float = 0.0,
    ) -> None:
        self.callback = callback
        self.args = args
        self.context = context
        self.cancelled = False
        self.when = when

    def cancel(self) -> None:
        """Do not run this callback."""
        self.cancelled = True

    def run(self) -> None:
        """Run the callback (exceptions propagate: the simulator treats them as failures)."""
        if self.context is not None:
            self.context.run(self.callback, *self.args)
        else:
            self.callback(*self.args)

    def __repr__(self) -> str:
        cb = self.callback
        # No addresses: traces must read the same in every process.
        name = getattr(cb, "__qualname__", None) or type(cb).__name__
        return f"<{name}{' cancelled' if self.cancelled else ''}>"


class SimLoop:
    """The simulation's loop and scheduler (see the module docstring)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.ready: deque[SimHandle] = deque()
        self._timers: list[tuple[float, int, SimHandle]] = []
        self._seq = 0
        self.unhandled: list[dict[str, Any]] = []

    # --- asyncio's loop API (the part Future and Task use) -----------------------------------
    def get_debug(self) -> bool:
        """asyncio asks this when creating futures."""
        return False

    def is_closed(self) -> bool:
        """Never closed while a simulation runs."""
        return False

    def time(self) -> float:
        """The virtual clock, in seconds."""
        return self.now

    def create_future(self) -> asyncio.Future[Any]:
        """A future bound to this loop."""
        return asyncio.Future(loop=self)  # type: ignore[arg-type]

    def create_task(
        self,
        coro: Coroutine[Any, Any, Any],
        *,
        name: str | None = None,
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[Any]:
        """A task bound to this loop; its first step is queued like any callback."""
        return asyncio.Task(coro, loop=self, name=name)  # type: ignore[arg-type]

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        """An error nobody handled (e.g. a future's exception never retrieved): kept for the
        simulator to inspect, never printed."""
        self.unhandled.append(context)

    # --- both APIs -----------------------------------------------------------------------------
    def call_soon(
        self,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> SimHandle:
        """Queue ``callback(*args)`` at the back of the FIFO."""
        handle = SimHandle(callback, args, context, self.now)
        self.ready.append(handle)
        return handle

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> SimHandle:
        """Run ``callback(*args)`` when the virtual clock reaches now + ``delay``."""
        when = self.now + max(delay, 0.0)
        handle = SimHandle(callback, args, None, when)
        self._seq += 1
        heapq.heappush(self._timers, (when, self._seq, handle))
        return handle

    # --- stepping ------------------------------------------------------------------------------
    def run_one(self) -> bool:
        """Run the next queued callback; False if the queue had none (cancelled ones skipped)."""
        ready = self.ready
        while ready:
            handle = ready.popleft()
            if not handle.cancelled:
                handle.run()
                return True
        return False

    def run_ready(self, limit: int = 100_000) -> int:
        """Run queued callbacks (including ones they queue) until none is left; returns how
        many ran. ``limit`` guards against a callback that requeues itself forever."""
        n = 0
        while self.run_one():
            n += 1
            if n >= limit:
                raise RuntimeError(f"more than {limit} callbacks without the queue emptying")
        return n

    def _prune_timers(self) -> None:
        timers = self._timers
        while timers and timers[0][2].cancelled:
            heapq.heappop(timers)

    def has_timer(self) -> bool:
        """Whether a timer (not cancelled) is pending."""
        self._prune_timers()
        return bool(self._timers)

    def next_timer_at(self) -> float | None:
        """When the earliest pending timer is due."""
        self._prune_timers()
        return self._timers[0][0] if self._timers else None

    def fire_next_timer(self) -> bool:
        """Advance the clock to the earliest timer and run it; False if there is none."""
        self._prune_timers()
        if not self._timers:
            return False
        when, _, handle = heapq.heappop(self._timers)
        self.now = max(self.now, when)
        handle.run()
        return True

    def pending_timers(self) -> int:
        """How many timers are pending (cancelled ones not counted)."""
        return sum(1 for _, _, h in self._timers if not h.cancelled)

    @contextmanager
    def installed(self) -> Iterator[SimLoop]:
        """Make this the running loop for the duration (restoring whatever was there)."""
        previous = asyncio._get_running_loop()
        asyncio._set_running_loop(self)  # type: ignore[arg-type]
        try:
            yield self
        finally:
            asyncio._set_running_loop(previous)
