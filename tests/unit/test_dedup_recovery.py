"""Deduplication state rebuilt from the metadata snapshot plus a replay of the real ledger."""

from __future__ import annotations

import asyncio
from pathlib import Path

from keyshared.broker.dedup import DUPLICATE, NEW, Deduplication
from keyshared.broker.sequence_ids import send_ids
from keyshared.storage.config import StorageConfig
from keyshared.storage.ledger import ManagedLedger
from keyshared.storage.position import Position
from keyshared.storage.store import Storage
from tests.unit.test_dedup_state import batch_entry

TOPIC = "persistent://public/default/t"


async def publish(dedup: Deduplication, ml: ManagedLedger, data: bytes) -> Position:
    """What PersistentTopic.publish does for a new send."""
    send = send_ids(data)
    assert dedup.check("p", send).kind == NEW
    pos, fut = ml.add_entry(data)
    dedup.pushed_send("p", send, pos, fut)
    await fut
    dedup.persisted_send("p", send, pos, fut)
    return pos


def test_snapshot_plus_replay_of_key_based_batches(tmp_path: Path) -> None:
    # Key-based batches of one flush window, out of id order: a = 0, 3, 4; b = 1, 2, 5.
    batches = [
        batch_entry("p", [0, 3, 4], ["a"] * 3),
        batch_entry("p", [1, 2, 5], ["b"] * 3, compress=True),
        batch_entry("p", [6, 9], ["a"] * 2),
        batch_entry("p", [7, 8], ["b"] * 2),
    ]

    async def main() -> None:
        st = Storage(tmp_path, StorageConfig()).open()
        ml = st.open_managed_ledger("public/default/t")
        dedup = Deduplication(TOPIC, ml, st.metadata)
        await dedup.recover()
        positions = [await publish(dedup, ml, batches[0]), await publish(dedup, ml, batches[1])]
        dedup.snapshot()  # covers the first two entries
        positions += [await publish(dedup, ml, batches[2]), await publish(dedup, ml, batches[3])]
        # A crash: no snapshot of the last two; a new instance recovers.
        again = Deduplication(TOPIC, ml, st.metadata)
        await again.recover()
        assert again.last_sequence_id("p") == 9
        assert len(again.state.producers["p"].persisted) == 1
        for data, pos in zip(batches, positions, strict=True):
            decision = again.check("p", send_ids(data))
            assert decision.kind == DUPLICATE
            # Replayed entries are answered with their id; older ones were not remembered.
            assert decision.position == (pos if pos in positions[2:] else None)
        assert again.check("p", send_ids(batch_entry("p", [10, 11], ["a"] * 2))).kind == NEW
        await st.close()

    asyncio.run(main())


def test_a_snapshot_ahead_of_the_log_is_not_trusted(tmp_path: Path) -> None:
    """Entries a snapshot covers were lost (written without sync): rebuild from the log."""

    async def main() -> None:
        st = Storage(tmp_path, StorageConfig()).open()
        ml = st.open_managed_ledger("public/default/t")
        dedup = Deduplication(TOPIC, ml, st.metadata)
        await dedup.recover()
        await publish(dedup, ml, batch_entry("p", [0, 2], ["a"] * 2))
        lac = ml.last_add_confirmed
        st.metadata.put_json(
            dedup.key,
            {
                "version": 2,
                "producers": {"p": {"highest": 9, "ranges": [0, 10]}},
                "position": [lac.ledger_id, lac.entry_id + 5],
            },
        )
        again = Deduplication(TOPIC, ml, st.metadata)
        await again.recover()
        assert again.last_sequence_id("p") == 2
        assert again.state.is_persisted("p", 0) and again.state.is_persisted("p", 2)
        assert again.state.is_persisted("p", 1) is False
        await st.close()

    asyncio.run(main())
