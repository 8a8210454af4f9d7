"""Which clusters a topic replicates to: its own ``replicationClusters`` topic policy, else its
namespace's ``replication_clusters``, else only the local cluster (Pulsar's resolution)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from keyshared.broker.policies import NAMESPACES_PREFIX, TOPIC_POLICIES_PREFIX
from keyshared.broker.replication.decisions import remote_clusters
from keyshared.broker.topic_name import InvalidTopicName, TopicName

if TYPE_CHECKING:
    from keyshared.broker.service import BrokerService

TOPIC_REPLICATION_FIELD = "replicationClusters"
"""The field of Pulsar's ``TopicPolicies`` (stored with the topic's other policies)."""
NAMESPACE_REPLICATION_FIELD = "replication_clusters"
"""The field of Pulsar's namespace ``Policies``."""


def effective_replication_clusters(service: BrokerService, name: TopicName) -> list[str]:
    """The clusters ``name`` is replicated among, the local one included (a partition follows
    its partitioned topic's policy unless it has its own)."""
    policies = service.policies
    for level in dict.fromkeys((name.full, name.partitioned_base.full)):
        value = policies.topic(level).get(TOPIC_REPLICATION_FIELD)
        if value:
            return sorted(str(c) for c in value)
    record = policies.namespace(name.namespace_name) or {}
    value = record.get(NAMESPACE_REPLICATION_FIELD)
    return sorted(str(c) for c in value) if value else [service.config.clusterName]


def replicated_topics(service: BrokerService) -> list[TopicName]:
    """Every persistent topic (partitions one by one) whose policies name another cluster."""
    local = service.config.clusterName
    found: dict[str, TopicName] = {}
    for key, raw in service.storage.metadata.items(NAMESPACES_PREFIX):
        record = _json(raw)
        if remote_clusters(record.get(NAMESPACE_REPLICATION_FIELD), local):
            for full in service.list_topics(key[len(NAMESPACES_PREFIX) :]):
                found.setdefault(full, TopicName.parse(full))
    for key, raw in service.storage.metadata.items(TOPIC_POLICIES_PREFIX):
        if not remote_clusters(_json(raw).get(TOPIC_REPLICATION_FIELD), local):
            continue
        try:
            name = TopicName.parse(key[len(TOPIC_POLICIES_PREFIX) :])
        except InvalidTopicName:
            continue
        if name.domain != "persistent":
            continue
        partitions = service.partitions_of(name)
        for part in [name.partition(i) for i in range(partitions)] if partitions else [name]:
            if service.topic_exists(part):
                found.setdefault(part.full, part)
    return list(found.values())


def _json(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
