"""Schemathesis against the live broker's OpenAPI document: no request gets a server error.

Every operation of ``/openapi.json`` is fuzzed with a bounded number of generated requests.
Half of the generated requests have their path names swapped for ones that exist (a tenant,
namespace, topic with messages, partitioned topic and subscription, re-created before each
operation), so the handlers behind the existence checks — skip, reset-cursor, peek, examine,
retention, partitions — run with hostile numbers and bodies too.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pulsar
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.broker_process import BrokerProcess, quiet_logger

pytestmark = pytest.mark.integration

MAX_EXAMPLES = 8
BUDGET_SECONDS = 55.0
KNOWN = {
    "tenant": "fuzz",
    "namespace": "ns",
    "topic": "t",
    "subName": "s",
    "subscriptionName": "s",
    "subscription": "s",
    "role": "fuzz-role",
}


@pytest.fixture(scope="module")
def fuzz_broker() -> Iterator[BrokerProcess]:
    """A broker of this module's own: the fuzzer deletes and unloads what it finds."""
    b = BrokerProcess().start()
    yield b
    b.close()


def _seed(b: BrokerProcess, client: pulsar.Client) -> None:
    """Make the known names exist again (each call tolerates what already exists)."""
    b.admin("PUT", "/admin/v2/tenants/fuzz", {"adminRoles": [], "allowedClusters": []})
    b.admin("PUT", "/admin/v2/namespaces/fuzz/ns")
    b.admin("PUT", "/admin/v2/persistent/fuzz/ns/pt/partitions", 2)
    status, stats = b.admin("GET", "/admin/v2/persistent/fuzz/ns/t/stats")
    if status != 200 or stats.get("msgInCounter", 0) == 0:
        b.admin("PUT", "/admin/v2/persistent/fuzz/ns/t")
        b.admin("PUT", "/admin/v2/persistent/fuzz/ns/t/subscription/s", {"ledgerId": -1})
        producer = client.create_producer("persistent://fuzz/ns/t", batching_enabled=True)
        for i in range(4):
            producer.send_async(f"m{i}".encode(), None, partition_key=f"k{i % 2}")
        producer.flush()
        producer.close()
    b.admin("PUT", "/admin/v2/persistent/fuzz/ns/t/subscription/s", {"ledgerId": -1})


def test_openapi_document_is_served(fuzz_broker: BrokerProcess) -> None:
    """The document lists the Pulsar paths this broker implements."""
    status, doc = fuzz_broker.admin("GET", "/openapi.json")
    assert status == 200
    paths = doc["paths"]
    for path in (
        "/admin/v2/tenants/{tenant}",
        "/admin/v2/namespaces/{tenant}/{namespace}/retention",
        "/admin/v2/persistent/{tenant}/{namespace}/{topic}/subscription/{subName}/resetcursor",
        "/admin/v2/persistent/{tenant}/{namespace}/{topic}/examinemessage",
    ):
        assert path in paths


def test_no_server_error(fuzz_broker: BrokerProcess) -> None:
    """No generated request is answered with a 5xx, and the broker still serves afterwards."""
    base = fuzz_broker.web_url
    schema = schemathesis.openapi.from_url(base + "/openapi.json")
    session = requests.Session()
    client = pulsar.Client(fuzz_broker.service_url, logger=quiet_logger())
    failures: list[str] = []
    deadline = time.monotonic() + BUDGET_SECONDS
    operations = 0
    try:
        for result in schema.get_all_operations():
            op = result.ok()
            if time.monotonic() > deadline:
                break
            operations += 1
            _seed(fuzz_broker, client)
            _fuzz_operation(op, base, session, failures)
    finally:
        client.close()
        session.close()
    assert operations > 40, f"only {operations} operations ran within the budget"
    assert not failures, "\n".join(failures[:20])
    assert fuzz_broker.admin("GET", "/admin/v2/brokers/health") == (200, "ok")


def _fuzz_operation(op: Any, base: str, session: requests.Session, failures: list[str]) -> None:
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=op.as_strategy(), known=st.booleans())
    def run(case: Any, known: bool) -> None:
        if known and case.path_parameters:
            for key in case.path_parameters:
                if key in KNOWN:
                    case.path_parameters[key] = KNOWN[key]
        response = case.call(base_url=base, session=session, timeout=15)
        if response.status_code >= 500:
            failures.append(
                f"{op.method.upper()} {op.path} -> {response.status_code}: "
                f"{response.text[:300]}\n  {case.as_curl_command()}"
            )

    run()
