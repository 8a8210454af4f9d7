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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the Spark tests on one xdist worker: they share one SparkSession (one JVM).

    First among the hooks: xdist's own reads the xdist_group marks to group the items, and a
    conftest's hook otherwise runs after it, when the mark comes too late.
    """
    for item in items:
        if "/tests/spark/" in str(item.path):
            item.add_marker(pytest.mark.xdist_group("spark"))
