"""Topic names and the admin REST calls the Spark side needs (``/admin/v2/...``).

The Spark layer talks to the broker only through the official client and this REST surface, so
the same jobs run against Apache Pulsar.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

_PARTITION_RE = re.compile(r"^(.*)-partition-(\d+)$")


@dataclass(frozen=True, slots=True)
class Topic:
    """A fully qualified topic name split into its parts."""

    domain: str
    tenant: str
    namespace: str
    local: str

    @classmethod
    def parse(cls, text: str) -> Topic:
        """``persistent://t/ns/x``, ``t/ns/x`` or ``x`` (in ``public/default``)."""
        text = text.strip()
        if "://" in text:
            domain, _, rest = text.partition("://")
        else:
            domain, rest = "persistent", text if "/" in text else f"public/default/{text}"
        parts = rest.split("/")
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"invalid topic name {text!r}: expected tenant/namespace/topic")
        return cls(domain, parts[0], parts[1], parts[2])

    @property
    def full(self) -> str:
        """``persistent://tenant/namespace/local``."""
        return f"{self.domain}://{self.tenant}/{self.namespace}/{self.local}"

    @property
    def partition_index(self) -> int:
        """N for ``...-partition-N``, else -1."""
        m = _PARTITION_RE.match(self.local)
        return int(m.group(2)) if m else -1

    @property
    def base(self) -> Topic:
        """The partitioned topic this partition belongs to (itself when not a partition)."""
        m = _PARTITION_RE.match(self.local)
        return Topic(self.domain, self.tenant, self.namespace, m.group(1)) if m else self

    def partition(self, i: int) -> Topic:
        """Partition ``i`` of this partitioned topic."""
        return Topic(self.domain, self.tenant, self.namespace, f"{self.local}-partition-{i}")

    def admin_path(self) -> str:
        """``/admin/v2/persistent/tenant/namespace/local`` (URL-quoted)."""
        q = urllib.parse.quote
        return f"/admin/v2/{self.domain}/{q(self.tenant)}/{q(self.namespace)}/{q(self.local, '')}"


class AdminError(RuntimeError):
    """An admin REST call answered with an error status."""

    def __init__(self, status: int, path: str, body: str) -> None:
        super().__init__(f"admin {path}: HTTP {status}: {body[:300]}")
        self.status = status


class Admin:
    """A minimal client of the broker's admin REST API."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """One request; the parsed JSON answer (None when empty)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as err:
            raise AdminError(err.code, path, err.read().decode(errors="replace")) from None
        return json.loads(raw) if raw else None

    def internal_stats(self, topic: Topic) -> dict[str, Any] | None:
        """``internalStats`` of one (non-partitioned or partition) topic; None if it is absent."""
        try:
            out: dict[str, Any] = self.call("GET", topic.admin_path() + "/internalStats")
        except AdminError as err:
            if err.status == 404:
                return None
            raise
        return out

    def partitions(self, topic: Topic) -> int:
        """The partition count of a partitioned topic, 0 when it is not partitioned."""
        try:
            meta = self.call("GET", topic.admin_path() + "/partitions")
        except AdminError as err:
            if err.status == 404:
                return 0
            raise
        return int((meta or {}).get("partitions", 0))

    def create_partitioned(self, topic: Topic, partitions: int) -> None:
        """Create a partitioned topic (PUT ``.../partitions``)."""
        self.call("PUT", topic.admin_path() + "/partitions", partitions)

    def subscriptions(self, topic: Topic) -> list[str]:
        """The subscriptions of one topic partition."""
        try:
            return list(self.call("GET", topic.admin_path() + "/subscriptions") or [])
        except AdminError as err:
            if err.status == 404:
                return []
            raise

    def list_topics(self, tenant: str, namespace: str) -> list[str]:
        """Every topic (partitions included) of ``tenant/namespace``."""
        q = urllib.parse.quote
        return list(self.call("GET", f"/admin/v2/persistent/{q(tenant)}/{q(namespace)}") or [])

    def list_partitioned(self, tenant: str, namespace: str) -> list[str]:
        """The partitioned topics of ``tenant/namespace``."""
        q = urllib.parse.quote
        path = f"/admin/v2/persistent/{q(tenant)}/{q(namespace)}/partitioned"
        return list(self.call("GET", path) or [])


def expand_partitions(topic: Topic, count: int) -> list[Topic]:
    """The partitions of ``topic`` given its partition count (itself when 0)."""
    return [topic.partition(i) for i in range(count)] if count > 0 else [topic]


def match_pattern(admin: Admin, pattern: str) -> list[Topic]:
    """Topics whose full name (or local name) matches ``pattern``, partitions expanded.

    The pattern's namespace is taken from its prefix when it is fully qualified
    (``persistent://public/default/orders-.*``), else ``public/default``.
    """
    if "://" in pattern:
        _, _, rest = pattern.partition("://")
        tenant, namespace = rest.split("/")[:2]
    else:
        tenant, namespace = "public", "default"
    rx = re.compile(pattern)
    bases: set[str] = set()
    for name in admin.list_topics(tenant, namespace) + admin.list_partitioned(tenant, namespace):
        t = Topic.parse(name)
        base = t.base
        if rx.fullmatch(base.full) or rx.fullmatch(base.local):
            bases.add(base.full)
    out: list[Topic] = []
    for name in sorted(bases):
        base = Topic.parse(name)
        out.extend(expand_partitions(base, admin.partitions(base)))
    return out
