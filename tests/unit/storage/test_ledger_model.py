"""Property test: random appends, reads, trims, restarts and crashes agree with a list model."""

from __future__ import annotations

import asyncio
import os
import tempfile
from itertools import pairwise
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyshared.storage.config import StorageConfig
from keyshared.storage.ledger import ManagedLedger
from keyshared.storage.position import EARLIEST, LATEST, Position
from keyshared.storage.store import Storage

ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 8), st.booleans()),
        st.tuples(st.just("read"), st.integers(0, 40), st.integers(1, 12)),
        st.tuples(st.just("trim"), st.integers(0, 40), st.just(False)),
        st.tuples(st.just("reopen"), st.just(0), st.just(False)),
        st.tuples(st.just("crash"), st.just(0), st.just(False)),
    ),
    min_size=1,
    max_size=25,
)


class Harness:
    """A storage that can be reopened or 'crashed', and the model it must agree with."""

    def __init__(self, path: Path, config: StorageConfig) -> None:
        self.path = path
        self.config = config
        self.model: list[tuple[Position, bytes]] = []
        self.pending: list[asyncio.Future[None]] = []
        self.counter = 0
        self.storage = Storage(path, config).open()
        self.ml = self.storage.open_managed_ledger("topic")
        self.ledger_ids = [self.ml.current_ledger_id]

    def append(self, n: int) -> None:
        for _ in range(n):
            data = b"%d:" % self.counter + b"x" * (self.counter % 17)
            self.counter += 1
            pos, fut = self.ml.add_entry(data)
            if self.model:
                assert pos > self.model[-1][0]
            self.model.append((pos, data))
            self.pending.append(fut)

    async def settle(self) -> None:
        await asyncio.gather(*self.pending)
        self.pending.clear()

    async def reopen(self, crash: bool) -> None:
        if crash:
            ctx = self.storage._ctx
            assert ctx is not None
            await ctx.journal.close()
            ctx.segments.close_all()
            ctx.metadata.close()
            os.close(self.storage._lock_fd)
        else:
            await self.storage.close()
        self.pending.clear()
        self.storage = Storage(self.path, self.config).open()
        self.ml = self.storage.open_managed_ledger("topic")
        assert self.ml.current_ledger_id > max(self.ledger_ids)
        self.ledger_ids.append(self.ml.current_ledger_id)

    def trim(self, k: int) -> None:
        if not self.model:
            return
        target = self.model[min(k, len(self.model) - 1)][0]
        current = self.ml.current_ledger_id
        counts: dict[int, int] = {}
        for pos, _ in self.model:
            counts[pos.ledger_id] = counts.get(pos.ledger_id, 0) + 1

        def gone(lid: int) -> bool:
            return lid != current and (
                lid < target.ledger_id
                or (lid == target.ledger_id and counts[lid] <= target.entry_id)
            )

        expected = sorted(lid for lid in counts if gone(lid))
        deleted = self.ml.trim(target)
        # Ledgers left empty by a restart are not in the model; only compare non-empty ones.
        assert sorted(lid for lid in deleted if lid in counts) == expected
        self.model = [(p, d) for p, d in self.model if not gone(p.ledger_id)]

    async def check(self, start_index: int, max_entries: int) -> None:
        ml: ManagedLedger = self.ml
        model = self.model
        got = await ml.read_entries(EARLIEST, 10**6)
        assert [(e.position, e.data) for e in got] == model
        assert ml.number_of_entries == len(model)
        assert ml.total_size == sum(len(d) for _, d in model)
        assert ml.count_entries(EARLIEST, LATEST) == len(model)
        assert ml.first_position == (model[0][0] if model else None)
        if model:
            assert ml.last_add_confirmed == model[-1][0]
            i = min(start_index, len(model) - 1)
            got = await ml.read_entries(model[i][0], max_entries)
            assert [(e.position, e.data) for e in got] == model[i : i + max_entries]
            assert ml.count_entries(model[i][0], model[-1][0]) == len(model) - i
            # next_position and previous_position walk the model exactly.
            for (a, _), (b, _) in pairwise(model):
                assert ml.next_position(a) == b
                assert ml.previous_position(b) == a

    async def close(self) -> None:
        await self.storage.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    program=ops,
    max_entries=st.integers(1, 5),
    cache=st.sampled_from([0, 300, 1 << 20]),
)
def test_managed_ledger_agrees_with_list_model(
    program: list[tuple[str, int, bool]], max_entries: int, cache: int
) -> None:
    config = StorageConfig(
        journal_sync_data=False,
        max_entries_per_ledger=max_entries,
        cache_size_bytes=cache,
        max_open_segments=2,
    )

    async def main(path: Path) -> None:
        h = Harness(path, config)
        try:
            for op, a, b in program:
                if op == "append":
                    h.append(a)
                    if b:
                        await h.settle()
                elif op == "read":
                    await h.settle()
                    await h.check(a, b)
                elif op == "trim":
                    await h.settle()
                    h.trim(a)
                elif op in ("reopen", "crash"):
                    await h.reopen(crash=op == "crash")
            await h.settle()
            await h.check(0, 5)
            await h.reopen(crash=False)
            await h.check(0, 5)
        finally:
            await h.close()

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(Path(tmp)))
