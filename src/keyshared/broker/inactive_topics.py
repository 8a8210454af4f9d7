"""Inactive topics: persistent topics nobody uses are deleted, as Pulsar's ``checkGC`` does.

Every ``brokerDeleteInactiveTopicsFrequencySeconds`` (while ``brokerDeleteInactiveTopicsEnabled``)
each loaded persistent topic is looked at under its ``InactiveTopicPolicies`` (topic policy, else
namespace policy, else the broker's ``brokerDeleteInactiveTopics*`` settings):

- ``deleteWhileInactive`` false: kept.
- Active, by ``inactiveTopicDeleteMode``: ``delete_when_no_subscriptions`` - it has a
  subscription; ``delete_when_subscriptions_caught_up`` - a subscription has a backlog; and in
  both modes a producer or consumer is connected. An active topic's clock restarts.
- Inactive for ``maxInactiveDurationSeconds`` (the broker's
  ``brokerDeleteInactiveTopicsMaxInactiveDurationSeconds``, else the frequency) and not held by
  retention (a negative retention time keeps it; a positive one keeps it that long after it was
  last active): deleted with its data and subscriptions, as ``DELETE`` on the admin API would.

Partitions are deleted one by one like any topic; the partitioned topic's metadata stays (Pulsar's
``brokerDeleteInactivePartitionedTopicMetadataEnabled`` defaults to false). Non-persistent
topics are not collected here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from keyshared.broker.errors import BrokerError
from keyshared.config import INACTIVE_TOPIC_DELETE_MODES, BrokerConfig

if TYPE_CHECKING:
    from keyshared.broker.policies import PolicyService
    from keyshared.broker.service import BrokerService
    from keyshared.broker.topic import PersistentTopic
    from keyshared.broker.topic_name import TopicName

log = logging.getLogger(__name__)

NO_SUBSCRIPTIONS, CAUGHT_UP = INACTIVE_TOPIC_DELETE_MODES
POLICY_NAME = "inactiveTopicPolicies"
_INT32_MAX = 2**31 - 1


class InactivePolicyError(ValueError):
    """An ``InactiveTopicPolicies`` body that cannot be taken, with the reason."""


@dataclass(frozen=True, slots=True)
class InactiveTopicPolicies:
    """Pulsar's ``InactiveTopicPolicies``."""

    delete_mode: str = NO_SUBSCRIPTIONS
    max_inactive_seconds: int = 60
    delete_while_inactive: bool = True

    def to_json(self) -> dict[str, Any]:
        """Pulsar's JSON."""
        return {
            "inactiveTopicDeleteMode": self.delete_mode,
            "maxInactiveDurationSeconds": self.max_inactive_seconds,
            "deleteWhileInactive": self.delete_while_inactive,
        }

    @classmethod
    def from_json(cls, body: object) -> InactiveTopicPolicies:
        """From Pulsar's JSON; raises :class:`InactivePolicyError` naming what is wrong.
        Absent fields take Pulsar's defaults for a new ``InactiveTopicPolicies``."""
        if not isinstance(body, Mapping):
            raise InactivePolicyError(
                "The inactive topic policies must be a JSON object (InactiveTopicPolicies)"
            )
        mode = body.get("inactiveTopicDeleteMode", NO_SUBSCRIPTIONS)
        seconds = body.get("maxInactiveDurationSeconds", 0)
        delete = body.get("deleteWhileInactive", False)
        if mode not in INACTIVE_TOPIC_DELETE_MODES:
            raise InactivePolicyError(
                f"Invalid inactiveTopicDeleteMode {mode!r}: one of"
                f" {', '.join(INACTIVE_TOPIC_DELETE_MODES)}"
            )
        if not isinstance(seconds, int) or isinstance(seconds, bool):
            raise InactivePolicyError(
                f"Invalid maxInactiveDurationSeconds {seconds!r}: an integer is expected"
            )
        if not 0 <= seconds <= _INT32_MAX:
            raise InactivePolicyError(
                f"Invalid maxInactiveDurationSeconds {seconds}: must be 0 or more"
            )
        if not isinstance(delete, bool):
            raise InactivePolicyError(f"Invalid deleteWhileInactive {delete!r}: true or false")
        return cls(str(mode), seconds, delete)


def broker_policies(config: BrokerConfig) -> InactiveTopicPolicies:
    """The broker's policies from ``brokerDeleteInactiveTopics*``."""
    seconds = config.brokerDeleteInactiveTopicsMaxInactiveDurationSeconds
    if seconds < 0:
        seconds = config.brokerDeleteInactiveTopicsFrequencySeconds
    return InactiveTopicPolicies(
        config.brokerDeleteInactiveTopicsMode, seconds, config.brokerDeleteInactiveTopicsEnabled
    )


def policies_in_force(policies: PolicyService, name: TopicName) -> InactiveTopicPolicies:
    """The policies on topic ``name``: topic, else namespace, else broker."""
    return _from_value(policies.effective(name, POLICY_NAME), policies.config)


def _from_value(value: Any, config: BrokerConfig) -> InactiveTopicPolicies:
    """The policies a resolved (topic or namespace) value sets, else the broker's."""
    if value is None:
        return broker_policies(config)
    try:
        return InactiveTopicPolicies.from_json(value)
    except InactivePolicyError:  # pragma: no cover - stored only after the same validation
        return broker_policies(config)


# --- the decisions --------------------------------------------------------------------------
def is_active(mode: str, *, subscriptions: int, backlog: int, connected: int) -> bool:
    """Pulsar's ``isActive``: under ``mode``, does a topic with these counts count as used?"""
    if mode == NO_SUBSCRIPTIONS and subscriptions > 0:
        return True
    if mode == CAUGHT_UP and backlog > 0:
        return True
    return connected > 0


def should_delete(
    policy: InactiveTopicPolicies, inactive_seconds: float, retention_minutes: int
) -> bool:
    """An inactive topic goes once inactive long enough and not kept by retention."""
    if not policy.delete_while_inactive or inactive_seconds < policy.max_inactive_seconds:
        return False
    if retention_minutes < 0:
        return False
    return inactive_seconds >= retention_minutes * 60


# --- one topic, and the broker's periodic pass ------------------------------------------------
def _usage(topic: PersistentTopic) -> tuple[int, int, int]:
    subs = topic.subscriptions.values()
    backlog = sum(s.cursor.number_of_entries_in_backlog for s in subs)
    connected = len(topic.producers) + topic.producers.access.waiting_count
    connected += sum(len(s.consumers) for s in subs)
    # A replicator with entries still to send is in use (Pulsar's checkGC does not collect a
    # replicated topic before its replicators caught up): deleting would lose them.
    connected += sum(1 for r in topic.replication.replicators.values() if r.backlog)
    return len(topic.subscriptions), backlog, connected


async def check_topic(service: BrokerService, topic: PersistentTopic, now: float) -> bool:
    """Look at one topic (``now`` monotonic); delete it if its time has come. True if deleted."""
    # The topic's cached resolution (policy changes bump the store's generation).
    policy = _from_value(topic.policy(POLICY_NAME), service.config)
    if not policy.delete_while_inactive:
        return False
    subscriptions, backlog, connected = _usage(topic)
    if is_active(
        policy.delete_mode, subscriptions=subscriptions, backlog=backlog, connected=connected
    ):
        topic.last_active = now
        return False
    retention = int(topic.policy("retentionTimeInMinutes"))
    if not should_delete(policy, now - topic.last_active, retention):
        return False
    try:
        await service.delete_topic(topic.name)
    except BrokerError as exc:
        # Pulsar: "Did not delete busy topic"; a client may have come back meanwhile.
        log.info("%s: inactive, but not deleted: %s", topic.name, exc.message)
        return False
    log.info("%s: topic deleted successfully due to inactivity", topic.name)
    return True


async def monitor(service: BrokerService) -> None:
    """Every ``brokerDeleteInactiveTopicsFrequencySeconds``, look at every loaded topic."""
    every = float(service.config.brokerDeleteInactiveTopicsFrequencySeconds)
    while True:
        await asyncio.sleep(every)
        now = time.monotonic()
        for topic in list(service.topics.values()):
            if topic.closed or service.topics.get(topic.name.full) is not topic:
                continue
            try:
                await check_topic(service, topic, now)
            except Exception:  # pragma: no cover - keep looking at the others
                log.exception("inactive topic check on %s", topic.name)
