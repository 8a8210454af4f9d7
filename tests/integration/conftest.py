"""Fixtures: a real broker process and official pulsar-client clients."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pulsar
import pytest

from tests.broker_process import BrokerProcess, quiet_logger


@pytest.fixture(scope="session")
def broker() -> Iterator[BrokerProcess]:
    """One broker shared by the tests that do not restart it."""
    b = BrokerProcess()
    b.start()
    yield b
    b.close()


@pytest.fixture
def fresh_broker() -> Iterator[BrokerProcess]:
    """A broker of this test's own (for restarts, crashes and special configuration)."""
    b = BrokerProcess()
    yield b
    b.close()


def make_client(url: str, **kwargs: Any) -> pulsar.Client:
    """An official client with short timeouts and quiet logging."""
    kwargs.setdefault("operation_timeout_seconds", 10)
    kwargs.setdefault("connection_timeout_ms", 5000)
    return pulsar.Client(url, logger=quiet_logger(), **kwargs)


@pytest.fixture
def client(broker: BrokerProcess) -> Iterator[pulsar.Client]:
    """A client of the shared broker."""
    c = make_client(broker.service_url)
    yield c
    c.close()


@pytest.fixture
def topic() -> str:
    """A fresh topic name."""
    return f"persistent://public/default/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Fresh names with a prefix."""
    return lambda prefix: f"{prefix}-{uuid.uuid4().hex[:8]}"
