"""Cursor ack-state persistence (seed PIP-299): rate limit, truncation, restore, codec."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keyshared.storage.cursor import CursorConfig, KeyValueCursorStore, ManagedCursor
from keyshared.storage.cursor_codec import (
    CursorCodecError,
    CursorSnapshot,
    decode_snapshot,
    encode_snapshot,
)
from keyshared.storage.errors import StorageError
from keyshared.storage.memory import InMemoryLedger, MemoryCursorStore
from keyshared.storage.metadata import MetadataStore
from keyshared.storage.position import EARLIEST, LATEST, Position
from keyshared.storage.range_set import RangeSet


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(
    entries: int = 40, per_ledger: int | None = None, **config: float
) -> tuple[InMemoryLedger, MemoryCursorStore, Clock, CursorConfig]:
    ledger = InMemoryLedger(max_entries_per_ledger=per_ledger)
    ledger.add_entries(entries)
    return ledger, MemoryCursorStore(), Clock(), CursorConfig(**config)  # type: ignore[arg-type]


def open_cursor(
    ledger: InMemoryLedger,
    store: MemoryCursorStore,
    clock: Clock,
    config: CursorConfig,
    initial: Position = EARLIEST,
) -> ManagedCursor:
    return ManagedCursor(
        "sub", ledger, store, durable=True, initial_position=initial, config=config, clock=clock
    )


def acked_positions(cursor: ManagedCursor, ledger: InMemoryLedger) -> set[Position]:
    return {p for p in ledger.positions() if cursor.is_acked(p)}


def test_holes_survive_a_restart() -> None:
    ledger, store, clock, config = make(entries=30, per_ledger=8)
    c = open_cursor(ledger, store, clock, config)
    ps = ledger.positions()
    c.ack_individual(ps[0:3] + ps[5:7] + ps[8:12] + ps[20:21])
    assert c.mark_delete_position == ps[2]
    assert len(c.individually_deleted) == 3
    before = acked_positions(c, ledger)
    c.close()
    restored = open_cursor(ledger, store, clock, config, initial=LATEST)
    assert restored.mark_delete_position == ps[2]
    assert list(restored.individually_deleted) == list(c.individually_deleted)
    assert acked_positions(restored, ledger) == before
    assert restored.read_position == ps[3]
    assert restored.number_of_entries_in_backlog == 30 - len(before)


def test_beyond_the_range_limit_only_the_first_ranges_come_back() -> None:
    ledger, store, clock, config = make(entries=40, max_unacked_ranges_to_persist=3)
    c = open_cursor(ledger, store, clock, config)
    ps = ledger.positions()
    holes = [ps[i] for i in range(1, 40, 3)] + [ps[i] for i in range(2, 40, 3)]
    c.ack_individual(holes)
    assert len(c.individually_deleted) == 13
    assert not c.is_ack_state_fully_persistable()
    acked_before = acked_positions(c, ledger)
    first_three = c.individually_deleted.first_n(3)
    assert c.persist(force=True)
    assert c.last_persisted_range_count == 3
    assert c.last_persisted_total_ranges == 13
    # A crash: the old cursor is dropped without close.
    restored = open_cursor(ledger, store, clock, config)
    assert list(restored.individually_deleted) == first_three
    assert restored.is_ack_state_fully_persistable()
    acked_after = acked_positions(restored, ledger)
    # Never loss: nothing unacked comes back acked. Duplicates: the rest comes back unacked.
    assert acked_after <= acked_before
    assert acked_after == {p for r in first_three for p in RangeSet([r]).positions()}
    assert restored.number_of_entries_in_backlog == 40 - len(acked_after)


def test_pause_rule_input_follows_the_range_count() -> None:
    ledger, store, clock, config = make(entries=20, max_unacked_ranges_to_persist=2)
    c = open_cursor(ledger, store, clock, config)
    ps = ledger.positions()
    c.ack_individual([ps[1], ps[3]])
    assert c.is_ack_state_fully_persistable()
    c.ack_individual([ps[5]])
    assert not c.is_ack_state_fully_persistable()
    c.ack_individual([ps[4]])  # 3..5 merge: two ranges again
    assert c.is_ack_state_fully_persistable()


def test_mark_delete_persistence_is_rate_limited() -> None:
    ledger, store, clock, config = make(entries=10, mark_delete_rate_limit=1.0)
    c = open_cursor(ledger, store, clock, config)
    ps = ledger.positions()
    saves = store.saves  # the new cursor saved its initial position
    assert saves == 1
    c.ack_individual([ps[0]])
    assert store.saves == saves  # within a second of the creation save
    assert c.is_dirty
    clock.now += 1.0
    c.ack_individual([ps[1]])
    assert store.saves == saves + 1
    c.ack_individual([ps[2]])
    c.ack_individual([ps[5]])  # a hole: only in memory until the next persist
    assert store.saves == saves + 1
    # A crash now: the last persisted state had mark-delete at ps[1].
    crashed = open_cursor(ledger, store, clock, config)
    assert crashed.mark_delete_position == ps[1]
    assert not crashed.is_acked(ps[2]) and not crashed.is_acked(ps[5])
    # The periodic flush writes dirty cursors regardless of the rate limit.
    assert c.flush()
    assert not c.flush()  # nothing changed since
    again = open_cursor(ledger, store, clock, config)
    assert again.mark_delete_position == ps[2]
    assert again.is_acked(ps[5])


def test_rate_limit_zero_persists_every_mark_delete() -> None:
    ledger, store, clock, config = make(entries=5, mark_delete_rate_limit=0)
    c = open_cursor(ledger, store, clock, config)
    for p in ledger.positions():
        c.ack_individual([p])
    assert store.saves == 1 + 5
    assert c.last_persisted_mark_delete == ledger.positions()[-1]


def test_without_persist_on_mark_delete_only_flush_writes() -> None:
    ledger, store, clock, config = make(
        entries=5, mark_delete_rate_limit=0, persist_on_mark_delete=0
    )
    c = open_cursor(ledger, store, clock, config)
    c.ack_individual(ledger.positions())
    assert store.saves == 1 and c.is_dirty
    assert c.flush()
    assert store.saves == 2
    assert open_cursor(ledger, store, clock, config).number_of_entries_in_backlog == 0


def test_state_in_the_metadata_store() -> None:
    ledger, _, clock, config = make(entries=10)
    meta = MetadataStore(":memory:")
    store = KeyValueCursorStore(meta, "cursors/topic/")
    c = ManagedCursor("sub", ledger, store, initial_position=EARLIEST, config=config, clock=clock)
    ps = ledger.positions()
    c.ack_individual([ps[0], ps[2], ps[5]])
    c.close()
    assert meta.list_keys("cursors/topic/") == ["cursors/topic/sub"]
    again = ManagedCursor("sub", ledger, store, config=config, clock=clock)
    assert again.mark_delete_position == ps[0]
    assert list(again.individually_deleted) == [(ps[2], ps[2]), (ps[5], ps[5])]
    again.delete()
    assert meta.list_keys("cursors/") == []
    meta.close()


def test_batch_bitsets_persist_up_to_their_limit() -> None:
    ledger, store, clock, config = make(entries=10, max_batch_deleted_index_to_persist=2)
    c = open_cursor(ledger, store, clock, config)
    ps = ledger.positions()
    c.ack_batch_index(ps[4], [0b1011], 4)
    c.ack_batch_index(ps[2], [0b0111], 4)
    c.ack_batch_index(ps[7], [-2], 64)  # every index but 0 unacked, high bit set
    c.close()
    restored = open_cursor(ledger, store, clock, config)
    assert restored.get_ack_set(ps[2]) == [0b0111]
    assert restored.get_ack_set(ps[4]) == [0b1011]
    assert restored.get_ack_set(ps[7]) is None  # third bitset: memory only, now fully unacked
    assert not restored.is_acked(ps[7])


def test_new_durable_cursor_saves_its_start_position() -> None:
    ledger, store, clock, config = make(entries=5)
    c = open_cursor(ledger, store, clock, config, initial=LATEST)
    assert c.mark_delete_position == ledger.positions()[-1]
    ledger.add_entries(3)
    # A crash right after subscribing: the subscription still starts where it was created.
    restored = open_cursor(ledger, store, clock, config, initial=EARLIEST)
    assert restored.mark_delete_position == Position(1, 4)
    assert restored.number_of_entries_in_backlog == 3


def test_delete_forgets_and_non_durable_never_stores() -> None:
    ledger, store, clock, config = make(entries=5)
    c = open_cursor(ledger, store, clock, config)
    assert store.names() == ["sub"]
    c.delete()
    assert store.names() == []
    assert c.closed
    nd = ManagedCursor("nd", ledger, store, durable=False, initial_position=EARLIEST)
    nd.ack_individual(ledger.positions())
    assert not nd.persist(force=True)
    nd.close()
    assert store.names() == []


def test_corrupt_state_is_refused() -> None:
    ledger, store, clock, config = make(entries=5)
    store.save("sub", b"\x09garbage")
    with pytest.raises(CursorCodecError):
        open_cursor(ledger, store, clock, config)
    store.save("sub", b"\x01\x02")
    with pytest.raises(CursorCodecError):
        open_cursor(ledger, store, clock, config)


POS = st.builds(Position, st.integers(-1, 2**40), st.integers(-1, 2**40))


@given(
    mdp=POS,
    ranges=st.binary(max_size=40),
    batch=st.lists(
        st.tuples(POS, st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3)), max_size=5
    ),
)
def test_snapshot_round_trip(
    mdp: Position, ranges: bytes, batch: list[tuple[Position, list[int]]]
) -> None:
    snap = CursorSnapshot(mdp, ranges, batch)
    data = encode_snapshot(snap)
    assert data[0] == 1
    assert decode_snapshot(data) == snap


def test_persist_size_and_time_for_many_holes() -> None:
    """10^5 holes: the figure to watch (full measurements are in the storage report)."""
    n = 100_000
    ledger = InMemoryLedger()
    ledger.add_entries(2 * n + 1)
    store = MemoryCursorStore()
    c = ManagedCursor(
        "sub",
        ledger,
        store,
        initial_position=EARLIEST,
        config=CursorConfig(max_unacked_ranges_to_persist=n),
    )
    c.ack_individual(Position(1, e) for e in range(1, 2 * n + 1, 2))
    assert len(c.individually_deleted) == n
    t = time.perf_counter()
    assert c.persist(force=True)
    elapsed = time.perf_counter() - t
    assert c.last_persisted_bytes < 3 * n
    assert elapsed < 0.5
    restored = ManagedCursor("sub", ledger, store, initial_position=LATEST)
    assert restored.individually_deleted == c.individually_deleted


def test_persister_saves_the_cursors_of_one_loop_turn_in_one_transaction() -> None:
    """Acks that move mark-delete positions are saved at the end of the loop's turn, all the
    cursors of that turn in one transaction; a cursor deleted or closed meanwhile is not
    written again; a failing store leaves the state dirty for the next try."""
    import asyncio

    from keyshared.storage.cursor import CursorPersister

    async def main() -> None:
        ledger, _, clock, _ = make(entries=10)
        config = CursorConfig(mark_delete_rate_limit=0)
        meta = MetadataStore(":memory:")
        commits: list[int] = []
        put_many = meta.put_many

        def counting(items, deletes=()):  # type: ignore[no-untyped-def]
            items = list(items)
            commits.append(len(items))
            put_many(items, deletes)

        meta.put_many = counting  # type: ignore[method-assign]
        persister = CursorPersister(meta)
        store = KeyValueCursorStore(meta, "cursors/t/")
        cursors = [
            ManagedCursor(
                f"s{i}",
                ledger,
                store,
                initial_position=EARLIEST,
                config=config,
                clock=clock,
                persister=persister,
            )
            for i in range(5)
        ]
        ps = ledger.positions()
        for c in cursors:
            c.ack_individual([ps[0]])
            # Not yet: at the end of this turn of the loop.
            assert c.is_dirty
        cursors[4].delete()
        await asyncio.sleep(0)
        assert commits == [4] and persister.commits == 1
        for c in cursors[:4]:
            assert not c.is_dirty
            again = ManagedCursor(c.name, ledger, store, config=config, clock=clock)
            assert again.mark_delete_position == ps[0]
        assert "cursors/t/s4" not in meta.list_keys("cursors/t/")

        def failing(items, deletes=()):  # type: ignore[no-untyped-def]
            raise StorageError("disk on fire")

        meta.put_many = failing  # type: ignore[method-assign]
        cursors[0].ack_individual([ps[1]])
        await asyncio.sleep(0)
        assert cursors[0].is_dirty and cursors[0].persist_failing
        meta.put_many = counting  # type: ignore[method-assign]
        assert cursors[0].flush()
        assert not cursors[0].is_dirty and not cursors[0].persist_failing
        meta.close()

    asyncio.run(main())
