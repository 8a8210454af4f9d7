"""Draining-tracker cases the simulator cannot see: each kills mutants that survived ``make
mutate`` (bench/results/mutation/report.md)."""

from __future__ import annotations

import pytest

from keyshared.broker.dispatch.draining import DrainingHashesTracker


@pytest.mark.parametrize("call", ["add_entry", "may_add_pending_ack"])
def test_hash_zero_is_refused_with_pulsars_message(call: str) -> None:
    tracker: DrainingHashesTracker[str] = DrainingHashesTracker(name="sub")
    with pytest.raises(ValueError) as err:
        getattr(tracker, call)("c1", 0)
    assert str(err.value) == "Sticky hash cannot be 0"
