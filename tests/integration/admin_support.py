"""Helpers for the admin REST tests: raw responses with headers, paths, fresh namespaces."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

from tests.broker_process import BrokerProcess


def raw(
    broker: BrokerProcess, method: str, path: str, body: Any = None
) -> tuple[int, dict[str, str], bytes]:
    """One call; (status, headers with lower-case names, body bytes)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(broker.web_url + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()


def ok(broker: BrokerProcess, method: str, path: str, body: Any = None) -> Any:
    """One call that must succeed; its parsed answer."""
    status, answer = broker.admin(method, path, body)
    assert 200 <= status < 300, (method, path, status, answer)
    return answer


def tpath(topic: str, *rest: str) -> str:
    """``/admin/v2/persistent/t/ns/x/...`` for ``persistent://t/ns/x``."""
    return "/".join(["/admin/v2/persistent/" + topic[len("persistent://") :], *rest])


def new_namespace(broker: BrokerProcess) -> str:
    """A fresh ``tenant/namespace`` (new tenant too)."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    ok(broker, "PUT", f"/admin/v2/tenants/{tenant}", {"adminRoles": [], "allowedClusters": []})
    ok(broker, "PUT", f"/admin/v2/namespaces/{tenant}/ns")
    return f"{tenant}/ns"


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``check`` until it holds (True) or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()
