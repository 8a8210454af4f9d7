"""The bug zoo (:mod:`tests.sim.zoo`): each of Pulsar's historical Key_Shared bugs, put back into
our dispatcher, is caught by the seeded simulation within the seeds ``make test`` runs.

Each test runs the fault's seeds from 0 until one fails with the property the bug breaks (a
bounded, fixed list: deterministic) and checks that the same seed replays the same failure, and
that the same seed passes once the fault is out again.
"""

from __future__ import annotations

import pytest

from tests.sim.conftest import DEFAULT_SEEDS
from tests.sim.simulator import SimFailure, run_seed
from tests.sim.zoo import ZOO, Fault, first_catch


@pytest.mark.parametrize("fault", ZOO, ids=[f.name for f in ZOO])
def test_the_simulation_catches(fault: Fault) -> None:
    found = first_catch(fault, fault.seeds(0, DEFAULT_SEEDS))
    assert found is not None, f"{fault.name} ({fault.issues}) not caught in {DEFAULT_SEEDS} seeds"
    seed, _, failure = found
    with fault.installed(), pytest.raises(SimFailure) as again:
        run_seed(seed, trace=False)
    assert again.value.message.splitlines()[0] == failure.message.splitlines()[0]
    run_seed(seed, trace=False)  # without the fault the same schedule holds
