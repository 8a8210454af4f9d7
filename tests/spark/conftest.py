"""Fixtures of the Spark tests: ONE local SparkSession and one broker for the whole run.

The whole directory is skipped when pyspark, pyarrow or a Java runtime is missing.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any, TypeVar

import pytest

from tests.broker_process import BrokerProcess, quiet_logger

_MISSING = [m for m in ("pyspark", "pyarrow") if importlib.util.find_spec(m) is None]
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    _MISSING.append("java")
if _MISSING:
    collect_ignore_glob = ["test_*.py"]

BROKER_CONF = {
    # Small ledgers so that reads cross ledger boundaries.
    "managedLedgerMaxEntriesPerLedger": 40,
    # Keep what no subscription holds (the default deletes closed ledgers within a second).
    "defaultRetentionTimeInMinutes": -1,
    "defaultRetentionSizeInMB": -1,
}


# Every JVM of the Spark tests (the local session's, and the cluster test's master, worker,
# driver and executor) compiles with C1 only and collects with the serial collector. The jobs
# are seconds of small data, where C2's compile threads and the parallel collector's threads
# only take the CPU from everything else on two cores: 31 % less CPU for this directory run
# alone (283 s to 192 s, 179 s to 151 s wall). `JDK_JAVA_OPTIONS` reaches every `java` launch,
# also those that spark-submit and the standalone daemons make.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
M = TypeVar("M", bound=MutableMapping[str, str])


def jvm_env(env: M) -> M:
    """``env`` with :data:`JVM_OPTIONS` added to any ``JDK_JAVA_OPTIONS`` it already has."""
    own = env.get("JDK_JAVA_OPTIONS", "")
    if JVM_OPTIONS not in own:
        env["JDK_JAVA_OPTIONS"] = f"{own} {JVM_OPTIONS}".strip()
    return env


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Spark tests get 5 minutes each (the first one also starts the JVM)."""
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.timeout(300))


@pytest.fixture(autouse=True)
def _spark_group_holds(request: pytest.FixtureRequest) -> None:
    """Under ``--dist loadgroup`` (``make test``) each Spark test must carry its xdist group.

    Without it the tests spread over both workers and each starts its own JVM: slower, twice
    the memory, and nothing else says so (a pytest upgrade once dropped every group silently).
    """
    if getattr(request.config.option, "loadgroup", False):
        assert request.node.nodeid.endswith("@spark"), (
            f"{request.node.nodeid} is not in the 'spark' xdist group: see tests/conftest.py"
        )


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The one SparkSession of the test run (``local[2]``)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    # Set before the session's JVM starts (pyspark launches it with this process's environment).
    jvm_env(os.environ)
    from keyshared.spark.session import get_session

    session = get_session(
        "local[2]",
        "keyshared-tests",
        {"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "1g"},
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def broker() -> Iterator[BrokerProcess]:
    """One broker for the Spark tests."""
    b = BrokerProcess(conf=BROKER_CONF)
    b.start()
    yield b
    b.close()


@pytest.fixture(scope="session")
def dedup_broker() -> Iterator[BrokerProcess]:
    """A broker with message deduplication on, for the exactly-once sink.

    Kept apart from ``broker``: with deduplication on, the client's key-based batching of
    interleaved keys sends overlapping sequence-id ranges, and the later batch is taken for a
    duplicate (apache/pulsar#15413, fsprojects/pulsar-client-dotnet#367).
    """
    b = BrokerProcess(conf={**BROKER_CONF, "brokerDeduplicationEnabled": "true"})
    b.start()
    yield b
    b.close()


@pytest.fixture(scope="session")
def client(broker: BrokerProcess) -> Iterator[Any]:
    """An official client of the broker."""
    import pulsar

    c = pulsar.Client(broker.service_url, logger=quiet_logger(), operation_timeout_seconds=10)
    yield c
    c.close()


@pytest.fixture(scope="session")
def client_factory() -> Iterator[Callable[[BrokerProcess], Any]]:
    """Clients of any broker, closed at the end of the run."""
    import pulsar

    clients: dict[int, Any] = {}

    def make(b: BrokerProcess) -> Any:
        if b.port not in clients:
            clients[b.port] = pulsar.Client(
                b.service_url, logger=quiet_logger(), operation_timeout_seconds=10
            )
        return clients[b.port]

    yield make
    for c in clients.values():
        c.close()


@pytest.fixture
def new_topic() -> Callable[[str], str]:
    """Fresh topic names: ``new_topic("orders")``."""
    return lambda prefix: f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:8]}"


def produce(
    client: Any,
    topic: str,
    n: int,
    *,
    keys: int = 7,
    batching: bool | str = True,
    props: bool = False,
    size: int = 0,
    prefix: str = "k",
) -> list[tuple[str, bytes]]:
    """Send ``n`` keyed messages ``<key>:<seq within key>``; returns (key, value) in send order.

    ``batching``: True (key-based), ``"default"`` (mixed keys per batch; safe with broker
    deduplication) or False.
    """
    import pulsar

    kw: dict[str, Any] = {"block_if_queue_full": True}
    if batching:
        kind = (
            pulsar.BatchingType.Default if batching == "default" else pulsar.BatchingType.KeyBased
        )
        kw.update(batching_enabled=True, batching_type=kind, batching_max_publish_delay_ms=5)
    producer = client.create_producer(topic, **kw)
    seq: dict[str, int] = {}
    sent: list[tuple[str, bytes]] = []
    pad = b"x" * size
    for i in range(n):
        key = f"{prefix}{i % keys}"
        seq[key] = seq.get(key, 0) + 1
        value = f"{key}:{seq[key]}".encode() + pad
        extra: dict[str, Any] = {}
        if props:
            extra["properties"] = {"i": str(i)}
            extra["event_timestamp"] = 1_700_000_000_000 + i
            if key.endswith("0"):  # a key's messages all have it, else batching reorders
                extra["ordering_key"] = f"o{key}"
        producer.send_async(value, None, partition_key=key, **extra)
        sent.append((key, value))
    producer.flush()
    producer.close()
    return sent


def admin_path(topic: str) -> str:
    """``persistent://t/ns/x`` to ``/admin/v2/persistent/t/ns/x``."""
    return "/admin/v2/" + topic.replace("://", "/")


def seq_of(value: bytes) -> tuple[str, int]:
    """``b"k3:17xxx"`` to ``("k3", 17)``."""
    head = value.rstrip(b"x").decode()
    key, _, n = head.partition(":")
    return key, int(n)
