"""Suite-wide test set-up."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

# Wall-clock deadlines and "too slow" checks fail on a loaded 2-core CI machine without
# saying anything about the code; a failure prints the blob that replays it exactly.
settings.register_profile(
    "keyshared",
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("keyshared")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the Spark tests on one xdist worker: they share one SparkSession (one JVM)."""
    for item in items:
        if "/tests/spark/" in str(item.path):
            item.add_marker(pytest.mark.xdist_group("spark"))
