"""Stopping the replicator's asyncio tasks without swallowing the replicator's own stop."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel ``tasks`` and wait until each has finished; their outcomes are dropped.

    A cancellation of the task that waits here still reaches it. Waiting on each task inside
    ``contextlib.suppress(BaseException)`` swallowed it: a replicator stopped (its policy no
    longer names the remote) while a session was winding down took its own cancellation for a
    sub-task's, went on to a new session and kept replicating, while ``stop`` waited for it
    forever and the cursor was never deleted.
    """
    pending = list(tasks)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
