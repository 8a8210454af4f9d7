"""The seeded schedules: every property of :mod:`tests.sim.simulator` on thousands of seeds.

A failure names the seed and prints the one-line command that replays it
(``SIM_SEED=S .venv/bin/python -m pytest tests/sim -q``) and the end of its trace;
``.venv/bin/python -m tests.sim --seed S --shrink --trace`` finds its shortest failing prefix.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence

import pytest

from tests.sim.conftest import sim_dispatcher, sim_steps
from tests.sim.simulator import SimFailure, is_classic, run_seed

MAX_REPORTED = 3


def test_schedules(seeds: range) -> None:
    """Run each seed; report the first few failures, each with its replay command."""
    steps = sim_steps()
    only = sim_dispatcher()
    chosen: Sequence[int] = (
        seeds if only is None else [s for s in seeds if is_classic(s) == (only == "classic")]
    )
    traced = len(chosen) == 1
    failures: list[str] = []
    # Everything alive now (pytest, the modules) outlives the loop: keep the collector from
    # walking it again for every schedule's garbage.
    gc.freeze()
    try:
        _run(chosen, steps, traced, failures)
    finally:
        gc.unfreeze()
    if failures:
        pytest.fail("\n\n".join(failures), pytrace=False)


def _run(seeds: Sequence[int], steps: int | None, traced: bool, failures: list[str]) -> None:
    for seed in seeds:
        try:
            run_seed(seed, steps, trace=traced)
        except SimFailure as failure:
            report = failure
            if not traced:
                # Replay with the trace on: the same seed takes the same path.
                try:
                    run_seed(seed, steps, trace=True)
                except SimFailure as traced_failure:
                    report = traced_failure
                else:
                    failures.append(
                        f"seed {seed} failed untraced but passed traced: not replayable"
                    )
                    continue
            failures.append(report.render())
            if len(failures) >= MAX_REPORTED:
                break
