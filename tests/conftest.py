"""Suite-wide test set-up."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, settings

# Wall-clock deadlines and "too slow" checks fail on a loaded 2-core CI machine without
# saying anything about the code; a failure prints the blob that replays it exactly.
settings.register_profile(
    "keyshared",
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
# `make mutate` needs only whether a property fails, not its smallest example: shrinking a
# failure a mutant causes took minutes of a mutant's run on a loaded machine.
settings.register_profile(
    "mutate",
    parent=settings.get_profile("keyshared"),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    print_blob=False,
)
settings.load_profile(os.environ.get("KEYSHARED_HYPOTHESIS_PROFILE", "keyshared"))


# `make mutate`: a mutant that makes a fast unit test wait forever (a read that should return at
# once waits for entries) is cut after this, not after the limit in pyproject.toml, which the
# simulator's seed chunks and the property tests need (and which mutmut's own wall-clock limit,
# thirty times every calling test's time, leaves to act first). A unit test takes a second or
# less here, ten at most on a loaded machine.
UNIT_TEST_TIMEOUT_UNDER_MUTATION = 30


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the Spark tests on one xdist worker: they share one SparkSession (one JVM). Under
    a mutant, cap each plain unit test (not a property test) at 30 s.

    First among the hooks: xdist's own reads the xdist_group marks to group the items, and a
    conftest's hook otherwise runs after it, when the mark comes too late.
    """
    # mutmut names the mutant a forked run tests here; its other runs (stats, clean) have none.
    under_mutant = "__mutmut_" in os.environ.get("MUTANT_UNDER_TEST", "")
    for item in items:
        if "/tests/spark/" in str(item.path):
            item.add_marker(pytest.mark.xdist_group("spark"))
        if (
            under_mutant
            and "/tests/unit/" in str(item.path)
            and not getattr(getattr(item, "obj", None), "is_hypothesis_test", False)
            and item.get_closest_marker("timeout") is None
        ):
            item.add_marker(pytest.mark.timeout(UNIT_TEST_TIMEOUT_UNDER_MUTATION))
