"""The broker service: topics by name, partitioned-topic metadata, tenants and namespaces."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from keyshared.broker import backlog_quota, inactive_topics, limits
from keyshared.broker.clusters import ClusterRegistry
from keyshared.broker.dispatch.base import LoopScheduler, Scheduler
from keyshared.broker.entry_meta import EntryMetaCache
from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.nonpersistent_topic import (
    NON_PERSISTENT,
    NonPersistentTopic,
    NonPersistentTopics,
)
from keyshared.broker.policies import NAMESPACES_PREFIX as NAMESPACES_PREFIX  # re-exported
from keyshared.broker.policies import PolicyService
from keyshared.broker.rate_limits import BrokerRateLimits
from keyshared.broker.replication import replicated_topics
from keyshared.broker.replication.subscriptions import snapshot_gauges
from keyshared.broker.schema import SchemaRegistry
from keyshared.broker.topic import PersistentTopic, topic_epoch_key
from keyshared.broker.topic_name import InvalidTopicName, TopicName, check_partition_index
from keyshared.config import BrokerConfig
from keyshared.storage.cursor import CursorPersister
from keyshared.storage.store import Storage

log = logging.getLogger(__name__)

# The periodic pass over the topics yields to the loop after this much work.
_PERIODIC_SLICE_SECONDS = 0.01

PARTITIONS_PREFIX = "partitioned-topics/"
TENANTS_PREFIX = "tenants/"
TOPICS_PREFIX = "topics/"


class BrokerService:
    """Owns every topic of this broker and the metadata about them."""

    def __init__(
        self,
        config: BrokerConfig,
        storage: Storage,
        scheduler: Scheduler | None = None,
        *,
        default_namespace: bool = True,
    ) -> None:
        self.config = config
        self.storage = storage
        self.scheduler: Scheduler = scheduler or LoopScheduler()
        self.topics: dict[str, PersistentTopic] = {}
        # Parsed entry metadata, one bounded cache for every topic (positions are unique in a
        # storage: ledger ids are never reused).
        self.entry_meta_cache = EntryMetaCache()
        self._cursor_persister: CursorPersister | None = None
        # Non-persistent topics live apart: nothing of them is stored or swept periodically.
        self.nonpersistent = NonPersistentTopics(self)
        self.policies = PolicyService(storage.metadata, config)
        self.policies.add_listener(self._policies_changed)
        self.clusters = ClusterRegistry(storage.metadata, config)
        self.schemas = SchemaRegistry(storage.metadata, self.policies)
        self.rate_limits = BrokerRateLimits(config, self.policies, self.scheduler)
        # Broker-wide gauges other layers contribute to /metrics (the server's publish buffer):
        # each callable returns (name, value, help) triples.
        self.broker_gauges: list[Callable[[], list[tuple[str, float, str]]]] = []
        self.broker_gauges.append(lambda: snapshot_gauges(self.topics.values()))
        if default_namespace:
            self.create_default_namespace()

    @property
    def cursor_persister(self) -> CursorPersister:
        """Cursor state saved by acks: one transaction for all cursors per turn of the loop."""
        if self._cursor_persister is None:
            self._cursor_persister = CursorPersister(self.storage.metadata)
        return self._cursor_persister

    def _policies_changed(self) -> None:
        # A changed policy reaches every loaded topic at once (dedup switched, pauses lifted).
        for topic in list(self.topics.values()):
            topic.on_policies_changed()
        self.load_replicated_topics()

    def load_replicated_topics(self) -> None:
        """Load every persistent topic replicated to another cluster (by its namespace or its
        own policy), so that its replicators run with no client attached (after a restart
        too), as Pulsar loads a replicated namespace's topics when it owns them."""
        for name in replicated_topics(self):
            if name.full in self.topics:
                continue
            try:
                self.get_topic(name, create=False)
            except BrokerError as exc:
                log.warning("cannot load replicated topic %s: %s", name, exc)

    # --- tenants and namespaces ------------------------------------------------------------
    def create_default_namespace(self) -> None:
        """Create the ``public`` tenant and ``public/default`` unless they exist.

        As Pulsar's standalone: the tenant is administered by the super users and allowed on
        this cluster. The standalone calls this when its own client may (see
        ``server/broker_client_auth.py``); when it may not, both are left to the operator's
        scripts, whose ``PUT``s would otherwise answer 409 and leave their grants unset."""
        md = self.storage.metadata
        if md.get(TENANTS_PREFIX + "public") is None:
            admins = sorted({r.strip() for r in self.config.superUserRoles.split(",") if r.strip()})
            tenant = {"adminRoles": admins, "allowedClusters": [self.config.clusterName]}
            md.put(TENANTS_PREFIX + "public", _json(tenant))
        if not self.policies.namespace_exists("public/default"):
            self.policies.create_namespace("public/default")

    def namespace_exists(self, namespace: str) -> bool:
        """True if ``tenant/namespace`` exists."""
        return self.policies.namespace_exists(namespace)

    # --- permissions (Pulsar's Policies.auth_policies.namespace_auth) -----------------------
    def tenant_admin_roles(self, tenant: str) -> list[str]:
        """The ``adminRoles`` of ``tenant`` (empty when it does not exist)."""
        info = self.storage.metadata.get_json(TENANTS_PREFIX + tenant)
        roles = info.get("adminRoles") if isinstance(info, dict) else None
        return [r for r in roles if isinstance(r, str)] if isinstance(roles, list) else []

    def tenant_allowed_clusters(self, tenant: str) -> list[str]:
        """The ``allowedClusters`` of ``tenant`` (empty when it does not exist)."""
        info = self.storage.metadata.get_json(TENANTS_PREFIX + tenant)
        found = info.get("allowedClusters") if isinstance(info, dict) else None
        return [c for c in found if isinstance(c, str)] if isinstance(found, list) else []

    def namespace_permissions(self, namespace: str) -> dict[str, list[str]]:
        """``role -> actions`` granted on ``tenant/namespace`` (empty when none or no namespace)."""
        return self.policies.namespace_permissions(namespace)

    def set_namespace_permission(
        self, namespace: str, role: str, actions: list[str] | None
    ) -> None:
        """Grant ``actions`` to ``role`` on ``namespace`` (replacing its grant); None revokes."""
        if not self.policies.set_namespace_permission(namespace, role, actions):
            raise BrokerError(ServerError.TopicNotFound, f"Namespace {namespace} does not exist")

    # --- topics --------------------------------------------------------------------------
    @staticmethod
    def parse_topic(name: str) -> TopicName:
        """Parse a topic name, or raise BrokerError(InvalidTopicName)."""
        try:
            return TopicName.parse(name)
        except InvalidTopicName as exc:
            raise BrokerError(ServerError.InvalidTopicName, str(exc)) from exc

    def partitions_of(self, name: TopicName) -> int:
        """Number of partitions of a partitioned topic (0 for a non-partitioned one)."""
        if name.partition_index >= 0:
            return 0
        raw = self.storage.metadata.get(PARTITIONS_PREFIX + name.full)
        if raw is None:
            return 0
        return int(json.loads(raw)["partitions"])

    def check_partition_name(self, name: TopicName) -> None:
        """Refuse a partition index at or past its partitioned topic's partition count."""
        if name.partition_index >= 0:
            check_partition_index(name, self.partitions_of(name.partitioned_base))

    def create_partitioned_topic(self, name: TopicName, partitions: int) -> None:
        """Create a partitioned topic with ``partitions`` partitions."""
        if partitions <= 0:
            raise BrokerError(ServerError.NotAllowedError, "Number of partitions must be > 0")
        if self.partitions_of(name) > 0:
            raise BrokerError(ServerError.NotAllowedError, f"Partitioned topic {name} exists")
        if self.topic_exists(name):
            raise BrokerError(ServerError.NotAllowedError, f"Topic {name} exists (non-partitioned)")
        self._check_namespace(name)
        self._check_topic_quota(name, partitions)
        self.storage.metadata.put(PARTITIONS_PREFIX + name.full, _json({"partitions": partitions}))

    def update_partitioned_topic(self, name: TopicName, partitions: int) -> None:
        """Grow a partitioned topic (shrinking is refused, as in Pulsar)."""
        current = self.partitions_of(name)
        if current == 0:
            raise BrokerError(ServerError.TopicNotFound, f"Partitioned topic {name} not found")
        if partitions <= current:
            raise BrokerError(ServerError.NotAllowedError, "Number of partitions can only grow")
        self._check_topic_quota(name, partitions - current)
        self.storage.metadata.put(PARTITIONS_PREFIX + name.full, _json({"partitions": partitions}))

    def list_partitioned_topics(self, namespace: str) -> list[str]:
        """Partitioned topics of ``tenant/namespace``."""
        prefix = PARTITIONS_PREFIX + "persistent://" + namespace + "/"
        return [k[len(PARTITIONS_PREFIX) :] for k in self.storage.metadata.list_keys(prefix)]

    def list_topics(self, namespace: str) -> list[str]:
        """Non-partitioned topics and partitions of ``tenant/namespace``."""
        prefix = TOPICS_PREFIX + "persistent://" + namespace + "/"
        return [k[len(TOPICS_PREFIX) :] for k in self.storage.metadata.list_keys(prefix)]

    def topic_exists(self, name: TopicName) -> bool:
        """True if the topic (not a partitioned base) exists."""
        if name.domain == NON_PERSISTENT:
            return self.nonpersistent.loaded(name) is not None
        return (
            name.full in self.topics
            or self.storage.metadata.get(TOPICS_PREFIX + name.full) is not None
        )

    def _check_namespace(self, name: TopicName) -> None:
        if not self.namespace_exists(name.namespace_name):
            raise BrokerError(
                ServerError.TopicNotFound, f"Namespace {name.namespace_name} does not exist"
            )

    def topic_count(self, namespace: str) -> int:
        """Persistent topics of ``namespace`` as Pulsar counts them for
        ``maxTopicsPerNamespace``: every partition of a partitioned topic counts."""
        names = set(self.list_topics(namespace))
        for base in self.list_partitioned_topics(namespace):
            name = TopicName.parse(base)
            names.update(name.partition(i).full for i in range(self.partitions_of(name)))
        return len(names)

    def _check_topic_quota(self, name: TopicName, adding: int) -> None:
        limits.check_topics(
            self.policies, name.namespace_name, self.topic_count(name.namespace_name), adding
        )

    def get_topic(self, name: TopicName, *, create: bool) -> PersistentTopic:
        """The loaded topic ``name``; created on first use if allowed."""
        topic = self.topics.get(name.full)
        if topic is not None:
            return topic
        if name.domain != "persistent":
            raise BrokerError(ServerError.NotAllowedError, "Only persistent topics are supported")
        exists = self.storage.metadata.get(TOPICS_PREFIX + name.full) is not None
        if not exists:
            self.check_partition_name(name)
            if self.partitions_of(name) > 0:
                raise BrokerError(
                    ServerError.NotAllowedError,
                    f"{name} is a partitioned topic: use its partitions",
                )
            base = name.partitioned_base
            is_partition_of_existing = (
                name.partition_index >= 0 and name.partition_index < self.partitions_of(base)
            )
            if not is_partition_of_existing and not (create and self.config.allowAutoTopicCreation):
                raise BrokerError(ServerError.TopicNotFound, f"Topic {name} does not exist")
            self._check_namespace(name)
            if not is_partition_of_existing:
                self._check_topic_quota(name, 1)
            self.storage.metadata.put(TOPICS_PREFIX + name.full, _json({}))
        ledger = self.storage.open_managed_ledger(name.full)
        topic = PersistentTopic(name, ledger, self, self.scheduler)
        self.topics[name.full] = topic
        return topic

    def get_any_topic(
        self, name: TopicName, *, create: bool
    ) -> PersistentTopic | NonPersistentTopic:
        """The topic ``name`` of either domain (for producers and consumers)."""
        if name.domain == NON_PERSISTENT:
            return self.nonpersistent.get(name, create=create)
        return self.get_topic(name, create=create)

    def create_topic(self, name: TopicName) -> PersistentTopic:
        """Create a non-partitioned topic explicitly (admin)."""
        self.check_partition_name(name)
        if self.topic_exists(name) or self.partitions_of(name) > 0:
            raise BrokerError(ServerError.NotAllowedError, f"Topic {name} already exists")
        self._check_namespace(name)
        self._check_topic_quota(name, 1)
        self.storage.metadata.put(TOPICS_PREFIX + name.full, _json({}))
        return self.get_topic(name, create=True)

    async def delete_topic(self, name: TopicName, *, force: bool = False) -> None:
        """Delete a topic and its data; refused while clients are attached unless forced."""
        if not self.topic_exists(name):
            raise BrokerError(ServerError.TopicNotFound, f"Topic {name} not found")
        topic = self.get_topic(name, create=False)
        busy = topic.producers or any(s.consumers for s in topic.subscriptions.values())
        if busy and not force:
            raise BrokerError(
                ServerError.NotAllowedError, f"Topic {name} has active producers/subscriptions"
            )
        await topic.close()
        topic.replication.delete()
        for sub in list(topic.subscriptions):
            topic.remove_subscription(sub)
        if topic.dedup is not None:
            topic.dedup.delete()
        self.topics.pop(name.full, None)
        self.rate_limits.forget(name)
        self.policies.delete_topic(name.full)
        await self.storage.delete_managed_ledger(name.full)
        self.storage.metadata.delete(TOPICS_PREFIX + name.full)
        self.storage.metadata.delete(topic_epoch_key(name))
        if name.partition_index < 0:
            # As Pulsar: a deleted topic takes its schema along (a partition's is the
            # partitioned topic's, deleted with it).
            self.schemas.delete(name)

    async def delete_partitioned_topic(self, name: TopicName, *, force: bool = False) -> None:
        """Delete every partition and the partitioned topic's metadata."""
        n = self.partitions_of(name)
        if n == 0:
            raise BrokerError(ServerError.TopicNotFound, f"Partitioned topic {name} not found")
        for i in range(n):
            part = name.partition(i)
            if self.topic_exists(part):
                await self.delete_topic(part, force=force)
        self.storage.metadata.delete(PARTITIONS_PREFIX + name.full)
        self.schemas.delete(name)

    def start_background_tasks(self) -> None:
        """Start the periodic work: persisting changed cursor state; the backlog quota check
        and inactive-topic deletion when enabled (as Pulsar schedules them)."""
        self._tasks = [asyncio.ensure_future(self._flush_loop())]
        if self.config.backlogQuotaCheckEnabled:
            self._tasks.append(asyncio.ensure_future(backlog_quota.monitor(self)))
        if self.config.brokerDeleteInactiveTopicsEnabled:
            self._tasks.append(asyncio.ensure_future(inactive_topics.monitor(self)))
        self.load_replicated_topics()
        for topic in self.topics.values():
            topic.replication.start()

    async def _flush_loop(self) -> None:
        # Each cursor rate-limits itself (managedLedgerDefaultMarkDeleteRateLimit); asking every
        # second bounds how long an ack can stay only in memory once acks stop coming.
        expiry_every = max(self.config.messageExpiryCheckIntervalInMinutes * 60.0, 0.1)
        next_expiry = time.monotonic() + expiry_every
        # Pulsar checks for idle producer names every third of the time that expires them.
        dedup_every = self.config.brokerDeduplicationProducerInactivityTimeoutMinutes * 20.0
        next_dedup = time.monotonic() + dedup_every
        while True:
            await asyncio.sleep(1.0)
            check_expiry = time.monotonic() >= next_expiry
            if check_expiry:
                next_expiry = time.monotonic() + expiry_every
            check_dedup = time.monotonic() >= next_dedup
            if check_dedup:
                next_dedup = time.monotonic() + dedup_every
            # A pass over 10,000 topics takes a few hundred ms of loop time (more when the
            # compaction thresholds are checked, once a minute): it yields every slice, so that
            # it is not one stall that every client's latency sees.
            deadline = time.monotonic() + _PERIODIC_SLICE_SECONDS
            for topic in list(self.topics.values()):
                if time.monotonic() >= deadline:
                    await asyncio.sleep(0)
                    deadline = time.monotonic() + _PERIODIC_SLICE_SECONDS
                if topic.closed:
                    continue
                try:
                    topic.flush_cursors()
                    topic.compactor.check_threshold()
                    if check_dedup:
                        topic.purge_inactive_producers()
                    if check_expiry:
                        await topic.expire_messages()
                    await topic.trim_consumed_ledgers()
                except Exception:  # pragma: no cover - keep going with the others
                    log.exception("periodic work on %s", topic.name)

    async def close(self) -> None:
        """Close every topic, persisting cursor state."""
        for task in getattr(self, "_tasks", []):
            task.cancel()
        for topic in list(self.topics.values()):
            try:
                await topic.close()
            except Exception:  # pragma: no cover - shutdown must go on
                log.exception("closing %s", topic.name)
        self.topics.clear()
        await self.nonpersistent.close()
        await asyncio.sleep(0)


def _json(obj: Any) -> bytes:
    return json.dumps(obj).encode()
