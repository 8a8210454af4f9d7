"""An admin path or method keyshared does not implement is answered with a reason naming it."""

from __future__ import annotations

import pytest

from tests.broker_process import BrokerProcess

pytestmark = pytest.mark.integration


def test_unimplemented_admin_path_is_named(broker: BrokerProcess) -> None:
    status, body = broker.admin("GET", "/admin/v2/namespaces/public/default/backlogQuotaMap")
    assert status == 404
    assert body == {
        "reason": "Not implemented by keyshared: GET "
        "/admin/v2/namespaces/public/default/backlogQuotaMap"
    }
    status, body = broker.admin("POST", "/admin/v2/functions/public/default/f", {})
    assert status == 404 and "POST /admin/v2/functions/public/default/f" in body["reason"]


def test_unimplemented_method_is_named(broker: BrokerProcess) -> None:
    status, body = broker.admin("PATCH", "/admin/v2/clusters")
    assert status == 405
    assert body == {"reason": "Method not allowed by keyshared: PATCH /admin/v2/clusters"}
