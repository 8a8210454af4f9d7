"""Cursor cases the broker-level tests and the simulator reach only by chance: each kills a
mutant of ``storage/cursor*.py`` that survived ``make mutate`` (bench/results/mutation/report.md).
"""

from __future__ import annotations

from keyshared.storage.cursor import CursorConfig, ManagedCursor
from keyshared.storage.memory import InMemoryLedger
from keyshared.storage.position import EARLIEST, Position

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
