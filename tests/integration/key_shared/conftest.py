"""Fixtures of the Key_Shared scenarios: brokers per dispatcher implementation and settings.

Pulsar runs its KeySharedSubscriptionTest once per implementation (PIP-379 and CLASSIC); so do
we: the ``impl`` fixture gives each scenario both, the classic one marked ``classic``. Brokers
are started once per (implementation, settings) and shared by the scenarios that need them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pulsar
import pytest

from tests.broker_process import BrokerProcess
from tests.integration.conftest import make_client
from tests.integration.key_shared.helpers import KeySharedEnv

IMPLS = [
    pytest.param("pip379", id="pip379"),
    pytest.param("classic", id="classic", marks=pytest.mark.classic),
]

CLASSIC_CONF = {"subscriptionKeySharedUseClassicPersistentImplementation": "true"}


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker of the classic-dispatcher variants."""
    config.addinivalue_line(
        "markers", "classic: runs on the classic (PIP-282) Key_Shared dispatcher"
    )


class BrokerPool:
    """Brokers started on demand, one per (implementation, extra settings)."""

    def __init__(self) -> None:
        self._brokers: dict[tuple[str, tuple[tuple[str, str], ...]], BrokerProcess] = {}

    def get(self, impl: str, conf: Mapping[str, object] | None = None) -> BrokerProcess:
        """A running broker of ``impl`` with ``conf`` on top of the defaults."""
        extra = {
            k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in (conf or {}).items()
        }
        key = (impl, tuple(sorted(extra.items())))
        b = self._brokers.get(key)
        if b is None:
            full = dict(CLASSIC_CONF) if impl == "classic" else {}
            full.update(extra)
            b = BrokerProcess(conf=full)
            b.start()
            self._brokers[key] = b
        return b

    def close(self) -> None:
        """Stop every broker."""
        for b in self._brokers.values():
            b.close()


@pytest.fixture(scope="session")
def broker_pool() -> Iterator[BrokerPool]:
    """The session's Key_Shared brokers."""
    pool = BrokerPool()
    yield pool
    pool.close()


@pytest.fixture(params=IMPLS)
def impl(request: pytest.FixtureRequest) -> str:
    """The dispatcher implementation under test."""
    return str(request.param)


def open_env(pool: BrokerPool, impl: str, conf: Mapping[str, object] | None = None) -> KeySharedEnv:
    """A scenario environment on the broker for ``impl`` and ``conf``."""
    broker = pool.get(impl, conf)
    return KeySharedEnv(broker=broker, client=make_client(broker.service_url), impl=impl)


@pytest.fixture
def env(broker_pool: BrokerPool, impl: str) -> Iterator[KeySharedEnv]:
    """A fresh topic and client on the default broker of ``impl``."""
    e = open_env(broker_pool, impl)
    yield e
    e.close()
    e.client.close()


@pytest.fixture
def env379(broker_pool: BrokerPool) -> Iterator[KeySharedEnv]:
    """As ``env``, for the scenarios Pulsar runs on PIP-379 only."""
    e = open_env(broker_pool, "pip379")
    yield e
    e.close()
    e.client.close()


@pytest.fixture
def make_env(broker_pool: BrokerPool) -> Iterator[object]:
    """``make_env(impl, conf)``: an environment on a broker with special settings."""
    opened: list[KeySharedEnv] = []

    def make(impl: str, conf: Mapping[str, object] | None = None) -> KeySharedEnv:
        e = open_env(broker_pool, impl, conf)
        opened.append(e)
        return e

    yield make
    for e in opened:
        e.close()
        e.client.close()


__all__ = ["IMPLS", "BrokerPool", "pulsar"]
