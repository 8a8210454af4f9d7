"""Backlog quotas: how large or how old a topic's backlog may grow, and what happens past it.

Pulsar's ``BacklogQuotaManager`` and the quota parts of ``PersistentTopic``, kept here:

- A quota is a ``BacklogQuota`` (``limitSize`` bytes, ``limitTime`` seconds, a retention
  ``policy``) per quota type: ``destination_storage`` (size) and ``message_age`` (time). The one
  in force on a topic is the topic's entry of ``backlogQuotaMap``, else the namespace's, else the
  broker's default (``backlogQuotaDefaultLimitBytes`` / ``backlogQuotaDefaultLimitSecond`` /
  ``backlogQuotaDefaultRetentionPolicy``). -1 means no limit.
- The backlog is measured from the slowest durable cursor, as Pulsar's
  ``getEstimatedBacklogSize``: every byte after its mark-delete position (the part of its ledger
  before it estimated at the ledger's average entry size). Readers (non-durable cursors) hold
  nothing. Its age is the publish time of the first entry after that mark-delete position.
- Every ``backlogQuotaCheckIntervalInSeconds`` the broker checks each loaded topic (size first,
  then age, as Pulsar's ``monitorBacklogQuota``) and acts on the first quota exceeded:
  ``producer_request_hold`` and ``producer_exception`` disconnect the topic's producers;
  ``consumer_backlog_eviction`` moves the slowest cursors forward (size: the slowest cursor skips
  entries until the backlog is under 90 % of the limit; age: every subscription drops what is
  older than 90 % of the limit, as Pulsar's precise time-based check does), each eviction counted
  per quota type.
- A producer connecting while a ``producer_*`` quota is exceeded is refused: with
  ``ProducerBlockedQuotaExceededError`` under ``producer_request_hold`` (the official client keeps
  a reconnecting producer's sends pending and retries, so they wait and then time out, or go
  through once the backlog shrinks) and ``ProducerBlockedQuotaExceededException`` under
  ``producer_exception`` (the client fails the pending sends); a new producer's creation fails
  with either.

The decisions (:func:`size_exceeded`, :func:`time_exceeded`, :func:`size_eviction_skip`,
:func:`estimated_backlog_size`) are plain functions of their inputs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from keyshared.broker.errors import BrokerError, ServerError
from keyshared.config import BACKLOG_QUOTA_RETENTION_POLICIES, BrokerConfig
from keyshared.storage.ledger import LedgerInfo
from keyshared.storage.position import Position

if TYPE_CHECKING:
    from keyshared.broker.policies import PolicyService
    from keyshared.broker.service import BrokerService
    from keyshared.broker.subscription import Subscription
    from keyshared.broker.topic import PersistentTopic
    from keyshared.broker.topic_name import TopicName

log = logging.getLogger(__name__)

DESTINATION_STORAGE = "destination_storage"
MESSAGE_AGE = "message_age"
QUOTA_TYPES = (DESTINATION_STORAGE, MESSAGE_AGE)
"""Pulsar's ``BacklogQuotaType`` values."""

HOLD, EXCEPTION, EVICTION = BACKLOG_QUOTA_RETENTION_POLICIES
POLICY_NAME = "backlogQuotaMap"

QUOTA_EXCEEDED = "Cannot create producer on topic with backlog quota exceeded"
"""Pulsar's ``TopicBacklogQuotaExceededException`` message."""

# The label Pulsar's pulsar_storage_backlog_quota_exceeded_evictions_total carries.
METRIC_QUOTA_TYPE = {DESTINATION_STORAGE: "size", MESSAGE_AGE: "time"}

# Pulsar drops the backlog to 90 % of the limit when it evicts (size eviction computes it in
# integers: 9/10).
REDUCTION_FACTOR = 0.9
# Bounds one size eviction: each round skips on the slowest cursor, which may then change.
_MAX_EVICTION_ROUNDS = 100

_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1


class QuotaError(ValueError):
    """A ``BacklogQuota`` body or quota type that cannot be taken, with the reason."""


@dataclass(frozen=True, slots=True)
class BacklogQuota:
    """Pulsar's ``BacklogQuota``: -1 for a limit means none."""

    limit_size: int = -1
    limit_time: int = -1
    policy: str = HOLD

    def to_json(self) -> dict[str, Any]:
        """Pulsar's JSON (``BacklogQuotaImpl``, with its deprecated ``limit`` = ``limitSize``)."""
        return {
            "limit": self.limit_size,
            "limitSize": self.limit_size,
            "limitTime": self.limit_time,
            "policy": self.policy,
        }

    @classmethod
    def from_json(cls, body: object) -> BacklogQuota:
        """A quota from Pulsar's JSON: ``limitSize`` (or the deprecated ``limit``),
        ``limitTime``, ``policy``. Raises :class:`QuotaError` naming what is wrong."""
        if not isinstance(body, Mapping):
            raise QuotaError("The backlog quota must be a JSON object (BacklogQuota)")
        size = body.get("limitSize")
        if size is None:
            size = body.get("limit", -1)
        limit_time = body.get("limitTime", -1)
        policy = body.get("policy")
        for field, value, top in (
            ("limitSize", size, _INT64_MAX),
            ("limitTime", limit_time, _INT32_MAX),
        ):
            if not isinstance(value, int) or isinstance(value, bool):
                raise QuotaError(f"Invalid {field} {value!r}: an integer is expected")
            if value < -1 or value > top:
                raise QuotaError(f"Invalid {field} {value}: -1 (no limit) or 0 to {top}")
        if policy not in BACKLOG_QUOTA_RETENTION_POLICIES:
            raise QuotaError(
                f"Invalid policy {policy!r}: one of {', '.join(BACKLOG_QUOTA_RETENTION_POLICIES)}"
            )
        return cls(int(size), int(limit_time), str(policy))


def check_quota_type(value: str | None) -> str:
    """A ``backlogQuotaType`` as given (``destination_storage`` when absent)."""
    if value is None or value == "":
        return DESTINATION_STORAGE
    if value not in QUOTA_TYPES:
        raise QuotaError(f"Invalid backlogQuotaType {value!r}: one of {', '.join(QUOTA_TYPES)}")
    return value


def default_quota(config: BrokerConfig) -> BacklogQuota:
    """The broker's quota (both types share it, as in Pulsar's ``BacklogQuotaManager``).

    The deprecated ``backlogQuotaDefaultLimitGB`` applies only while
    ``backlogQuotaDefaultLimitBytes`` is not set."""
    size = config.backlogQuotaDefaultLimitBytes
    if size < 0 and config.backlogQuotaDefaultLimitGB > 0:
        size = int(config.backlogQuotaDefaultLimitGB * 1024**3)
    return BacklogQuota(
        size, config.backlogQuotaDefaultLimitSecond, config.backlogQuotaDefaultRetentionPolicy
    )


def quota_in_force(policies: PolicyService, name: TopicName, quota_type: str) -> BacklogQuota:
    """The quota of ``quota_type`` on topic ``name``: topic, else namespace, else broker."""
    entry = policies.effective_entry(name, POLICY_NAME, quota_type)
    if entry is None:
        return default_quota(policies.config)
    try:
        return BacklogQuota.from_json(entry)
    except QuotaError:  # pragma: no cover - stored only after the same validation
        log.warning("%s: ignoring a stored %s quota that does not parse", name.full, quota_type)
        return default_quota(policies.config)


def applied_quota_map(policies: PolicyService, name: TopicName) -> dict[str, dict[str, Any]]:
    """Every quota type's quota in force on ``name``, as Pulsar's ``backlogQuotaMap`` JSON."""
    return {t: quota_in_force(policies, name, t).to_json() for t in QUOTA_TYPES}


# --- the decisions --------------------------------------------------------------------------
def estimated_backlog_size(ledgers: Sequence[LedgerInfo], mark_delete: Position | None) -> int:
    """Bytes after ``mark_delete`` (None: no durable cursor, no backlog), Pulsar's estimate:
    the ledgers after it whole, the part of its own ledger after it at the average entry size."""
    if mark_delete is None:
        return 0
    size = 0
    for li in ledgers:
        if li.ledger_id < mark_delete.ledger_id:
            continue
        if li.ledger_id > mark_delete.ledger_id or li.entries <= 0:
            size += li.size
            continue
        consumed = mark_delete.entry_id + 1
        if consumed >= li.entries:
            continue
        size += li.size - (consumed * li.size // li.entries if consumed > 0 else 0)
    return size


def size_exceeded(limit_size: int, backlog_size: int) -> bool:
    """Pulsar's ``isSizeBacklogExceeded``: a limit is set and the backlog has reached it."""
    return limit_size >= 0 and backlog_size >= limit_size


def time_exceeded(limit_time: int, oldest_publish_ms: int | None, now_ms: int) -> bool:
    """Pulsar's time check: a positive limit, and the oldest backlog entry older than it."""
    if limit_time <= 0 or oldest_publish_ms is None:
        return False
    return now_ms > oldest_publish_ms + limit_time * 1000


def size_eviction_skip(backlog_size: int, limit_size: int, entries_in_backlog: int) -> int:
    """Entries the slowest cursor skips in one round of a size eviction: its backlog shrunk by
    the share of the topic's backlog above 90 % of the limit (Pulsar's skip factor).

    Rounded up, where Pulsar truncates: with a few large entries Pulsar's count comes out 0 and
    the topic stays over its quota until more is published; here the backlog does get under."""
    if backlog_size <= 0 or 10 * backlog_size <= 9 * limit_size:
        return 0
    # ceil((backlog - 0.9 * limit) / backlog * entries), in integers.
    numerator = (10 * backlog_size - 9 * limit_size) * entries_in_backlog
    return -(-numerator // (10 * backlog_size))


def conflicts_with_retention(quota: BacklogQuota, time_min: Any, size_mb: Any) -> bool:
    """Pulsar's ``checkBacklogQuota``: a quota must stay below the retention set at its level
    (``time_min`` minutes / ``size_mb`` MB, None when not set; 0 or less limits nothing)."""
    size = int(size_mb or 0)
    minutes = int(time_min or 0)
    if size > 0 and quota.limit_size > 0 and quota.limit_size >= size * 1024 * 1024:
        return True
    return minutes > 0 and quota.limit_time > 0 and quota.limit_time >= minutes * 60


# --- one topic ------------------------------------------------------------------------------
class TopicBacklogQuota:
    """One persistent topic's quotas: the checks, the actions, and what its stats show."""

    def __init__(self, topic: PersistentTopic) -> None:
        self.topic = topic
        # Evictions since the topic was loaded, by quota type (Pulsar counts each one).
        self.evictions = dict.fromkeys(QUOTA_TYPES, 0)
        # From the last check (Pulsar's "best effort" age); -1 until one ran.
        self.oldest_age_seconds = -1
        self.oldest_subscription: str | None = None
        # The oldest backlog entry the last check read, and its publish time.
        self._oldest_read: tuple[Position, int] | None = None
        # Resolved quotas, valid while the policy store's generation is unchanged (stats and
        # /metrics ask for them on every topic).
        self._quotas: dict[str, BacklogQuota] = {}
        self._generation = -1

    # --- what is in force -----------------------------------------------------------------
    def quota(self, quota_type: str) -> BacklogQuota:
        """The quota of ``quota_type`` in force on the topic."""
        policies = self.topic.service.policies
        if policies.generation != self._generation:
            self._quotas.clear()
            self._generation = policies.generation
        found = self._quotas.get(quota_type)
        if found is None:
            found = self._quotas[quota_type] = quota_in_force(policies, self.topic.name, quota_type)
        return found

    def _slowest(self) -> Subscription | None:
        subs = [s for s in self.topic.subscriptions.values() if s.durable and not s.closed]
        return min(subs, key=lambda s: s.cursor.mark_delete_position, default=None)

    def backlog_size(self) -> int:
        """The estimated backlog in bytes, from the slowest durable cursor."""
        slowest = self._slowest()
        mdp = slowest.cursor.mark_delete_position if slowest is not None else None
        return estimated_backlog_size(self.topic.ledger.ledgers, mdp)

    def _oldest_position(self) -> tuple[Position, str] | None:
        """The first entry after the slowest mark-delete position, and whose it is."""
        slowest = self._slowest()
        if slowest is None:
            return None
        ledger = self.topic.ledger
        pos = ledger.next_position(slowest.cursor.mark_delete_position)
        if pos > ledger.last_add_confirmed:
            return None
        return pos, slowest.name

    def exceeded(self) -> list[str]:
        """The quota types exceeded now, as far as known without reading storage (the age
        from the metadata cache, else from the last check). For the dashboard and stats."""
        out = []
        if size_exceeded(self.quota(DESTINATION_STORAGE).limit_size, self.backlog_size()):
            out.append(DESTINATION_STORAGE)
        now = int(time.time() * 1000)
        if time_exceeded(self.quota(MESSAGE_AGE).limit_time, self._oldest_publish_time(), now):
            out.append(MESSAGE_AGE)
        return out

    def _oldest_publish_time(self) -> int | None:
        oldest = self._oldest_position()
        if oldest is None:
            return None
        cached = self.topic.meta_cache.publish_time(oldest[0])
        if cached is not None:
            return cached
        # Not cached: what the last check read, if the oldest entry is still that one (else
        # unknown until the next check reads it).
        read = self._oldest_read
        return read[1] if read is not None and read[0] == oldest[0] else None

    # --- producers ------------------------------------------------------------------------
    def check_producer(self) -> None:
        """Refuse a producer while a ``producer_*`` quota is exceeded (Pulsar's
        ``checkBacklogQuotaExceeded``, for each quota type)."""
        for quota_type in QUOTA_TYPES:
            quota = self.quota(quota_type)
            if quota.policy == EVICTION:
                continue
            if quota_type == DESTINATION_STORAGE:
                over = size_exceeded(quota.limit_size, self.backlog_size())
            else:
                now = int(time.time() * 1000)
                over = time_exceeded(quota.limit_time, self._oldest_publish_time(), now)
            if over:
                code = (
                    ServerError.ProducerBlockedQuotaExceededError
                    if quota.policy == HOLD
                    else ServerError.ProducerBlockedQuotaExceededException
                )
                raise BrokerError(code, QUOTA_EXCEEDED)

    def _disconnect_producers(self) -> None:
        producers = self.topic.producers
        for producer in list(producers.values()):
            producer.transport.close_producer(producer)
            self.topic.remove_producer(producer)

    # --- the periodic check ---------------------------------------------------------------
    async def check(self) -> str | None:
        """Check both quotas (size first, as Pulsar) and act on the first exceeded; returns
        its type, or None."""
        oldest_ms = await self._read_oldest_publish_time()
        size_quota = self.quota(DESTINATION_STORAGE)
        if size_exceeded(size_quota.limit_size, self.backlog_size()):
            self._act(DESTINATION_STORAGE, size_quota)
            return DESTINATION_STORAGE
        time_quota = self.quota(MESSAGE_AGE)
        if time_exceeded(time_quota.limit_time, oldest_ms, int(time.time() * 1000)):
            await self._act_on_time(time_quota)
            return MESSAGE_AGE
        return None

    async def _read_oldest_publish_time(self) -> int | None:
        """Read (or find cached) the oldest backlog entry's publish time; record its age."""
        oldest = self._oldest_position()
        if oldest is None:
            self._oldest_read = None
            self.oldest_subscription = None
            self.oldest_age_seconds = 0
            return None
        pos, sub_name = oldest
        topic = self.topic
        publish_ms = topic.meta_cache.publish_time(pos)
        if publish_ms is None:
            entry = await topic.ledger.read_entry(pos)
            if entry is None:
                return None
            publish_ms = topic.entry_meta(entry).publish_time
        self._oldest_read = (pos, publish_ms)
        self.oldest_subscription = sub_name
        self.oldest_age_seconds = max(int(time.time() - publish_ms / 1000), 0)
        return publish_ms

    def _act(self, quota_type: str, quota: BacklogQuota) -> None:
        if quota.policy == EVICTION:
            self.evict_for_size(quota.limit_size)
        else:
            self._disconnect_producers()

    async def _act_on_time(self, quota: BacklogQuota) -> None:
        if quota.policy == EVICTION:
            target = int(REDUCTION_FACTOR * quota.limit_time)
            await self.topic.expire_older_than(target)
            self.evictions[MESSAGE_AGE] += 1
            await self._read_oldest_publish_time()
        else:
            self._disconnect_producers()

    def evict_for_size(self, limit_size: int) -> int:
        """Move the slowest cursors forward until the backlog is under 90 % of
        ``limit_size``; returns the entries skipped."""
        skipped = 0
        backlog = self.backlog_size()
        for _ in range(_MAX_EVICTION_ROUNDS):
            slowest = self._slowest()
            if slowest is None:
                break
            n = size_eviction_skip(backlog, limit_size, slowest.cursor.number_of_entries_in_backlog)
            if n <= 0:
                break
            done = slowest.skip(n)
            if done <= 0:
                break
            skipped += done
            backlog = self.backlog_size()
        self.evictions[DESTINATION_STORAGE] += 1
        log.info(
            "%s: backlog quota exceeded, %d entries evicted from the slowest cursors",
            self.topic.name,
            skipped,
        )
        return skipped

    # --- stats ----------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """The quota fields of Pulsar's ``TopicStats``."""
        return {
            "backlogQuotaLimitSize": self.quota(DESTINATION_STORAGE).limit_size,
            "backlogQuotaLimitTime": self.quota(MESSAGE_AGE).limit_time,
            "oldestBacklogMessageAgeSeconds": self.oldest_age_seconds,
            "oldestBacklogMessageSubscriptionName": self.oldest_subscription,
        }


# --- the broker's periodic check --------------------------------------------------------------
async def monitor(service: BrokerService) -> None:
    """Check every loaded topic each ``backlogQuotaCheckIntervalInSeconds`` (run only while
    ``backlogQuotaCheckEnabled``)."""
    every = float(service.config.backlogQuotaCheckIntervalInSeconds)
    while True:
        await asyncio.sleep(every)
        for topic in list(service.topics.values()):
            if topic.closed:
                continue
            try:
                await topic.backlog_quota.check()
            except Exception:  # pragma: no cover - keep checking the others
                log.exception("backlog quota check on %s", topic.name)
