"""The cursor over the real ManagedLedger behaves as over InMemoryLedger (EntryReader conformance),
and its state survives a storage restart through the metadata store."""

from __future__ import annotations

import asyncio
from pathlib import Path

from keyshared.storage.config import StorageConfig
from keyshared.storage.cursor import CursorConfig, KeyValueCursorStore, ManagedCursor
from keyshared.storage.memory import InMemoryLedger
from keyshared.storage.position import EARLIEST, LATEST, Position
from keyshared.storage.store import Storage

PER_LEDGER = 4


async def fill(ml: object, n: int) -> list[Position]:
    added = [ml.add_entry(b"m%d" % i) for i in range(n)]  # type: ignore[attr-defined]
    await asyncio.gather(*(fut for _, fut in added))
    return [pos for pos, _ in added]


def test_same_positions_and_reads_as_the_in_memory_ledger(tmp_path: Path) -> None:
    async def main() -> None:
        st = Storage(tmp_path, StorageConfig(max_entries_per_ledger=PER_LEDGER)).open()
        ml = st.open_managed_ledger("public/default/t")
        real = await fill(ml, 11)
        mem = InMemoryLedger(first_ledger_id=real[0].ledger_id, max_entries_per_ledger=PER_LEDGER)
        assert mem.add_entries(11) == real
        for pos in [Position(real[0].ledger_id, -1), *real]:
            assert ml.next_position(pos) == mem.next_position(pos), pos
            assert ml.previous_position(pos) == mem.previous_position(pos), pos
        assert ml.last_add_confirmed == mem.last_add_confirmed
        assert ml.first_position == mem.first_position
        assert ml.count_entries(real[2], real[9]) == mem.count_entries(real[2], real[9])

        cursors = [
            ManagedCursor("c", reader, None, durable=False, initial_position=EARLIEST)
            for reader in (ml, mem)
        ]
        script: list[tuple[str, object]] = [
            ("read", 3),
            ("ack", [real[0], real[1], real[4], real[5], real[6]]),
            ("read", 2),
            ("rewind", None),
            ("read", 10),
            ("ack", [real[2], real[3]]),
            ("skip", 2),
            ("seek", real[9]),
            ("read", 1),
        ]
        for op, arg in script:
            seen: list[object] = []
            for c in cursors:
                if op == "read":
                    result = await c.read_entries(arg)  # type: ignore[arg-type]
                    seen.append([e.position for e in result.entries])
                elif op == "ack":
                    c.ack_individual(arg)  # type: ignore[arg-type]
                elif op == "rewind":
                    c.rewind()
                elif op == "skip":
                    c.skip_entries(arg)  # type: ignore[arg-type]
                else:
                    c.seek(arg)  # type: ignore[arg-type]
                seen.append(
                    (
                        c.mark_delete_position,
                        c.read_position,
                        c.number_of_entries_in_backlog,
                        c.number_of_entries_to_read,
                    )
                )
            assert seen[: len(seen) // 2] == seen[len(seen) // 2 :], op

        # A read waiting on the real ledger wakes when an append becomes durable.
        c = cursors[0]
        c.seek(LATEST)
        waiting = asyncio.ensure_future(c.read_entries_or_wait(5))
        await asyncio.sleep(0)
        assert c.is_waiting_for_entries
        (pos,) = await fill(ml, 1)
        result = await asyncio.wait_for(waiting, 5)
        assert [e.position for e in result.entries] == [pos]
        await st.close()

    asyncio.run(main())


def test_state_survives_a_storage_restart(tmp_path: Path) -> None:
    name = "public/default/t"

    async def first() -> list[Position]:
        st = Storage(tmp_path, StorageConfig(max_entries_per_ledger=PER_LEDGER)).open()
        ml = st.open_managed_ledger(name)
        ps = await fill(ml, 10)
        store = KeyValueCursorStore(st.metadata, f"cursors/{name}/")
        c = ManagedCursor("sub", ml, store, initial_position=EARLIEST, config=CursorConfig())
        c.ack_individual([ps[0], ps[1], ps[2], ps[3], ps[4], ps[7]])
        c.ack_batch_index(ps[8], [0b10], 2)
        c.close()
        await st.close()
        return ps

    async def second(ps: list[Position]) -> None:
        st = Storage(tmp_path, StorageConfig(max_entries_per_ledger=PER_LEDGER)).open()
        ml = st.open_managed_ledger(name)
        store = KeyValueCursorStore(st.metadata, f"cursors/{name}/")
        c = ManagedCursor("sub", ml, store, initial_position=LATEST)
        assert c.mark_delete_position == ps[4]
        assert list(c.individually_deleted) == [(ps[7], ps[7])]
        assert c.get_ack_set(ps[8]) == [0b10]
        result = await c.read_entries(10)
        assert [e.position for e in result.entries] == [ps[5], ps[6], ps[8], ps[9]]
        c.close()
        await st.close()

    ps = asyncio.run(first())
    asyncio.run(second(ps))
