"""Cursor cases the broker-level tests and the simulator reach only by chance: each kills a
mutant of ``storage/cursor*.py`` that survived ``make mutate`` (bench/results/mutation/report.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from keyshared.config import BrokerConfig
from keyshared.storage import cursor_codec
from keyshared.storage.cursor import (
    CursorConfig,
    CursorPersister,
    KeyValueCursorStore,
    ManagedCursor,
)
from keyshared.storage.cursor_codec import CursorSnapshot, encode_snapshot
from keyshared.storage.errors import StorageError
from keyshared.storage.memory import ControlledReader, InMemoryLedger, MemoryCursorStore
from keyshared.storage.position import EARLIEST, Position
from keyshared.storage.range_set import RangeSet

P = Position


def cursor_over(n: int, **cfg: object) -> tuple[InMemoryLedger, ManagedCursor]:
    ledger = InMemoryLedger()
    ledger.add_entries(n)
    c = ManagedCursor(
        "c", ledger, None, durable=False, initial_position=EARLIEST, config=CursorConfig(**cfg)
    )
    return ledger, c


def test_a_batch_index_ack_of_an_acked_entry_keeps_no_bitset() -> None:
    _, c = cursor_over(5)
    c.ack_individual([P(1, 2)])
    # Indexes 1 and 2 of 4 still unacked: no effect on an entry acked as a whole.
    assert not c.ack_batch_index(P(1, 2), [0b0110], 4)
    assert dict(c.batch_deleted_indexes) == {}
    assert c.get_ack_set(P(1, 2)) is None


def test_a_batch_index_ack_past_the_last_entry_is_ignored() -> None:
    ledger, c = cursor_over(3)
    assert not c.ack_batch_index(P(1, 7), [0b0110], 4)
    assert dict(c.batch_deleted_indexes) == {}
    assert not c.is_dirty
    ledger.add_entries(5)  # 1:7 exists now and no index of it was acked
    assert c.get_ack_set(P(1, 7)) is None


def test_repr_names_the_cursor_and_its_positions() -> None:
    _, c = cursor_over(6)
    c.ack_individual([P(1, 0), P(1, 3)])
    c.seek(P(1, 2))
    assert repr(c) == "ManagedCursor('c', mark_delete=1:0, read=1:2, ranges=1, epoch=1)"


def test_internal_stats_of_an_idle_cursor_are_pulsars_fields() -> None:
    _, c = cursor_over(6)
    c.ack_individual([P(1, 0), P(1, 1), P(1, 4)])
    c.seek(P(1, 3))
    assert c.internal_stats() == {
        "markDeletePosition": "1:1",
        "readPosition": "1:3",
        "waitingReadOp": False,
        "pendingReadOps": 0,
        "messagesConsumedCounter": 3,
        "cursorLedger": -1,
        "cursorLedgerLastEntry": -1,
        "individuallyDeletedMessages": "[(1:3..1:4]]",
        "lastLedgerSwitchTimestamp": "",
        "state": "Open",
        "active": True,
        "numberOfEntriesSinceFirstNotAckedMessage": 2,
        "totalNonContiguousDeletedMessagesRange": 1,
        "subscriptionHavePendingRead": False,
        "subscriptionHavePendingReplayRead": False,
        "properties": {},
    }
    c.close()
    closed = c.internal_stats()
    assert (closed["state"], closed["active"]) == ("Closed", False)


def test_internal_stats_list_at_most_max_ranges() -> None:
    _, c = cursor_over(10)
    c.ack_individual([P(1, 2), P(1, 4), P(1, 6)])
    every = "[(1:1..1:2], (1:3..1:4], (1:5..1:6]]"
    assert c.internal_stats()["individuallyDeletedMessages"] == every
    assert c.internal_stats(2)["individuallyDeletedMessages"] == "[(1:1..1:2], (1:3..1:4]]"


def test_closing_a_cursor_whose_read_waits_stops_listening() -> None:
    async def go() -> None:
        ledger = InMemoryLedger()
        c = ManagedCursor("c", ledger, None, durable=False, initial_position=EARLIEST)
        wait = asyncio.ensure_future(c.read_entries_or_wait(1))
        await asyncio.sleep(0)
        assert ledger.listener_count == 1
        c.close()
        assert ledger.listener_count == 0
        assert (await wait).cancelled

    asyncio.run(go())


def test_internal_stats_count_reads_in_flight_and_waiting() -> None:
    async def go() -> None:
        _, reader, c = _cursor_over(4)
        read = asyncio.ensure_future(c.read_entries(2))
        replay = asyncio.ensure_future(c.replay_entries([P(1, 0)]))
        await asyncio.sleep(0)
        s = c.internal_stats()
        assert (s["pendingReadOps"], s["waitingReadOp"]) == (2, False)
        assert s["subscriptionHavePendingRead"] is True
        assert s["subscriptionHavePendingReplayRead"] is True
        assert c.pending_replay_reads == 1
        reader.complete_all()
        await asyncio.gather(read, replay)
        s = c.internal_stats()
        assert (s["pendingReadOps"], s["subscriptionHavePendingReplayRead"]) == (0, False)
        c.ack_individual([P(1, 0), P(1, 1), P(1, 2), P(1, 3)])
        wait = asyncio.ensure_future(c.read_entries_or_wait(2))
        await asyncio.sleep(0)
        s = c.internal_stats()
        assert (s["pendingReadOps"], s["waitingReadOp"]) == (0, True)
        assert s["subscriptionHavePendingRead"] is True
        c.cancel_pending_read()
        assert (await wait).cancelled

    asyncio.run(go())


class DictKV:
    """A key-value store with no ``put_many``: the persister falls back to one put per key."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.puts: list[str] = []

    def get(self, key: str) -> bytes | None:
        return self.data.get(key)

    def put(self, key: str, value: bytes) -> None:
        self.puts.append(key)
        self.data[key] = value

    def delete(self, key: str) -> bool:
        return self.data.pop(key, None) is not None


def durable_cursors(kv: DictKV, persister: CursorPersister, n: int) -> list[ManagedCursor]:
    ledger = InMemoryLedger()
    ledger.add_entries(5)
    store = KeyValueCursorStore(kv, "cursors/t/")
    config = CursorConfig(mark_delete_rate_limit=0)
    return [
        ManagedCursor(
            f"s{i}", ledger, store, initial_position=EARLIEST, config=config, persister=persister
        )
        for i in range(n)
    ]


def test_the_persister_saves_one_put_per_cursor_without_put_many() -> None:
    async def go() -> None:
        kv = DictKV()
        persister = CursorPersister(kv)
        cursors = durable_cursors(kv, persister, 3)
        kv.puts.clear()
        for c in cursors:
            c.ack_individual([P(1, 0)])
            c.ack_individual([P(1, 1)])  # scheduled twice in one turn, saved once
        assert kv.puts == []
        await asyncio.sleep(0)
        assert sorted(kv.puts) == ["cursors/t/s0", "cursors/t/s1", "cursors/t/s2"]
        assert (persister.commits, persister.saved) == (1, 3)
        for c in cursors:
            assert not c.is_dirty and c.persist_count == 2
            assert c.last_persisted_mark_delete == P(1, 1)
        again = ManagedCursor("s1", cursors[1].reader, KeyValueCursorStore(kv, "cursors/t/"))
        assert again.mark_delete_position == P(1, 1)
        # Nothing dirty: a turn with nothing to save commits nothing.
        persister.schedule(cursors[0])
        await asyncio.sleep(0)
        assert (persister.commits, persister.saved) == (1, 3)
        cursors[0].ack_individual([P(1, 2)])
        cursors[2].ack_individual([P(1, 2)])
        await asyncio.sleep(0)
        assert (persister.commits, persister.saved) == (2, 5)

    asyncio.run(go())


def test_the_persister_saves_at_once_outside_a_loop_or_for_another_store() -> None:
    kv = DictKV()
    persister = CursorPersister(kv)
    (c,) = durable_cursors(kv, persister, 1)
    kv.puts.clear()
    c.ack_individual([P(1, 0)])  # no running loop: saved at once
    assert kv.puts == ["cursors/t/s0"] and not c.is_dirty

    async def go() -> None:
        other_kv = DictKV()
        other = CursorPersister(other_kv)
        c.ack_batch_index(P(1, 1), [0b10], 2)  # dirty, the mark-delete did not move
        assert c.is_dirty
        other.schedule(c)  # not its store: saved at once, through the cursor's own store
        assert not c.is_dirty and kv.puts == ["cursors/t/s0"] * 2
        await asyncio.sleep(0)
        assert other_kv.puts == [] and other.commits == 0
        assert c.last_persisted_batch_count == 1

    asyncio.run(go())
    assert persister.commits == 0


class FlakyStore:
    """A cursor store whose saves fail while ``failing`` is set."""

    def __init__(self) -> None:
        self.failing = False
        self.saves = 0
        self.state: dict[str, bytes] = {}

    def load(self, cursor_name: str) -> bytes | None:
        return self.state.get(cursor_name)

    def save(self, cursor_name: str, state: bytes) -> None:
        self.saves += 1
        if self.failing:
            raise StorageError("disk full")
        self.state[cursor_name] = state

    def delete(self, cursor_name: str) -> None:
        self.state.pop(cursor_name, None)


def _cursor_log(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The cursor's own records: caplog also catches other loggers', e.g. asyncio's "Task was
    destroyed but it is pending" when the collector frees an earlier test's parked read here."""
    return [r for r in caplog.records if r.name == "keyshared.storage.cursor"]


def test_a_failing_save_is_logged_once_and_rate_limited_like_a_save(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    ledger = InMemoryLedger()
    ledger.add_entries(5)
    store = FlakyStore()
    c = ManagedCursor(
        "sub", ledger, store, initial_position=EARLIEST, config=CursorConfig(), clock=lambda: now[0]
    )
    assert store.saves == 1 and c.last_persist_time == 100.0
    store.failing = True
    now[0] = 102.0
    with caplog.at_level(logging.WARNING, logger="keyshared.storage.cursor"):
        assert c.ack_individual([P(1, 0)])
        assert store.saves == 2 and c.persist_failing and c.is_dirty
        assert c.last_persist_time == 102.0  # the failed try counts for the rate limit
        assert len(_cursor_log(caplog)) == 1  # logged at the first failure of a streak
        now[0] = 102.5
        c.ack_individual([P(1, 1)])
        assert store.saves == 2  # within the second after the failed try: not tried again
        now[0] = 103.5
        c.ack_individual([P(1, 2)])
        assert store.saves == 3 and c.persist_failing
        store.failing = False
        assert c.flush()
        assert c.persist_failing is False and c.persist_count == 2
    messages = [(r.levelname, r.getMessage()) for r in _cursor_log(caplog)]
    assert messages == [
        ("ERROR", "cursor sub: cannot persist its ack state: disk full"),
        ("WARNING", "cursor sub: ack state persisted again"),
    ]


class FailingKV(DictKV):
    """A key-value store whose writes fail."""

    def put(self, key: str, value: bytes) -> None:
        raise StorageError("disk on fire")


def test_a_failing_group_commit_marks_each_cursor_failing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def go() -> None:
        kv = DictKV()
        persister = CursorPersister(kv)
        cursors = durable_cursors(kv, persister, 2)
        kv.put = FailingKV.put.__get__(kv)  # type: ignore[method-assign]
        with caplog.at_level(logging.ERROR, logger="keyshared.storage.cursor"):
            for c in cursors:
                c.ack_individual([P(1, 0)])
            await asyncio.sleep(0)
        for c in cursors:
            assert c.persist_failing and c.is_dirty and c.persist_count == 1
        assert persister.commits == 0
        assert [r.getMessage() for r in _cursor_log(caplog)] == [
            "cursor s0: cannot persist its ack state: disk on fire",
            "cursor s1: cannot persist its ack state: disk on fire",
        ]

    asyncio.run(go())


def test_every_cursor_setting_comes_from_its_broker_key() -> None:
    conf = BrokerConfig()
    conf.managedLedgerMaxUnackedRangesToPersistInMetadataStore = 11
    conf.managedLedgerMaxBatchDeletedIndexToPersist = 12
    conf.managedLedgerCursorPositionFlushSeconds = 13
    conf.acknowledgmentAtBatchIndexLevelEnabled = False
    cc = CursorConfig.from_broker_config(conf)
    assert cc.max_unacked_ranges_to_persist_in_metadata_store == 11
    assert cc.max_batch_deleted_index_to_persist == 12
    assert cc.position_flush_seconds == 13.0
    assert cc.batch_index_ack_enabled is False


def test_a_restore_keeps_only_the_bitsets_of_unacked_entries() -> None:
    ledger = InMemoryLedger()
    ledger.add_entries(8)
    store = MemoryCursorStore()
    acked = RangeSet()
    acked.add(P(1, 5))
    snapshot = CursorSnapshot(
        P(1, 2), acked.to_bytes(), [(P(1, 4), [0b11]), (P(1, 5), [0b1]), (P(1, 6), [])]
    )
    data = encode_snapshot(snapshot)
    store.save("c", data)
    c = ManagedCursor("c", ledger, store)
    assert c.last_persisted_bytes == len(data)
    assert dict(c.batch_deleted_indexes) == {P(1, 4): 0b11}
    assert c.last_persisted_mark_delete == P(1, 2)
    assert c.last_persisted_batch_count == 1


def test_batch_index_acks_of_an_unknown_or_one_message_batch() -> None:
    _, c = cursor_over(6)
    # Size 0 (unknown): the ack set is taken as it comes.
    assert not c.ack_batch_index(P(1, 1), [0b11], 0)
    assert c.get_ack_set(P(1, 1)) == [0b11]
    assert not c.ack_batch_index(P(1, 2), [0b10], 0)
    assert c.get_ack_set(P(1, 2)) == [0b10]
    # One message still unacked: nothing to record.
    assert not c.ack_batch_index(P(1, 3), [0b1], 1)
    assert c.get_ack_set(P(1, 3)) is None
    # Bits past the batch's size are no messages.
    assert not c.ack_batch_index(P(1, 4), [0b110], 2)
    assert c.get_ack_set(P(1, 4)) == [0b10]
    assert not c.is_acked(P(1, 1)) and not c.is_acked(P(1, 2))


def test_a_bitset_of_unknown_size_is_cut_to_the_size_a_later_ack_gives() -> None:
    _, c = cursor_over(3)
    assert not c.ack_batch_index(P(1, 1), [0b111], 0)
    assert not c.ack_batch_index(P(1, 1), [0b110], 2)
    assert c.get_ack_set(P(1, 1)) == [0b10]


def test_cumulative_acks_count_what_they_ack_and_refuse_past_the_end() -> None:
    _, c = cursor_over(8, persist_on_mark_delete=False)
    c.ack_individual([P(1, 0), P(1, 1), P(1, 4)])
    assert c.messages_consumed_counter == 3
    assert not c.ack_cumulative(P(1, 1))  # the mark-delete position itself: nothing
    assert c.messages_consumed_counter == 3
    c.flush()
    assert c.ack_cumulative(P(1, 5))  # 1:2, 1:3 and 1:5; 1:4 was acked before
    assert c.messages_consumed_counter == 6
    assert c.is_dirty is True
    with pytest.raises(ValueError, match=r"^cannot mark-delete 1:9: after the last entry$"):
        c.ack_cumulative(P(1, 9))


def test_clear_backlog_marks_a_change_only_when_there_was_a_backlog() -> None:
    _, c = cursor_over(4)
    c.clear_backlog()
    assert c.is_dirty is True  # not durable: nothing saves it
    _, nothing = cursor_over(4)
    nothing.ack_cumulative(P(1, 3))
    nothing._dirty = False  # as after a save: no backlog left to clear
    nothing.clear_backlog()
    assert nothing.is_dirty is False


def test_clear_backlog_saves_at_once_whatever_the_rate_limit() -> None:
    ledger = InMemoryLedger()
    ledger.add_entries(4)
    store = FlakyStore()
    c = ManagedCursor("c", ledger, store, initial_position=EARLIEST, clock=lambda: 5.0)
    c.clear_backlog()  # within the rate limit's second after the first save
    assert store.saves == 2 and c.is_dirty is False and c.persist_failing is False
    again = ManagedCursor("c", ledger, store, clock=lambda: 5.0)
    assert again.mark_delete_position == P(1, 3)
    assert c.persist_count == 2


def test_a_cumulative_ack_over_no_entry_counts_nothing() -> None:
    ledger = InMemoryLedger(max_entries_per_ledger=3)  # 1:0..1:2, 2:0..2:2
    ledger.add_entries(6)
    c = ManagedCursor("c", ledger, None, durable=False, initial_position=EARLIEST)
    c.ack_individual([P(1, 0), P(1, 1), P(1, 2)])
    assert c.messages_consumed_counter == 3
    assert c.ack_cumulative(P(1, 50))  # past ledger 1's end, before ledger 2: no entry
    assert c.messages_consumed_counter == 3


def test_a_skip_keeps_the_bitsets_of_entries_after_what_it_skips() -> None:
    _, c = cursor_over(10)
    c.ack_individual([P(1, 2)])
    assert not c.ack_batch_index(P(1, 1), [0b0110], 4)
    assert not c.ack_batch_index(P(1, 6), [0b0110], 4)
    # 1:0, 1:1 (its bitset goes with it) and 1:3, stepping over the acked 1:2.
    assert c.skip_entries(3) == 3
    assert c.mark_delete_position == P(1, 3)
    assert dict(c.batch_deleted_indexes) == {P(1, 6): 0b0110}
    assert c.get_ack_set(P(1, 6)) == [0b0110]


def test_the_varint_message_class_packs_uint64s_as_field_one() -> None:
    # Built once at import, before a test can switch a mutant on: called again here.
    varints = cursor_codec._varint_message_class()
    values = [0, 1, 127, 128, 300, 2**64 - 1]
    payload = bytearray()
    for v in values:
        cursor_codec.write_uvarint(payload, v)
    msg = varints()
    msg.v.extend(values)
    # proto3 packs a repeated uint64: one tag (field 1, length-delimited), the length, the varints.
    assert msg.SerializeToString() == b"\x0a" + bytes([len(payload)]) + bytes(payload)
    back = varints()
    back.ParseFromString(b"\x0a" + bytes([len(payload)]) + bytes(payload))
    assert list(back.v) == values


def snapshot_with_batch_values(values: list[int]) -> bytes:
    """A stored cursor state at 1:2 with no ranges whose batch block holds ``values``."""
    out = bytearray((cursor_codec.SNAPSHOT_VERSION,))
    for v in (cursor_codec.zigzag(1), cursor_codec.zigzag(2), 0):
        cursor_codec.write_uvarint(out, v)
    block = cursor_codec.encode_uvarints(values)
    cursor_codec.write_uvarint(out, len(block))
    return bytes(out + block)


def test_corrupt_cursor_states_are_refused_with_what_is_wrong() -> None:
    decode = cursor_codec.decode_snapshot
    err = cursor_codec.CursorCodecError
    with pytest.raises(err, match=r"^empty cursor state$"):
        decode(b"")
    other = cursor_codec.SNAPSHOT_VERSION + 1
    with pytest.raises(err, match=rf"^unknown cursor state version {other}$"):
        decode(bytes((other, 0)))
    head = bytearray((cursor_codec.SNAPSHOT_VERSION, 2, 4, 5))  # at 1:2, ranges of 5 bytes
    with pytest.raises(err, match=r"^truncated range set$"):
        decode(bytes(head + b"\x01\x02"))
    whole = cursor_codec.encode_snapshot(CursorSnapshot(P(1, 2)))
    with pytest.raises(err, match=r"^batch block length does not match the data$"):
        decode(whole + b"\x00")
    with pytest.raises(err, match=r"^corrupt varint block: "):
        cursor_codec.decode_uvarints(b"\x80")  # a varint cut short
    one = [1, cursor_codec.zigzag(1), cursor_codec.zigzag(5)]
    assert decode(snapshot_with_batch_values([*one, 1, 7])).batch_indexes == [(P(1, 5), [7])]
    with pytest.raises(err, match=r"^truncated batch bitset$"):
        decode(snapshot_with_batch_values([*one, 3, 7]))
    with pytest.raises(err, match=r"^truncated batch block$"):
        decode(snapshot_with_batch_values(one))
    with pytest.raises(err, match=r"^trailing data in batch block$"):
        decode(snapshot_with_batch_values([*one, 1, 7, 9]))


def test_a_skip_counts_what_it_skips_and_saves_at_once() -> None:
    _, c = cursor_over(6)
    c.ack_individual([P(1, 0)])
    c._dirty = False  # as after a save
    assert c.skip_entries(2) == 2
    assert c.messages_consumed_counter == 3
    assert c.is_dirty is True  # not durable: nothing saves it
    ledger = InMemoryLedger()
    ledger.add_entries(4)
    store = FlakyStore()
    d = ManagedCursor("c", ledger, store, initial_position=EARLIEST, clock=lambda: 5.0)
    assert d.skip_entries(2) == 2  # within the rate limit's second after the first save
    assert store.saves == 2 and d.is_dirty is False
    assert ManagedCursor("c", ledger, store, clock=lambda: 5.0).mark_delete_position == P(1, 1)


def test_a_stale_or_cancelled_read_gives_an_empty_list() -> None:
    async def go() -> None:
        _, reader, c = _cursor_over(4)
        read = asyncio.ensure_future(c.read_entries(2))
        await asyncio.sleep(0)
        c.seek(P(1, 2))
        reader.complete_all()
        moved = await read
        assert moved.stale and moved.entries == []
        c.ack_individual([P(1, 0), P(1, 1), P(1, 2), P(1, 3)])
        wait = asyncio.ensure_future(c.read_entries_or_wait(2))
        await asyncio.sleep(0)
        c.cancel_pending_read()
        cancelled = await wait
        assert cancelled.cancelled and cancelled.entries == []

    asyncio.run(go())


def test_a_cancelled_wait_ending_leaves_the_listener_to_the_read_waiting_after_it() -> None:
    # A wait cancelled and a new read awaited at once, in the same step: the new one waits
    # before the cancelled one's task runs again. When that one ends it must leave the listener
    # alone, or the new read never hears of the next entry.
    async def go() -> None:
        ledger = InMemoryLedger()
        c = ManagedCursor("c", ledger, None, durable=False, initial_position=EARLIEST)
        first = asyncio.ensure_future(c.read_entries_or_wait(1))
        await asyncio.sleep(0)

        async def cancel_and_read_again() -> list[Position]:
            c.cancel_pending_read()
            return [e.position for e in (await c.read_entries_or_wait(1)).entries]

        second = asyncio.ensure_future(cancel_and_read_again())
        assert (await first).cancelled
        assert ledger.listener_count == 1
        ledger.add_entries(1)
        assert await asyncio.wait_for(second, 5) == [P(1, 0)]
        assert ledger.listener_count == 0

    asyncio.run(go())


def _cursor_over(entries: int) -> tuple[InMemoryLedger, ControlledReader, ManagedCursor]:
    """A non-durable cursor from the earliest of a new ledger of ``entries`` entries, whose
    reads wait until the test completes them."""
    ledger = InMemoryLedger()
    ledger.add_entries(entries)
    reader = ControlledReader(ledger)
    return (
        ledger,
        reader,
        ManagedCursor("c", reader, None, durable=False, initial_position=EARLIEST),
    )


async def _ticks(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_a_waiting_read_whose_entries_were_acked_meanwhile_waits_on() -> None:
    # Everything it read was acked while the read was out: a waiting read has nothing to give
    # yet, so it waits for the next entry rather than returning empty.
    async def go() -> None:
        ledger, reader, c = _cursor_over(1)
        read = asyncio.ensure_future(c.read_entries_or_wait(1))
        await _ticks()
        c.ack_individual([P(1, 0)])
        reader.complete_all()
        await _ticks()
        assert not read.done()
        ledger.add_entries(1)
        await _ticks()
        reader.complete_all()
        result = await asyncio.wait_for(read, 5)
        assert [e.position for e in result.entries] == [P(1, 1)] and not result.stale

    asyncio.run(go())


def _two_batch_read(ack: Callable[[ManagedCursor], object]) -> list[Position]:
    """A read of up to 4 over 1:0 and 1:1 whose first batch is answered before 1:2 is added, so
    it reads a second batch; ``ack`` runs while that one is out. Returns what the read gave."""

    async def go() -> list[Position]:
        ledger, reader, c = _cursor_over(2)
        read = asyncio.ensure_future(c.read_entries(4))
        await _ticks()
        assert reader.complete_all() == 1
        ledger.add_entries(1)
        await _ticks()
        ack(c)
        assert reader.complete_all() == 1
        return [e.position for e in (await read).entries]

    return asyncio.run(go())


def test_an_entry_of_an_earlier_batch_acked_during_a_later_one_is_not_returned() -> None:
    assert _two_batch_read(lambda c: c.ack_individual([P(1, 1)])) == [P(1, 0), P(1, 2)]


def test_an_entry_of_an_earlier_batch_the_mark_delete_passed_during_a_later_one_is_not_returned() -> (
    None
):
    assert _two_batch_read(lambda c: c.ack_cumulative(P(1, 0))) == [P(1, 1), P(1, 2)]


def test_a_batch_the_mark_delete_moved_into_while_it_was_read_gives_what_is_after() -> None:
    async def go() -> None:
        _, reader, c = _cursor_over(3)
        read = asyncio.ensure_future(c.read_entries(3))
        await _ticks()
        c.ack_cumulative(P(1, 0))
        reader.complete_all()
        assert [e.position for e in (await read).entries] == [P(1, 1), P(1, 2)]

    asyncio.run(go())


def test_a_read_whose_ledger_was_trimmed_while_it_was_out_returns_nothing() -> None:
    # The last entry, in a ledger since rolled over: acked and trimmed while the read of it was
    # out, the read finds nothing there and returns empty.
    async def go() -> None:
        ledger = InMemoryLedger()
        ledger.add_entries(1)
        ledger.roll_ledger()
        reader = ControlledReader(ledger)
        c = ManagedCursor("c", reader, None, durable=False, initial_position=EARLIEST)
        read = asyncio.ensure_future(c.read_entries(1))
        await _ticks()
        c.ack_cumulative(P(1, 0))
        ledger.trim(P(1, 0))
        assert reader.complete_all() == 1
        result = await read
        assert result.entries == [] and not result.stale

    asyncio.run(go())


def test_no_more_entries_when_all_after_the_read_position_are_acked() -> None:
    _, c = cursor_over(3)
    c.ack_individual([P(1, 1), P(1, 2)])
    assert c.has_more_entries()  # 1:0
    c.seek(P(1, 1))
    assert not c.has_more_entries()


def test_replay_reads_in_flight_are_counted_each() -> None:
    async def go() -> None:
        _, reader, c = _cursor_over(4)
        first = asyncio.ensure_future(c.replay_entries([P(1, 0)]))
        second = asyncio.ensure_future(c.replay_entries([P(1, 2)]))
        await _ticks()
        assert c.pending_replay_reads == 2
        assert c.internal_stats()["pendingReadOps"] == 2
        reader.complete(0)
        await first
        assert c.pending_replay_reads == 1
        reader.complete_all()
        await second
        assert c.pending_replay_reads == 0

    asyncio.run(go())


@pytest.mark.parametrize(
    "wanted",
    [
        [P(1, 1), P(1, 2)],  # one run of two
        [P(1, 0), P(1, 1), P(1, 5)],  # a run of two, then one apart
        [P(1, 0), P(1, 5), P(1, 8)],  # three apart: no run at all
    ],
)
def test_a_replay_reads_runs_of_consecutive_entries_and_gives_exactly_those_asked(
    wanted: list[Position],
) -> None:
    async def go() -> list[Position]:
        _, c = cursor_over(10)
        return [e.position for e in await c.replay_entries(wanted)]

    assert asyncio.run(go()) == wanted


@pytest.mark.parametrize("durable", [True, False])
def test_a_new_cursor_is_open_clean_and_has_persisted_nothing(durable: bool) -> None:
    c = ManagedCursor("c", InMemoryLedger(), None, durable=durable, initial_position=EARLIEST)
    assert c.durable is durable
    assert c.closed is False and c.is_dirty is False
    assert c.last_persist_time == float("-inf") and c.persist_count == 0
    assert c.persist_failing is False
    assert c.last_persisted_mark_delete is None
    assert (c.last_persisted_range_count, c.last_persisted_total_ranges) == (0, 0)
    assert (c.last_persisted_batch_count, c.last_persisted_bytes) == (0, 0)
