"""Stopping the replicator's tasks (``replication/tasks.py``): the stop itself is never lost."""

from __future__ import annotations

import asyncio

import pytest

from keyshared.broker.replication.tasks import cancel_and_wait


async def _stop_while_a_sub_task_winds_down() -> str:
    """An outer task (a replicator session) cancels its sub-task, which takes a moment to wind
    down; the outer task is cancelled (the replicator stopped) during that moment."""
    winding_down = asyncio.Event()

    async def sub_task() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            winding_down.set()
            await asyncio.sleep(0.05)
            raise

    async def session() -> str:
        child = asyncio.ensure_future(sub_task())
        await asyncio.sleep(0)
        await cancel_and_wait([child])
        return "went on to a new session"

    outer = asyncio.ensure_future(session())
    await winding_down.wait()
    outer.cancel()
    return await outer


def test_a_stop_during_the_wind_down_of_a_sub_task_is_not_swallowed() -> None:
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(_stop_while_a_sub_task_winds_down())


async def _outcomes() -> list[bool]:
    async def fails() -> None:
        raise RuntimeError("remote gone")

    async def waits() -> None:
        await asyncio.sleep(10)

    tasks = [asyncio.ensure_future(fails()), asyncio.ensure_future(waits())]
    await asyncio.sleep(0)
    await cancel_and_wait(tasks)
    return [t.done() for t in tasks]


def test_sub_tasks_failures_are_dropped_and_every_task_is_finished() -> None:
    assert asyncio.run(_outcomes()) == [True, True]
