"""The cursor epoch (seed issue-20277 / PIP-269): a read completing after the cursor was moved by
hand is dropped and never moves the read position."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from keyshared.storage.cursor import ManagedCursor, PendingReadError, ReadResult
from keyshared.storage.memory import ControlledReader, InMemoryLedger
from keyshared.storage.position import EARLIEST, Position

L = 1


def P(entry: int) -> Position:
    return Position(L, entry)


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


async def settle() -> None:
    """Let every runnable task reach its next await."""
    for _ in range(5):
        await asyncio.sleep(0)


def setup(entries: int = 21) -> tuple[InMemoryLedger, ControlledReader, ManagedCursor]:
    ledger = InMemoryLedger(first_ledger_id=L)
    ledger.add_entries(entries)
    reader = ControlledReader(ledger)
    cursor = ManagedCursor("sub", reader, None, durable=False, initial_position=EARLIEST)
    return ledger, reader, cursor


def ids(result: ReadResult) -> list[int]:
    return [e.position.entry_id for e in result.entries]


async def read_now(reader: ControlledReader, cursor: ManagedCursor, n: int) -> ReadResult:
    task = asyncio.ensure_future(cursor.read_entries(n))
    await settle()
    while not task.done():
        reader.complete_all()
        await settle()
    return task.result()


def test_issue_20277_timeline_rewind_during_read() -> None:
    """The table of the seed, step by step."""

    async def scenario() -> None:
        _, reader, cursor = setup()
        cursor.ack_individual(P(i) for i in range(5))
        assert cursor.mark_delete_position == P(4)
        # 1-2: read 5~10 completes; read position is 11.
        assert ids(await read_now(reader, cursor, 6)) == [5, 6, 7, 8, 9, 10]
        assert cursor.read_position == P(11)
        # 3: a new read 11~20 starts.
        second = asyncio.ensure_future(cursor.read_entries(10))
        await settle()
        assert len(reader.pending_reads) == 1
        # 4-5: the handler cannot process 5, so it rewinds: read position 5.
        cursor.rewind()
        assert cursor.read_position == P(5)
        # 6: the read 11~20 completes. It must not move the read position to 21.
        reader.complete()
        result = await second
        assert result.stale and not result.entries
        assert cursor.read_position == P(5)
        # 8: the next read starts from 5 again: nothing is missed.
        assert ids(await read_now(reader, cursor, 6)) == [5, 6, 7, 8, 9, 10]

    run(scenario)


def test_read_5_to_10_in_flight_then_rewind_reads_them_again() -> None:
    async def scenario() -> None:
        _, reader, cursor = setup()
        cursor.ack_individual(P(i) for i in range(5))
        inflight = asyncio.ensure_future(cursor.read_entries(6))
        await settle()
        epoch = cursor.epoch
        cursor.rewind()
        assert cursor.epoch == epoch + 1
        reader.complete()
        result = await inflight
        assert result.stale and result.epoch == epoch
        assert cursor.read_position == P(5)
        again = await read_now(reader, cursor, 6)
        assert ids(again) == [5, 6, 7, 8, 9, 10]
        assert again.epoch == epoch + 1 and not again.stale
        assert cursor.read_position == P(11)

    run(scenario)


def test_without_a_manual_move_the_read_completes_normally() -> None:
    async def scenario() -> None:
        _, reader, cursor = setup()
        inflight = asyncio.ensure_future(cursor.read_entries(4))
        await settle()
        cursor.ack_individual([P(20)])  # acks are not manual moves
        reader.complete()
        result = await inflight
        assert not result.stale
        assert ids(result) == [0, 1, 2, 3]
        assert cursor.read_position == P(4)

    run(scenario)


@pytest.mark.parametrize(
    ("move", "read_position", "next_ids"),
    [
        (lambda c: c.seek(P(15)), P(15), [15, 16, 17]),
        (lambda c: c.seek(P(2)), P(2), [2, 3, 4]),
        (lambda c: c.reset_cursor(P(12)), P(12), [12, 13, 14]),
        (lambda c: c.skip_entries(3), P(3), [3, 4, 5]),
        (lambda c: c.clear_backlog(), P(21), []),
        (lambda c: c.rewind(), P(0), [0, 1, 2]),
    ],
    ids=["seek-forward", "seek-back", "reset-cursor", "skip", "clear-backlog", "rewind"],
)
def test_every_manual_move_makes_the_inflight_read_stale(
    move: Callable[[ManagedCursor], None], read_position: Position, next_ids: list[int]
) -> None:
    async def scenario() -> None:
        _, reader, cursor = setup()
        assert ids(await read_now(reader, cursor, 3)) == [0, 1, 2]
        inflight = asyncio.ensure_future(cursor.read_entries(5))
        await settle()
        move(cursor)
        # The new epoch may read before the stale completion arrives.
        fresh = asyncio.ensure_future(cursor.read_entries(3))
        await settle()
        reader.complete(0)  # the stale read completes first
        stale = await inflight
        assert stale.stale and not stale.entries
        assert cursor.read_position == read_position
        reader.complete_all()
        await settle()
        assert ids(await fresh) == next_ids

    run(scenario)


def test_stale_read_completing_after_the_new_one_changes_nothing() -> None:
    async def scenario() -> None:
        _, reader, cursor = setup()
        old = asyncio.ensure_future(cursor.read_entries(5))
        await settle()
        cursor.seek(P(10))
        new = asyncio.ensure_future(cursor.read_entries(2))
        await settle()
        reader.complete(1)  # the new epoch's read first
        assert ids(await new) == [10, 11]
        assert cursor.read_position == P(12)
        reader.complete(0)
        assert (await old).stale
        assert cursor.read_position == P(12)

    run(scenario)


def test_one_sequential_read_per_epoch() -> None:
    async def scenario() -> None:
        _, reader, cursor = setup()
        first = asyncio.ensure_future(cursor.read_entries(2))
        with pytest.raises(PendingReadError, match=r"^cursor sub already has a read in flight$"):
            cursor.read_entries(2)
        assert cursor.has_pending_read
        cursor.rewind()
        assert not cursor.has_pending_read
        second = cursor.read_entries(2)  # allowed: the first belongs to an old epoch
        reader.hold = False
        await settle()
        reader.complete_all()
        assert (await first).stale
        assert ids(await second) == [0, 1]

    run(scenario)


def test_move_before_the_read_starts_running() -> None:
    """The epoch is taken when the read is issued, not when its coroutine first runs."""

    async def scenario() -> None:
        _, reader, cursor = setup()
        issued = cursor.read_entries(3)
        cursor.seek(P(7))
        reader.hold = False
        assert (await issued).stale
        assert cursor.read_position == P(7)

    run(scenario)


def test_cancel_pending_read() -> None:
    async def scenario() -> None:
        _, reader, cursor = setup()
        inflight = asyncio.ensure_future(cursor.read_entries(3))
        await settle()
        assert cursor.cancel_pending_read()
        assert not cursor.cancel_pending_read()
        reader.complete()
        result = await inflight
        assert result.stale and result.cancelled
        assert cursor.read_position == P(0)
        assert cursor.epoch == 0  # cancelling is not a move

    run(scenario)


def test_entries_acked_while_the_read_is_in_flight_are_left_out() -> None:
    async def scenario() -> None:
        _, reader, cursor = setup()
        inflight = asyncio.ensure_future(cursor.read_entries(5))
        await settle()
        cursor.ack_individual([P(1), P(3)])
        reader.complete()
        await settle()
        # Two entries were dropped, so the cursor reads on to fill the batch.
        reader.complete_all()
        result = await inflight
        assert ids(result) == [0, 2, 4, 5, 6]
        assert cursor.read_position == P(7)

    run(scenario)


def test_move_between_two_rounds_of_one_read() -> None:
    async def scenario() -> None:
        _, reader, cursor = setup()
        cursor.ack_individual([P(1), P(2)])
        inflight = asyncio.ensure_future(cursor.read_entries(4))
        await settle()
        cursor.ack_individual([P(3)])  # first round will come back short
        reader.complete()
        await settle()
        assert len(reader.pending_reads) == 1  # second round in flight
        cursor.rewind()
        reader.complete()
        assert (await inflight).stale
        assert cursor.read_position == P(0)

    run(scenario)


def test_wait_is_woken_by_new_entries() -> None:
    async def scenario() -> None:
        ledger, reader, cursor = setup(entries=3)
        assert ids(await read_now(reader, cursor, 10)) == [0, 1, 2]
        waiting = asyncio.ensure_future(cursor.read_entries_or_wait(10))
        await settle()
        assert cursor.is_waiting_for_entries
        assert cursor.internal_stats()["waitingReadOp"] is True
        assert ledger.listener_count == 1
        assert not reader.pending_reads
        ledger.add_entry(b"x")
        await settle()
        reader.complete_all()
        result = await waiting
        assert ids(result) == [3]
        assert ledger.listener_count == 0

    run(scenario)


def test_wait_is_ended_by_a_manual_move() -> None:
    async def scenario() -> None:
        ledger, reader, cursor = setup(entries=3)
        cursor.seek(P(3))
        waiting = asyncio.ensure_future(cursor.read_entries_or_wait(10))
        await settle()
        assert cursor.is_waiting_for_entries
        cursor.rewind()
        await settle()
        result = waiting.result()
        assert result.stale and not result.cancelled
        assert ledger.listener_count == 0
        assert ids(await read_now(reader, cursor, 10)) == [0, 1, 2]

    run(scenario)


def test_wait_is_ended_by_cancel() -> None:
    async def scenario() -> None:
        ledger, _, cursor = setup(entries=0)
        waiting = asyncio.ensure_future(cursor.read_entries_or_wait(10))
        await settle()
        assert cursor.cancel_pending_read()
        await settle()
        assert waiting.result().cancelled
        assert ledger.listener_count == 0
        assert not cursor.has_pending_read

    run(scenario)


def test_wait_survives_entries_that_get_acked_before_being_read() -> None:
    async def scenario() -> None:
        ledger, reader, cursor = setup(entries=0)
        reader.hold = False
        waiting = asyncio.ensure_future(cursor.read_entries_or_wait(10))
        await settle()
        pos = ledger.add_entry(b"a")
        cursor.ack_individual([pos])  # acked before the woken read runs
        await settle()
        assert not waiting.done()
        assert cursor.is_waiting_for_entries
        ledger.add_entry(b"b")
        result = await waiting
        assert ids(result) == [1]

    run(scenario)


def test_replay_is_dropped_when_the_cursor_moves() -> None:
    async def scenario() -> None:
        _, reader, cursor = setup()
        replay = asyncio.ensure_future(cursor.replay_entries([P(3), P(4), P(9)]))
        await settle()
        assert cursor.pending_replay_reads == 1
        cursor.reset_cursor(P(0))
        reader.complete_all()
        await settle()
        reader.complete_all()
        assert await replay == []
        assert cursor.pending_replay_reads == 0

    run(scenario)


def test_replay_never_moves_the_read_position_and_skips_acked() -> None:
    async def scenario() -> None:
        _, reader, cursor = setup()
        reader.hold = False
        cursor.ack_individual([P(4)])
        got = await cursor.replay_entries([P(9), P(3), P(4), P(5), P(0), P(99)])
        assert [e.position.entry_id for e in got] == [0, 3, 5, 9]
        assert cursor.read_position == P(0)
        # The seed removes the compensation that bumped the read position on a replay of it.
        got = await cursor.replay_entries([P(0)])
        assert [e.position for e in got] == [P(0)]
        assert cursor.read_position == P(0)

    run(scenario)


def test_replay_leaves_out_entries_acked_while_in_flight() -> None:
    async def scenario() -> None:
        _, reader, cursor = setup()
        replay = asyncio.ensure_future(cursor.replay_entries([P(3), P(4), P(5)]))
        await settle()
        cursor.ack_individual([P(4)])
        reader.complete_all()
        got = await replay
        assert [e.position.entry_id for e in got] == [3, 5]

    run(scenario)
