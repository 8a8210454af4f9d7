"""A persistent topic's replicators, one per remote cluster its namespace replicates to.

Owned by :class:`~keyshared.broker.topic.PersistentTopic`: it follows the namespace's
``replication_clusters`` (started and stopped as the policy changes; a cluster taken out loses
its cursor, as in Pulsar), hands its cursors to the topic for retention and flushing, and builds
the ``replication`` section of the topic's stats: per remote cluster, the outbound replicator
and the inbound one (the remote's replicator producing here).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from keyshared.broker.client_credentials import ClientCredentials
from keyshared.broker.replication.client import RemoteError
from keyshared.broker.replication.decisions import (
    inbound_cluster,
    remote_clusters,
    replicator_cursor_name,
)
from keyshared.broker.replication.policy import effective_replication_clusters
from keyshared.broker.replication.remote_topic import ensure_remote_topic
from keyshared.broker.replication.replicator import Replicator
from keyshared.broker.replication.tls import RemoteUrls, remote_credentials, remote_urls
from keyshared.broker.topic_common import producer_stats
from keyshared.storage.cursor import ManagedCursor
from keyshared.storage.position import LATEST

if TYPE_CHECKING:
    from keyshared.broker.topic import PersistentTopic

log = logging.getLogger(__name__)


class TopicReplication:
    """The replicators of one persistent topic (see the module docstring)."""

    def __init__(self, topic: PersistentTopic) -> None:
        self.topic = topic
        self.local = topic.config.clusterName
        self.replicators: dict[str, Replicator] = {}
        self._removing: set[asyncio.Future[None]] = set()
        self.update()

    def wanted(self) -> list[str]:
        """The remote clusters this topic replicates to now."""
        if self.topic.name.domain != "persistent":
            return []
        return remote_clusters(
            effective_replication_clusters(self.topic.service, self.topic.name), self.local
        )

    def update(self) -> None:
        """Start replicators for clusters added to the policy, remove those taken out."""
        if self.topic.closed:
            return
        wanted = set(self.wanted())
        for remote in sorted(wanted - set(self.replicators)):
            cursor = self.topic._open_cursor(replicator_cursor_name(remote), True, LATEST)
            rep = Replicator(
                topic=self.topic.name.full,
                local=self.local,
                remote=remote,
                cursor=cursor,
                target=lambda remote=remote: self.target(remote),  # type: ignore[misc]
                keepalive=float(self.topic.config.keepAliveIntervalSeconds),
                prepare=lambda remote=remote: self.prepare_remote(remote),  # type: ignore[misc]
                route=lambda remote=remote: self.urls(remote),  # type: ignore[misc]
            )
            self.replicators[remote] = rep
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                continue  # started by start() once a loop runs
            rep.start()
        for remote in sorted(set(self.replicators) - wanted):
            rep = self.replicators.pop(remote)
            fut = asyncio.ensure_future(_remove(rep))
            self._removing.add(fut)
            fut.add_done_callback(self._removing.discard)

    def start(self) -> None:
        """Start every replicator not running yet."""
        for rep in self.replicators.values():
            rep.start()

    def target(self, remote: str) -> tuple[str, ClientCredentials]:
        """Cluster ``remote``'s ``brokerServiceUrl`` (``brokerServiceUrlTls`` over TLS,
        :mod:`.tls`) and the credentials to present there: its
        ``authenticationPlugin``/``...Parameters``, else the broker's own client's."""
        return self.urls(remote).broker_url, self.credentials(remote)

    def urls(self, remote: str) -> RemoteUrls:
        """Where cluster ``remote`` is reached, and how (:mod:`.tls`)."""
        data = self.topic.service.clusters.get(remote)
        if data is None:
            raise RemoteError(f"cluster {remote} is not registered")
        return remote_urls(remote, data, self.topic.config, self.credentials(remote))

    def credentials(self, remote: str) -> ClientCredentials:
        """What the replicator presents to cluster ``remote`` (with ``AuthenticationTls``, the
        certificate its TLS context presents: :mod:`.tls`)."""
        data = self.topic.service.clusters.get(remote) or {}
        return remote_credentials(remote, data, self.topic.config)

    async def prepare_remote(self, remote: str) -> None:
        """Make this topic exist on ``remote``, shaped as here (:mod:`.remote_topic`), when
        ``createTopicToRemoteClusterForReplication`` is on and the cluster has an admin URL."""
        if not self.topic.config.createTopicToRemoteClusterForReplication:
            return
        urls = self.urls(remote)
        if not urls.admin_url:
            return  # nothing to ask: the producer's own request decides
        creds = self.credentials(remote)
        name = self.topic.name
        partitions = (
            self.topic.service.partitions_of(name.partitioned_base)
            if name.partition_index >= 0
            else 0
        )
        await ensure_remote_topic(urls.admin_url, name, partitions, creds, urls.ssl)

    def cursors(self) -> list[ManagedCursor]:
        """The replicators' durable cursors (they hold data back from retention)."""
        return [r.cursor for r in self.replicators.values()]

    def flush(self) -> None:
        """Persist the cursors' changed state."""
        for cursor in self.cursors():
            if cursor.is_dirty:
                cursor.persist()

    async def close(self) -> None:
        """Stop every replicator and close its cursor (state persisted)."""
        for rep in list(self.replicators.values()):
            await rep.stop()
            rep.cursor.close()

    def delete(self) -> None:
        """The topic is deleted: forget the cursors' stored state."""
        for rep in self.replicators.values():
            rep.cursor.delete()
        self.replicators.clear()

    def stats(self) -> dict[str, Any]:
        """Pulsar's ``ReplicatorStats`` by remote cluster."""
        out: dict[str, Any] = {}
        inbound: dict[str, Any] = {}
        for producer in self.topic.producers.values():
            cluster = inbound_cluster(producer.producer_name, self.local)
            if cluster is not None:
                inbound[cluster] = producer_stats(producer)
        for cluster in sorted(set(self.replicators) | set(inbound)):
            rep = self.replicators.get(cluster)
            st: dict[str, Any] = (
                rep.stats()
                if rep is not None
                else {
                    "msgRateOut": 0.0,
                    "msgThroughputOut": 0.0,
                    "msgRateExpired": 0.0,
                    "replicationBacklog": 0,
                    "connected": False,
                    "replicationDelayInSeconds": 0,
                    "outboundConnection": None,
                    "outboundConnectedSince": None,
                    "msgOutCount": 0,
                    "bytesOutCount": 0,
                }
            )
            p = inbound.get(cluster)
            st["msgRateIn"] = p["msgRateIn"] if p else 0.0
            st["msgThroughputIn"] = p["msgThroughputIn"] if p else 0.0
            st["msgInCount"] = p["msgInCounter"] if p else 0
            st["bytesInCount"] = p["bytesInCounter"] if p else 0
            st["inboundConnection"] = p["address"] if p else None
            st["inboundConnectedSince"] = p["connectedSince"] if p else None
            out[cluster] = st
        return out


async def _remove(rep: Replicator) -> None:
    await rep.stop()
    rep.cursor.delete()


_SUMMED = (
    "msgRateIn",
    "msgThroughputIn",
    "msgRateOut",
    "msgThroughputOut",
    "msgRateExpired",
    "replicationBacklog",
    "msgInCount",
    "bytesInCount",
    "msgOutCount",
    "bytesOutCount",
)


def merge_replication_stats(parts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The ``replication`` section of partitioned stats from its partitions' (as Pulsar's
    ``ReplicatorStatsImpl.add``: sums, ``connected`` only if every partition is, the largest
    delay)."""
    out: dict[str, dict[str, Any]] = {}
    for part in parts:
        for cluster, st in part.items():
            agg = out.get(cluster)
            if agg is None:
                out[cluster] = {
                    k: st.get(k) for k in (*_SUMMED, "connected", "replicationDelayInSeconds")
                }
                continue
            for k in _SUMMED:
                agg[k] = (agg.get(k) or 0) + (st.get(k) or 0)
            agg["connected"] = bool(agg["connected"]) and bool(st.get("connected"))
            agg["replicationDelayInSeconds"] = max(
                agg["replicationDelayInSeconds"] or 0, st.get("replicationDelayInSeconds") or 0
            )
    return out
