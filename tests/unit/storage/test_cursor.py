"""ManagedCursor: initial positions, acks, manual moves, backlog and stats."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

import pytest

from keyshared.config import BrokerConfig
from keyshared.storage.cursor import (
    CursorClosedError,
    CursorConfig,
    ManagedCursor,
    ReadResult,
)
from keyshared.storage.memory import InMemoryLedger
from keyshared.storage.position import EARLIEST, LATEST, Position

T = TypeVar("T")
P = Position


def wait(aw: Awaitable[T]) -> T:
    async def go() -> T:
        return await aw

    return asyncio.run(go())


def ledger_with(n: int, per_ledger: int | None = None) -> InMemoryLedger:
    ledger = InMemoryLedger(max_entries_per_ledger=per_ledger)
    ledger.add_entries(n)
    return ledger


def cursor(ledger: InMemoryLedger, start: Position = EARLIEST, **cfg: bool) -> ManagedCursor:
    return ManagedCursor(
        "c",
        ledger,
        None,
        durable=False,
        initial_position=start,
        config=CursorConfig(**cfg),
    )


def read_ids(c: ManagedCursor, n: int = 100) -> list[str]:
    result: ReadResult = wait(c.read_entries(n))
    assert not result.stale
    return [str(e.position) for e in result.entries]


# --- initial positions ----------------------------------------------------------------------


def test_initial_positions() -> None:
    ledger = ledger_with(6, per_ledger=4)  # 1:0..1:3, 2:0..2:1
    earliest = cursor(ledger, EARLIEST)
    assert earliest.read_position == P(1, 0)
    assert earliest.mark_delete_position == P(1, -1)
    assert earliest.number_of_entries_in_backlog == 6
    latest = cursor(ledger, LATEST)
    assert latest.mark_delete_position == P(2, 1)
    assert latest.number_of_entries_in_backlog == 0
    assert not latest.has_more_entries()
    specific = cursor(ledger, P(2, 0))  # inclusive
    assert specific.mark_delete_position == P(1, 3)
    assert read_ids(specific) == ["2:0", "2:1"]
    beyond = cursor(ledger, P(9, 9))
    assert beyond.read_position == ledger.next_position(ledger.last_add_confirmed)


def test_empty_ledger() -> None:
    ledger = InMemoryLedger()
    c = cursor(ledger, EARLIEST)
    assert c.mark_delete_position == P(1, -1)
    assert c.read_position == P(1, 0)
    assert not c.has_more_entries()
    assert read_ids(c) == []
    assert c.number_of_entries_in_backlog == 0
    ledger.roll_ledger()
    assert not c.has_more_entries()
    ledger.add_entry(b"x")
    assert read_ids(c) == ["2:0"]


# --- acks -------------------------------------------------------------------------------------


def test_mark_delete_steps_over_ledger_ends() -> None:
    ledger = ledger_with(10, per_ledger=3)  # 1:0-2, 2:0-2, 3:0-2, 4:0
    c = cursor(ledger)
    assert not c.ack_individual([P(2, 0), P(2, 1), P(2, 2), P(3, 0)])
    assert c.mark_delete_position == P(1, -1)
    assert len(c.individually_deleted) == 2  # ranges never span ledgers
    assert c.ack_individual([P(1, 0), P(1, 1), P(1, 2)])
    assert c.mark_delete_position == P(3, 0)
    assert len(c.individually_deleted) == 0
    ledger.roll_ledger()
    ledger.roll_ledger()  # ledger 5 stays empty
    assert ledger.add_entry(b"x") == P(6, 0)
    c.ack_individual([P(6, 0)])
    assert c.mark_delete_position == P(3, 0)
    c.ack_individual([P(3, 1), P(3, 2), P(4, 0)])
    assert c.mark_delete_position == P(6, 0)


def test_acks_out_of_range_are_ignored() -> None:
    ledger = ledger_with(5)
    c = cursor(ledger)
    c.ack_cumulative(P(1, 2))
    assert not c.ack_individual([P(1, 1), P(1, 9), P(2, 0)])
    assert len(c.individually_deleted) == 0
    assert not c.ack_cumulative(P(1, 1))
    with pytest.raises(ValueError):
        c.ack_cumulative(P(1, 5))


def test_cumulative_ack_swallows_following_holes_and_moves_the_read_position() -> None:
    ledger = ledger_with(10)
    c = cursor(ledger)
    c.ack_individual([P(1, 4), P(1, 5), P(1, 8)])
    assert c.ack_cumulative(P(1, 3))
    assert c.mark_delete_position == P(1, 5)
    assert c.read_position == P(1, 6)
    assert list(c.individually_deleted) == [(P(1, 8), P(1, 8))]
    assert c.messages_consumed_counter == 7
    assert read_ids(c) == ["1:6", "1:7", "1:9"]


def test_entry_id_minus_one_cumulative_ack() -> None:
    # A client acking "nothing of ledger 2 yet" sends (2, -1).
    ledger = ledger_with(6, per_ledger=3)
    c = cursor(ledger)
    assert c.ack_cumulative(P(2, -1))
    assert c.is_acked(P(1, 2)) and not c.is_acked(P(2, 0))
    assert c.number_of_entries_in_backlog == 3
    c.ack_individual([P(2, 0)])
    assert c.mark_delete_position == P(2, 0)


def test_batch_index_acks() -> None:
    ledger = ledger_with(5)
    c = cursor(ledger)
    assert c.get_ack_set(P(1, 0)) is None
    c.ack_batch_index(P(1, 0), [0b110], 3)  # index 0 acked
    assert c.get_ack_set(P(1, 0)) == [0b110]
    assert not c.is_acked(P(1, 0))
    c.ack_batch_index(P(1, 0), [0b011], 3)  # index 2 acked; the client's view lags
    assert c.get_ack_set(P(1, 0)) == [0b010]
    assert c.ack_batch_index(P(1, 0), [0b101], 3)  # index 1: all acked, mark-delete moves
    assert c.is_acked(P(1, 0))
    assert c.get_ack_set(P(1, 0)) is None
    # A full individual ack drops a partial bitset.
    c.ack_batch_index(P(1, 3), [1], 2)
    c.ack_individual([P(1, 3)])
    assert c.get_ack_set(P(1, 3)) is None
    assert c.is_acked(P(1, 3))
    # Mark-delete passing a partial batch drops it too.
    c.ack_batch_index(P(1, 2), [1], 2)
    c.ack_cumulative(P(1, 2))
    assert c.get_ack_set(P(1, 2)) is None
    assert c.batch_deleted_indexes == {}


def test_batch_index_acks_disabled() -> None:
    c = cursor(ledger_with(3), batch_index_ack_enabled=False)
    c.ack_batch_index(P(1, 1), [0b10], 2)
    assert c.get_ack_set(P(1, 1)) is None
    assert not c.is_acked(P(1, 1))
    c.ack_batch_index(P(1, 1), [], 2)
    assert c.is_acked(P(1, 1))


# --- manual moves ---------------------------------------------------------------------------


def test_seek_is_clamped_after_the_mark_delete() -> None:
    c = cursor(ledger_with(10))
    c.ack_cumulative(P(1, 4))
    c.seek(P(1, 2))
    assert c.read_position == P(1, 5)
    c.seek(P(1, 8))
    assert c.read_position == P(1, 8)
    assert c.mark_delete_position == P(1, 4)
    c.seek(LATEST)
    assert c.read_position == P(1, 10)
    assert c.epoch == 3


def test_rewind_rereads_everything_not_acked() -> None:
    c = cursor(ledger_with(8))
    assert len(read_ids(c)) == 8
    c.ack_individual([P(1, 0), P(1, 2), P(1, 3), P(1, 6)])
    c.rewind()
    assert c.read_position == P(1, 1)
    assert read_ids(c) == ["1:1", "1:4", "1:5", "1:7"]


def test_reset_cursor_clears_acks() -> None:
    ledger = ledger_with(10, per_ledger=5)
    c = cursor(ledger)
    c.ack_individual([P(1, 0), P(1, 3), P(2, 2)])
    c.ack_batch_index(P(2, 4), [1], 2)
    c.reset_cursor(P(2, 0))
    assert c.mark_delete_position == P(1, 4)
    assert c.read_position == P(2, 0)
    assert len(c.individually_deleted) == 0 and c.get_ack_set(P(2, 4)) is None
    assert c.number_of_entries_in_backlog == 5
    c.reset_cursor(EARLIEST)
    assert c.mark_delete_position == P(1, -1)
    assert c.number_of_entries_in_backlog == 10
    c.reset_cursor(LATEST)
    assert c.number_of_entries_in_backlog == 0
    assert c.epoch == 3


def test_skip_entries_steps_over_holes_and_ledgers() -> None:
    ledger = ledger_with(12, per_ledger=4)  # 1:0-3, 2:0-3, 3:0-3
    c = cursor(ledger)
    c.ack_individual([P(1, 1), P(1, 2), P(2, 0)])
    assert c.skip_entries(3) == 3  # 1:0, 1:3, 2:1
    assert c.mark_delete_position == P(2, 1)
    assert c.skip_entries(2) == 2  # 2:2, 2:3
    assert c.mark_delete_position == P(2, 3)
    c.ack_individual([P(3, 2)])
    assert c.skip_entries(100) == 3
    assert c.mark_delete_position == P(3, 3)
    assert c.number_of_entries_in_backlog == 0
    assert c.skip_entries(5) == 0


def test_clear_backlog() -> None:
    ledger = ledger_with(7)
    c = cursor(ledger)
    c.ack_individual([P(1, 3)])
    c.clear_backlog()
    assert c.mark_delete_position == P(1, 6)
    assert c.read_position == P(1, 7)
    assert c.number_of_entries_in_backlog == 0
    assert c.messages_consumed_counter == 7


# --- backlog and stats -----------------------------------------------------------------------


def test_backlog_numbers() -> None:
    ledger = ledger_with(20, per_ledger=8)
    c = cursor(ledger)
    assert read_ids(c, 10)[-1] == "2:1"
    c.ack_individual([P(1, 0), P(1, 1), P(1, 5), P(2, 3), P(2, 4), P(3, 0)])
    assert c.number_of_entries_in_backlog == 14
    # Still to read: 2:2..3:3 minus 2:3, 2:4, 3:0.
    assert c.number_of_entries_to_read == 7
    assert c.number_of_entries_since_first_not_acked == 9  # (1:1, 2:2]
    assert c.has_more_entries()


def test_internal_stats_fields() -> None:
    ledger = ledger_with(12)
    c = cursor(ledger)
    c.ack_individual([P(1, 0), P(1, 4), P(1, 5), P(1, 7), P(1, 8), P(1, 9), P(1, 10)])
    s = c.internal_stats()
    assert s["markDeletePosition"] == "1:0"
    assert s["readPosition"] == "1:1"
    assert s["individuallyDeletedMessages"] == "[(1:3..1:5], (1:6..1:10]]"
    assert s["totalNonContiguousDeletedMessagesRange"] == 2
    assert s["state"] == "Open"
    assert s["waitingReadOp"] is False
    assert s["subscriptionHavePendingRead"] is False
    for key in (
        "pendingReadOps",
        "messagesConsumedCounter",
        "cursorLedger",
        "cursorLedgerLastEntry",
        "lastLedgerSwitchTimestamp",
        "active",
        "numberOfEntriesSinceFirstNotAckedMessage",
        "subscriptionHavePendingReplayRead",
        "properties",
    ):
        assert key in s
    c.close()
    assert c.internal_stats()["state"] == "Closed"


def test_config_from_broker_config() -> None:
    conf = BrokerConfig()
    conf.managedLedgerMaxUnackedRangesToPersist = 77
    conf.managedLedgerDefaultMarkDeleteRateLimit = 0.5
    cc = CursorConfig.from_broker_config(conf)
    assert cc.max_unacked_ranges_to_persist == 77
    assert cc.mark_delete_rate_limit == 0.5
    assert cc.max_unacked_ranges_to_persist_in_metadata_store == 1000
    assert cc.max_batch_deleted_index_to_persist == 10000
    assert cc.position_flush_seconds == 60
    assert CursorConfig() == CursorConfig.from_broker_config(BrokerConfig())


def test_closed_cursor_refuses_reads() -> None:
    c = cursor(ledger_with(3))
    c.close()
    with pytest.raises(CursorClosedError, match=r"^cursor c is closed$"):
        c.read_entries(1)
    with pytest.raises(CursorClosedError, match=r"^cursor c is closed$"):
        c.replay_entries([P(1, 0)])
    c.close()  # idempotent


def test_read_of_zero_entries() -> None:
    c = cursor(ledger_with(3))
    assert read_ids(c, 0) == []
    assert c.read_position == P(1, 0)
