"""Which seeds the simulation runs, from the environment.

* default: seeds ``0 .. 14999``, in chunks of :data:`CHUNK` (one test each, so progress shows
  and no single test nears the suite's timeout); about 10,000 of them run the PIP-379
  dispatcher (the same schedules as when all 10,000 seeds did) and 5,000 the classic one;
* ``SIM_SEEDS=N``: seeds ``SIM_START .. SIM_START+N-1`` (``SIM_START`` defaults to 0);
* ``SIM_CHUNKS=growing``: the seeds in chunks of 10, 40, then 50 (``make mutate``:
  a test runner that runs the fastest tests first then reaches the first seeds, which catch most
  broken code, in a second, not after 500 seeds);
* ``SIM_SEED=S``: that one seed (replaying a failure), traced;
* ``SIM_STEPS=K``: every seed's schedule cut to its first ``K`` steps (shrinking by hand);
* ``SIM_DISPATCHER=classic`` (or ``pip379``): of those seeds, only the ones that draw that
  dispatcher (about a third of the seeds draw classic: ``simulator.is_classic``). A seed's
  dispatcher is fixed by the seed, so ``SIM_SEED=S`` alone replays it.
"""

from __future__ import annotations

import os

import pytest

DEFAULT_SEEDS = 15_000
CHUNK = 500


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else None


def seed_chunks() -> list[range]:
    """The seeds to run, split in chunks."""
    one = _env_int("SIM_SEED")
    if one is not None:
        return [range(one, one + 1)]
    count = _env_int("SIM_SEEDS")
    start = _env_int("SIM_START") or 0
    total = DEFAULT_SEEDS if count is None else count
    stop = start + total
    if os.environ.get("SIM_CHUNKS", "").strip() == "growing":
        out: list[range] = []
        s = start
        for size in (10, 40):
            if s < stop:
                out.append(range(s, min(s + size, stop)))
                s += size
        # 50, not 500: mutmut's traced first run of a chunk must stay within pytest-timeout
        # (120 s) on a machine loaded 20 and more.
        return out + [range(a, min(a + 50, stop)) for a in range(s, stop, 50)]
    return [range(s, min(s + CHUNK, stop)) for s in range(start, stop, CHUNK)]


def sim_steps() -> int | None:
    """The ``SIM_STEPS`` override, if any."""
    return _env_int("SIM_STEPS")


def sim_dispatcher() -> str | None:
    """The ``SIM_DISPATCHER`` filter: ``classic``, ``pip379`` or None (both)."""
    raw = os.environ.get("SIM_DISPATCHER", "").strip().lower()
    if raw not in ("", "classic", "pip379"):
        raise ValueError(f"SIM_DISPATCHER={raw!r}: want classic or pip379")
    return raw or None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``seeds`` with the chunks chosen by the environment."""
    if "seeds" in metafunc.fixturenames:
        chunks = seed_chunks()
        metafunc.parametrize(
            "seeds",
            chunks,
            ids=[f"{c.start}-{c.stop - 1}" if len(c) > 1 else str(c.start) for c in chunks],
        )
