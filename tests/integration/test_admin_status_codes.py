"""Admin status codes: an unimplemented path or method is named; missing things are 404 and
existing ones 409, as in Pulsar."""

from __future__ import annotations

import uuid

import pytest

from tests.broker_process import BrokerProcess

pytestmark = pytest.mark.integration


def test_unimplemented_admin_path_is_named(broker: BrokerProcess) -> None:
    # Tiered storage is not part of keyshared.
    status, body = broker.admin("GET", "/admin/v2/namespaces/public/default/offloadPolicies")
    assert status == 404
    assert body == {
        "reason": "Not implemented by keyshared: GET "
        "/admin/v2/namespaces/public/default/offloadPolicies"
    }
    status, body = broker.admin("POST", "/admin/v2/functions/public/default/f", {})
    assert status == 404 and "POST /admin/v2/functions/public/default/f" in body["reason"]


def test_unimplemented_method_is_named(broker: BrokerProcess) -> None:
    status, body = broker.admin("PATCH", "/admin/v2/clusters")
    assert status == 405
    assert body == {"reason": "Method not allowed by keyshared: PATCH /admin/v2/clusters"}


@pytest.mark.parametrize(
    "policy, body",
    [
        ("subscriptionTypesEnabled", ["Shared"]),
        ("compactionThreshold", 10),
        ("dispatcherPauseOnAckStatePersistent", True),
        ("deduplicationEnabled", True),
    ],
)
def test_policies_of_a_missing_topic_are_404(
    broker: BrokerProcess, policy: str, body: object
) -> None:
    path = f"/admin/v2/persistent/public/default/missing-{uuid.uuid4().hex[:8]}/{policy}"
    assert broker.admin("POST", path, body) == (404, {"reason": "Topic not found"})
    assert broker.admin("GET", path) == (404, {"reason": "Topic not found"})
    assert broker.admin("DELETE", path) == (404, {"reason": "Topic not found"})


def test_existing_is_409_and_missing_is_404(broker: BrokerProcess) -> None:
    topic = f"/admin/v2/persistent/public/default/t-{uuid.uuid4().hex[:8]}"
    assert broker.admin("PUT", "/admin/v2/tenants/public", {})[0] == 409
    assert broker.admin("PUT", "/admin/v2/namespaces/public/default")[0] == 409
    assert broker.admin("PUT", topic)[0] == 204
    assert broker.admin("PUT", topic)[0] == 409
    assert broker.admin("PUT", topic + "/subscription/s")[0] == 204
    assert broker.admin("PUT", topic + "/subscription/s")[0] == 409
    assert broker.admin("DELETE", "/admin/v2/tenants/no-such")[0] == 404
    assert broker.admin("DELETE", "/admin/v2/namespaces/public/no-such")[0] == 404
    assert broker.admin("PUT", "/admin/v2/persistent/public/no-such/t")[0] == 404
    assert broker.admin("DELETE", topic + "-missing")[0] == 404
    assert broker.admin("DELETE", topic + "/subscription/missing")[0] == 404
    assert broker.admin("DELETE", topic)[0] == 204
