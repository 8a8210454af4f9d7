"""Geo-replication, Pulsar's way: each persistent topic of a namespace whose
``replication_clusters`` name other clusters is forwarded to them over the public binary
protocol (see :mod:`.replicator`), so the remote may be a keyshared broker or Apache Pulsar."""

from keyshared.broker.replication.decisions import (
    REPLICATOR_PREFIX,
    dedup_producer_name,
    is_replicator_producer,
    remote_clusters,
)
from keyshared.broker.replication.policy import (
    TOPIC_REPLICATION_FIELD,
    effective_replication_clusters,
    replicated_topics,
)
from keyshared.broker.replication.topic_replication import (
    TopicReplication,
    merge_replication_stats,
)

__all__ = [
    "REPLICATOR_PREFIX",
    "TOPIC_REPLICATION_FIELD",
    "TopicReplication",
    "dedup_producer_name",
    "effective_replication_clusters",
    "is_replicator_producer",
    "merge_replication_stats",
    "remote_clusters",
    "replicated_topics",
]
