"""Pulsar topic names: ``persistent://tenant/namespace/local`` and the short forms clients use."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from keyshared.broker.errors import BrokerError, ServerError

PARTITION_SUFFIX = "-partition-"
_PARTITION_RE = re.compile(r"^(.*)-partition-(\d+)$")
_VALID_PART = re.compile(r"^[-=:.\w]+$")


class InvalidTopicName(ValueError):
    """The text is not a valid Pulsar topic name."""


@dataclass(frozen=True, slots=True)
class TopicName:
    """A parsed, fully qualified topic name."""

    domain: str
    tenant: str
    namespace: str
    local_name: str
    full: str = field(init=False, repr=False, compare=False)
    """``persistent://tenant/namespace/local``: made once, read on every publish (the rate
    limits, the stats) and by most of the broker's maps."""

    def __post_init__(self) -> None:
        full = f"{self.domain}://{self.tenant}/{self.namespace}/{self.local_name}"
        object.__setattr__(self, "full", full)

    @classmethod
    def parse(cls, text: str) -> TopicName:
        """Parse a full (``persistent://t/ns/x``) or short (``x``, ``t/ns/x``) topic name."""
        if "://" in text:
            domain, _, rest = text.partition("://")
        else:
            domain, rest = "persistent", text
            if "/" not in rest:
                rest = f"public/default/{rest}"
        if domain not in ("persistent", "non-persistent"):
            raise InvalidTopicName(f"Invalid topic domain {domain!r} in {text!r}")
        parts = rest.split("/")
        if len(parts) != 3 or not all(parts):
            raise InvalidTopicName(f"Invalid topic name {text!r}: expected tenant/namespace/topic")
        tenant, namespace, local = parts
        for part in (tenant, namespace, local):
            if not _VALID_PART.match(part):
                raise InvalidTopicName(f"Invalid character in topic name {text!r}")
        return cls(domain, tenant, namespace, local)

    @property
    def namespace_name(self) -> str:
        """``tenant/namespace``."""
        return f"{self.tenant}/{self.namespace}"

    @property
    def partition_index(self) -> int:
        """The partition index for ``...-partition-N`` names, else -1."""
        m = _PARTITION_RE.match(self.local_name)
        return int(m.group(2)) if m else -1

    @property
    def partitioned_base(self) -> TopicName:
        """The partitioned topic this partition belongs to (itself when not a partition)."""
        m = _PARTITION_RE.match(self.local_name)
        if not m:
            return self
        return TopicName(self.domain, self.tenant, self.namespace, m.group(1))

    def partition(self, index: int) -> TopicName:
        """The name of partition ``index`` of this topic."""
        return TopicName(
            self.domain, self.tenant, self.namespace, f"{self.local_name}{PARTITION_SUFFIX}{index}"
        )

    def __str__(self) -> str:
        return self.full


def check_partition_index(name: TopicName, partitions: int) -> None:
    """Refuse ``...-partition-N`` of a partitioned topic with ``partitions`` <= N: it would be
    auto-created as a stray topic (Pulsar's BrokerService.getTopic refuses it so)."""
    if partitions > 0 and name.partition_index >= partitions:
        raise BrokerError(
            ServerError.NotAllowedError,
            f"Illegal topic partition name {name} with max allowed {partitions} partitions",
        )
