"""Fixtures for crash tests: a broker of the test's own, a printed seed, a round budget."""

from __future__ import annotations

import os
import random
from collections.abc import Generator, Iterator

import pytest

from tests.broker_process import BrokerProcess


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Remember whether the test body failed, for the broker fixture's teardown."""
    report = yield
    if report.when == "call":
        item.stash[_FAILED] = report.failed
    return report


_FAILED = pytest.StashKey[bool]()


@pytest.fixture
def crash_seed() -> int:
    """The seed of this test's random choices: CRASH_SEED from the environment, else fresh.

    Printed, so that a failing run shows which seed to replay (the moment of the SIGKILL still
    depends on timing; the seed fixes the delays, sizes and ack patterns).
    """
    seed = int(os.environ.get("CRASH_SEED", random.randrange(1 << 32)))
    print(f"CRASH_SEED={seed}")
    return seed


@pytest.fixture
def crash_rounds() -> int:
    """How many kill/restart rounds the repeated test does (CRASH_ROUNDS, default 17: with the
    other crash tests' kills, the broker is SIGKILLed 20 times in `make test`)."""
    return int(os.environ.get("CRASH_ROUNDS", "17"))


@pytest.fixture
def crash_broker(request: pytest.FixtureRequest) -> Iterator[BrokerProcess]:
    """A started broker with its own data directory; its log is printed if the test fails.

    Retention is infinite: with Pulsar's default (none), a topic without durable subscriptions
    may drop its closed ledgers after a restart, and the audit reads every topic from the start.
    More settings come from indirect parametrization (``request.param``, a dict).
    """
    conf: dict[str, object] = {"defaultRetentionTimeInMinutes": -1, "defaultRetentionSizeInMB": -1}
    conf.update(getattr(request, "param", {}))
    b = BrokerProcess(conf=conf)
    b.start()
    yield b
    if request.node.stash.get(_FAILED, False):
        print("----- broker log (tail) -----")
        print("\n".join(b.log().splitlines()[-80:]))
    b.close()
