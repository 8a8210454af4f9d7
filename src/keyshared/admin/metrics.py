"""``GET /metrics``: the broker's topics and subscriptions in the Prometheus text format.

Names and labels are Pulsar's (``TopicStats.printTopicStats`` with topic-level metrics, Pulsar's
default): every series carries ``cluster``, ``namespace`` and ``topic``; subscription series add
``subscription``; consumer series (only with ``exposeConsumerLevelMetricsInPrometheus``) add
``consumer_name`` and ``consumer_id``. As Pulsar does, every family is a gauge, ``*_total`` ones
included, and ``pulsar_out_messages_total`` / ``pulsar_out_bytes_total`` are per subscription.

Beyond Pulsar, each Key_Shared subscription exposes its PIP-379 draining-hash counts
(``pulsar_subscription_draining_hashes_count``, ``..._cleared_total``, ``..._unacked_messages``)
and each subscription its PIP-299 pause (``pulsar_subscription_blocked_on_ack_state_persistent``).

The values come from the same stats as the admin REST API, built when scraped: nothing is
recorded on the hot path for metrics.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    generate_latest,
)
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from keyshared.broker.backlog_quota import METRIC_QUOTA_TYPE
from keyshared.broker.nonpersistent_topic import NonPersistentTopic
from keyshared.broker.service import BrokerService
from keyshared.broker.topic import PersistentTopic

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Labels = dict[str, str]

# A scrape builds its families on the loop in slices of about this long, yielding in between.
_SLICE_SECONDS = 0.01

# Topic series: (metric name, TopicStats field or a function of the stats, help).
_TOPIC_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("pulsar_rate_in", "msgRateIn", "Messages published per second"),
    ("pulsar_rate_out", "msgRateOut", "Messages dispatched per second"),
    ("pulsar_throughput_in", "msgThroughputIn", "Bytes published per second"),
    ("pulsar_throughput_out", "msgThroughputOut", "Bytes dispatched per second"),
    ("pulsar_average_msg_size", "averageMsgSize", "Average size of published messages, bytes"),
    ("pulsar_storage_size", "storageSize", "Bytes the topic's ledgers take"),
    ("pulsar_storage_logical_size", "storageSize", "Logical bytes of the topic's ledgers"),
    ("pulsar_storage_backlog_size", "backlogSize", "Bytes of the topic's backlog"),
    ("pulsar_storage_offloaded_size", "offloadedStorageSize", "Bytes offloaded to tiered storage"),
    ("pulsar_in_bytes_total", "bytesInCounter", "Bytes published since the topic was loaded"),
    ("pulsar_in_messages_total", "msgInCounter", "Messages published since the topic was loaded"),
    (
        "pulsar_storage_backlog_quota_limit",
        "backlogQuotaLimitSize",
        "The topic's size backlog quota in bytes (-1: none)",
    ),
    (
        "pulsar_storage_backlog_quota_limit_time",
        "backlogQuotaLimitTime",
        "The topic's time backlog quota in seconds (-1: none)",
    ),
    (
        "pulsar_storage_backlog_age_seconds",
        "oldestBacklogMessageAgeSeconds",
        "Age of the oldest unacknowledged message, at the last backlog quota check",
    ),
    (
        "pulsar_publish_rate_limit_times",
        "publishRateLimitedTimes",
        "Sends that overdrew a publish rate limit (the producer's connection paused)",
    ),
)
_EVICTIONS = "pulsar_storage_backlog_quota_exceeded_evictions_total"
_EVICTIONS_DOC = "Times the backlog was evicted for exceeding its quota, by quota_type"

# Per remote cluster (label ``remote_cluster``), from the topic stats' ``replication`` section.
_REPLICATION_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("pulsar_replication_rate_in", "msgRateIn", "Messages received from the remote per second"),
    ("pulsar_replication_rate_out", "msgRateOut", "Messages sent to the remote per second"),
    ("pulsar_replication_throughput_in", "msgThroughputIn", "Bytes received from the remote/s"),
    ("pulsar_replication_throughput_out", "msgThroughputOut", "Bytes sent to the remote/s"),
    ("pulsar_replication_backlog", "replicationBacklog", "Entries not yet replicated"),
    ("pulsar_replication_connected_count", "connected", "1 while the replicator is connected"),
    ("pulsar_replication_rate_expired", "msgRateExpired", "Replication messages expired/s"),
    (
        "pulsar_replication_delay_in_seconds",
        "replicationDelayInSeconds",
        "Age of the oldest message not yet replicated",
    ),
)

_SUBSCRIPTION_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("pulsar_subscription_back_log", "msgBacklog", "Messages in the subscription's backlog"),
    (
        "pulsar_subscription_back_log_no_delayed",
        "msgBacklogNoDelayed",
        "Backlog messages that are not delayed",
    ),
    ("pulsar_subscription_delayed", "msgDelayed", "Messages waiting for their delivery time"),
    ("pulsar_subscription_in_replay", "msgInReplay", "Messages waiting in the replay queue"),
    (
        "pulsar_subscription_msg_rate_redeliver",
        "msgRateRedeliver",
        "Messages redelivered per second",
    ),
    (
        "pulsar_subscription_unacked_messages",
        "unackedMessages",
        "Messages delivered and not yet acknowledged",
    ),
    (
        "pulsar_subscription_blocked_on_unacked_messages",
        "blockedSubscriptionOnUnackedMsgs",
        "1 when dispatch is blocked by too many unacked messages",
    ),
    ("pulsar_subscription_msg_rate_out", "msgRateOut", "Messages dispatched per second"),
    (
        "pulsar_subscription_msg_drop_rate",
        "msgDropRate",
        "Messages dropped per second (non-persistent topics)",
    ),
    ("pulsar_subscription_msg_ack_rate", "messageAckRate", "Messages acknowledged per second"),
    (
        "pulsar_subscription_msg_throughput_out",
        "msgThroughputOut",
        "Bytes dispatched per second",
    ),
    ("pulsar_out_bytes_total", "bytesOutCounter", "Bytes dispatched"),
    ("pulsar_out_messages_total", "msgOutCounter", "Messages dispatched"),
    (
        "pulsar_subscription_last_expire_timestamp",
        "lastExpireTimestamp",
        "When messages last expired (epoch ms)",
    ),
    (
        "pulsar_subscription_last_acked_timestamp",
        "lastAckedTimestamp",
        "When a consumer last acknowledged (epoch ms)",
    ),
    (
        "pulsar_subscription_last_consumed_flow_timestamp",
        "lastConsumedFlowTimestamp",
        "When a consumer last asked for messages (epoch ms)",
    ),
    (
        "pulsar_subscription_last_consumed_timestamp",
        "lastConsumedTimestamp",
        "When a consumer last received messages (epoch ms)",
    ),
    (
        "pulsar_subscription_last_mark_delete_advanced_timestamp",
        "lastMarkDeleteAdvancedTimestamp",
        "When the mark-delete position last moved (epoch ms)",
    ),
    (
        "pulsar_subscription_blocked_on_ack_state_persistent",
        "blockedOnAckStatePersistent",
        "1 when dispatch is paused because the ack state cannot be persisted (PIP-299)",
    ),
)

_DRAINING_GAUGES: tuple[tuple[str, str, str], ...] = (
    (
        "pulsar_subscription_draining_hashes_count",
        "drainingHashesCount",
        "Key_Shared hashes draining: blocked until their old consumer acks (PIP-379)",
    ),
    (
        "pulsar_subscription_draining_hashes_cleared_total",
        "drainingHashesClearedTotal",
        "Key_Shared draining hashes cleared since the consumers connected (PIP-379)",
    ),
    (
        "pulsar_subscription_draining_hashes_unacked_messages",
        "drainingHashesUnackedMessages",
        "Unacked messages holding Key_Shared draining hashes (PIP-379)",
    ),
)

_CONSUMER_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("pulsar_consumer_msg_rate_redeliver", "msgRateRedeliver", "Redeliveries per second"),
    ("pulsar_consumer_unacked_messages", "unackedMessages", "Unacked messages"),
    (
        "pulsar_consumer_blocked_on_unacked_messages",
        "blockedConsumerOnUnackedMsgs",
        "1 when blocked by too many unacked messages",
    ),
    ("pulsar_consumer_msg_rate_out", "msgRateOut", "Messages dispatched per second"),
    ("pulsar_consumer_msg_ack_rate", "messageAckRate", "Messages acknowledged per second"),
    ("pulsar_consumer_msg_throughput_out", "msgThroughputOut", "Bytes dispatched per second"),
    ("pulsar_consumer_available_permits", "availablePermits", "Permits the consumer granted"),
    ("pulsar_out_bytes_total", "bytesOutCounter", "Bytes dispatched"),
    ("pulsar_out_messages_total", "msgOutCounter", "Messages dispatched"),
    (
        "pulsar_consumer_draining_hashes_count",
        "drainingHashesCount",
        "Key_Shared hashes this consumer is draining (PIP-379)",
    ),
    (
        "pulsar_consumer_draining_hashes_unacked_messages",
        "drainingHashesUnackedMessages",
        "Unacked messages of this consumer holding draining hashes (PIP-379)",
    ),
)

_PRODUCER_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("pulsar_producer_msg_rate_in", "msgRateIn", "Messages published per second"),
    ("pulsar_producer_msg_throughput_in", "msgThroughputIn", "Bytes published per second"),
    ("pulsar_producer_msg_average_Size", "averageMsgSize", "Average message size, bytes"),
)


class _Families:
    """Metric families by name, in first-seen order, each sample with its own labels."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}

    def add(self, name: str, labels: Labels, value: float, doc: str = "") -> None:
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = Metric(name, doc or name, "gauge")
        family.add_sample(name, labels, float(value))

    def add_all(
        self, gauges: tuple[tuple[str, str, str], ...], stats: dict[str, Any], labels: Labels
    ) -> None:
        for name, field, doc in gauges:
            value = stats.get(field)
            if value is not None:
                self.add(name, labels, float(value), doc)

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families.values())


def _add_dispatch_throttling(fam: _Families, sub: dict[str, Any], labels: Labels) -> None:
    """Pulsar's dispatch-throttling counters, one series per ``reason`` that throttled."""
    for reason in ("subscription", "topic", "broker"):
        label = reason.capitalize()
        for unit, field in (("msg", "Msg"), ("bytes", "Bytes")):
            value = sub.get(f"dispatchThrottled{field}EventsBy{label}Limit")
            if value:
                fam.add(
                    f"pulsar_subscription_dispatch_throttled_{unit}_events",
                    labels | {"reason": reason},
                    float(value),
                    f"Reads held back by a dispatch rate limit on {unit}",
                )


class BrokerCollector(Collector):
    """Collects Pulsar's topic, subscription (and optionally consumer and producer) metrics.

    ``collect`` builds every family at once; the route uses ``collect_async``, which builds them
    on the loop a slice at a time (yielding between slices, so that a scrape of 10,000 topics is
    not one stall of seconds that every client sees), and formats the text off the loop.
    """

    def __init__(self, service: BrokerService) -> None:
        self.service = service

    def _loaded(self) -> list[PersistentTopic | NonPersistentTopic]:
        service = self.service
        return [*service.topics.values(), *service.nonpersistent.topics.values()]

    def collect(self) -> Iterator[Metric]:
        """The families of every loaded topic, built from its stats now."""
        scrape = _Scrape(self.service)
        for topic in self._loaded():
            scrape.add_topic(topic)
        yield from scrape.finish()

    async def collect_async(self, slice_seconds: float = _SLICE_SECONDS) -> list[Metric]:
        """As ``collect``, yielding to the loop every ``slice_seconds`` of work. A topic closed
        or unloaded while the scrape waits is skipped."""
        scrape = _Scrape(self.service)
        deadline = time.monotonic() + slice_seconds
        for topic in self._loaded():
            scrape.add_topic(topic)
            if time.monotonic() >= deadline:
                await asyncio.sleep(0)
                deadline = time.monotonic() + slice_seconds
        return list(scrape.finish())


class _Scrape:
    """One scrape's families, built topic by topic."""

    def __init__(self, service: BrokerService) -> None:
        cfg = service.config
        self.service = service
        self.cluster = cfg.clusterName
        self.consumers_on = cfg.exposeConsumerLevelMetricsInPrometheus
        self.producers_on = cfg.exposeProducerLevelMetricsInPrometheus
        self.fam = _Families()
        self.topics_per_ns: dict[str, int] = {}
        self.evictions: dict[str, int] = {}

    def add_topic(self, topic: PersistentTopic | NonPersistentTopic) -> None:
        """The series of one topic."""
        if topic.closed:
            return
        fam, cluster = self.fam, self.cluster
        consumers_on, producers_on = self.consumers_on, self.producers_on
        topics_per_ns, evictions = self.topics_per_ns, self.evictions
        ns = topic.name.namespace_name
        topics_per_ns[ns] = topics_per_ns.get(ns, 0) + 1
        labels = {"cluster": cluster, "namespace": ns, "topic": topic.name.full}
        stats = topic.stats()
        subs: dict[str, Any] = stats["subscriptions"]
        fam.add("pulsar_subscriptions_count", labels, len(subs), "Subscriptions of the topic")
        fam.add("pulsar_producers_count", labels, len(stats["publishers"]), "Producers")
        fam.add(
            "pulsar_consumers_count",
            labels,
            sum(len(s["consumers"]) for s in subs.values()),
            "Consumers of all subscriptions",
        )
        fam.add_all(_TOPIC_GAUGES, stats, labels)
        if isinstance(topic, PersistentTopic):
            for quota_type, n in topic.backlog_quota.evictions.items():
                kind = METRIC_QUOTA_TYPE[quota_type]
                fam.add(_EVICTIONS, labels | {"quota_type": kind}, n, _EVICTIONS_DOC)
                evictions[kind] = evictions.get(kind, 0) + n
        fam.add(
            "pulsar_msg_backlog",
            labels,
            sum(s["msgBacklog"] for s in subs.values()),
            "Messages in the backlogs of all subscriptions",
        )
        for remote, rep in stats["replication"].items():
            fam.add_all(_REPLICATION_GAUGES, rep, labels | {"remote_cluster": remote})
        if producers_on:
            for p in stats["publishers"]:
                p_labels = labels | {
                    "producer_name": p["producerName"],
                    "producer_id": str(p["producerId"]),
                }
                fam.add_all(_PRODUCER_GAUGES, p, p_labels)
        for sub_name, sub in subs.items():
            s_labels = labels | {"subscription": sub_name}
            fam.add_all(_SUBSCRIPTION_GAUGES, sub, s_labels)
            fam.add(
                "pulsar_subscription_consumers_count",
                s_labels,
                len(sub["consumers"]),
                "Consumers of the subscription",
            )
            if sub.get("type") == "Key_Shared":
                fam.add_all(_DRAINING_GAUGES, sub, s_labels)
            _add_dispatch_throttling(fam, sub, s_labels)
            if consumers_on:
                for c, consumer in zip(
                    topic.subscriptions[sub_name].consumers, sub["consumers"], strict=False
                ):
                    c_labels = s_labels | {
                        "consumer_name": consumer["consumerName"],
                        "consumer_id": str(c.consumer_id),
                    }
                    fam.add_all(_CONSUMER_GAUGES, consumer, c_labels)

    def finish(self) -> Iterator[Metric]:
        """The broker-wide series, then every family."""
        fam, cluster, service, evictions = self.fam, self.cluster, self.service, self.evictions
        topics_per_ns = self.topics_per_ns
        base = {"cluster": cluster}
        disk = service.storage.disk
        fam.add(
            "bookie_ledger_dir_usage",
            base | {"dir": str(disk.path)},
            disk.usage * 100,
            "Percent of the data directory's file system in use (BookKeeper's ledger dir usage)",
        )
        fam.add(
            "bookie_SERVER_STATUS",
            base,
            0 if disk.read_only else 1,
            "1 while new entries are written, 0 while the data directory is full (read-only)",
        )
        for kind, n in sorted(evictions.items()):
            name = "pulsar_broker_" + _EVICTIONS[len("pulsar_") :]
            fam.add(name, base | {"quota_type": kind}, n, _EVICTIONS_DOC)
        for source in service.broker_gauges:
            for name, value, doc in source():
                fam.add(name, base, value, doc)
        for ns, n in sorted(topics_per_ns.items()):
            fam.add(
                "pulsar_topics_count",
                {"cluster": cluster, "namespace": ns},
                n,
                "Topics loaded in the namespace",
            )
        yield from fam


def metrics_registry(service: BrokerService) -> CollectorRegistry:
    """A registry with the broker's collector and the process, platform and GC collectors."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(service))
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
    return registry


class _Built(Collector):
    """Families already built (on the loop), for formatting in a thread."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def _format(families: list[Metric]) -> bytes:
    """The Prometheus text of ``families`` and the process, platform and GC collectors."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Built(families))
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
    return generate_latest(registry)


def add_metrics_route(app: FastAPI, service: BrokerService) -> None:
    """Serve ``GET /metrics`` (and ``/metrics/``, as Pulsar does) from ``app``."""
    collector = BrokerCollector(service)

    # async: stats must be read on the broker's event loop, never from a worker thread; they
    # are read a slice at a time, and the text is formatted in a thread.
    async def metrics() -> Response:
        families = await collector.collect_async()
        text = await asyncio.get_running_loop().run_in_executor(None, _format, families)
        return Response(text, media_type=CONTENT_TYPE)

    for path in ("/metrics", "/metrics/"):
        app.add_api_route(path, metrics, methods=["GET"], include_in_schema=False)
