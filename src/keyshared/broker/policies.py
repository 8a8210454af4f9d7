"""Namespace and topic policies: the one owner of where they are stored and how they resolve.

Every policy this broker honours is declared once in :data:`POLICIES`: its field in Pulsar's
namespace ``Policies``, its field in Pulsar's ``TopicPolicies`` and the ``broker.conf`` key that
gives the default. The broker (topics, dispatchers, compaction) and the admin routes both ask
:class:`PolicyService`; nothing else reads the stored records or walks the levels by hand.

The effective value for a topic is its topic policy, else its namespace policy, else the broker
setting. As in Pulsar, a level is *unset* when its value is absent (``null``); for list policies
(``subscription_types_enabled``) an empty list is unset too and falls through to the next level.

Stored in the metadata store as JSON objects: ``namespaces/<tenant>/<ns>`` (the namespace record
itself, as Pulsar keeps ``Policies``; it also holds ``auth_policies``) and
``topic-policies/<persistent://...>``. Every change bumps :attr:`PolicyService.generation` (so
topics cache resolved values cheaply) and tells the listeners (the broker applies it to loaded
topics at once).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from keyshared.storage.metadata import MetadataStore

if TYPE_CHECKING:
    from keyshared.broker.topic_name import TopicName
    from keyshared.config import BrokerConfig

NAMESPACES_PREFIX = "namespaces/"
TOPIC_POLICIES_PREFIX = "topic-policies/"


@dataclass(frozen=True, slots=True)
class Policy:
    """Where one policy lives at each level, and the broker setting it defaults to."""

    namespace_field: str
    """Its field in Pulsar's namespace ``Policies`` (as stored in the namespace record)."""
    topic_field: str
    """Its field in the stored topic policies."""
    broker_key: str
    """The ``broker.conf`` key whose value applies when neither level sets it; empty for a
    structured policy built from several keys (its owning module builds the broker default:
    :meth:`PolicyService.effective` answers None at that level)."""
    empty_is_unset: bool = False
    """An empty value (list) means "not set", as Pulsar treats ``subscription_types_enabled``."""
    unset_value: Any = None
    """A value that also means "not set" (Pulsar's ``UNDEFINED`` schema strategy)."""
    per_cluster: bool = False
    """The namespace field is a map by cluster name (Pulsar's ``publishMaxMessageRate``, ...):
    the value is the local cluster's entry."""
    sets: Callable[[Any], bool] | None = None
    """Whether a value sets the policy, for structured values Pulsar normalizes (a rate with
    no positive limit is unset)."""
    broker_default: Callable[[BrokerConfig], Any] | None = None
    """The broker-level value when it is built from several ``broker.conf`` keys."""

    def is_set(self, value: Any) -> bool:
        """True when ``value`` sets this policy at its level (else the next level applies)."""
        if value is None or (self.unset_value is not None and value == self.unset_value):
            return False
        if self.sets is not None:
            return self.sets(value)
        return not (self.empty_is_unset and not value)

    def default(self, config: BrokerConfig) -> Any:
        """The value when neither the topic nor its namespace sets the policy."""
        if self.broker_default is not None:
            return self.broker_default(config)
        return getattr(config, self.broker_key) if self.broker_key else None

    def namespace_entry(self, record: Mapping[str, Any] | None, cluster: str) -> Any:
        """This policy's raw value in a namespace record (the cluster's entry if per cluster)."""
        value = (record or {}).get(self.namespace_field)
        if self.per_cluster:
            return value.get(cluster) if isinstance(value, dict) else None
        return value


def _limits(value: Any, prefix: str) -> bool:
    """A rate object sets its policy when it limits messages or bytes (Pulsar's normalize)."""
    if not isinstance(value, dict):
        return False
    return any(
        isinstance(v, int) and v > 0
        for v in (value.get(prefix + "Msg"), value.get(prefix + "Byte"))
    )


def _publish_rate(msgs: int, nbytes: int) -> dict[str, int]:
    return {"publishThrottlingRateInMsg": msgs, "publishThrottlingRateInByte": nbytes}


def _dispatch_rate(msgs: int, nbytes: int) -> dict[str, Any]:
    return {
        "dispatchThrottlingRateInMsg": msgs,
        "dispatchThrottlingRateInByte": nbytes,
        "ratePeriodInSecond": 1,
        "relativeToPublishRate": False,
    }


def _same(name: str, broker_key: str, *, empty_is_unset: bool = False) -> Policy:
    return Policy(name, name, broker_key, empty_is_unset)


POLICIES: dict[str, Policy] = {
    "deduplicationEnabled": _same("deduplicationEnabled", "brokerDeduplicationEnabled"),
    "dispatcherPauseOnAckStatePersistentEnabled": _same(
        "dispatcherPauseOnAckStatePersistentEnabled", "dispatcherPauseOnAckStatePersistentEnabled"
    ),
    "message_ttl_in_seconds": _same("message_ttl_in_seconds", "ttlDurationDefaultInSeconds"),
    "retentionTimeInMinutes": _same("retentionTimeInMinutes", "defaultRetentionTimeInMinutes"),
    "retentionSizeInMB": _same("retentionSizeInMB", "defaultRetentionSizeInMB"),
    "delayedDeliveryEnabled": _same("delayedDeliveryEnabled", "delayedDeliveryEnabled"),
    "subscription_types_enabled": _same(
        "subscription_types_enabled", "subscriptionTypesEnabled", empty_is_unset=True
    ),
    # Pulsar names it ``compaction_threshold`` in Policies, ``compactionThreshold`` on topics.
    "compactionThreshold": Policy(
        "compaction_threshold", "compactionThreshold", "brokerServiceCompactionThresholdInBytes"
    ),
    # Limits: 0 means unlimited, at any level, as in Pulsar.
    "maxProducersPerTopic": Policy(
        "max_producers_per_topic", "maxProducersPerTopic", "maxProducersPerTopic"
    ),
    "maxConsumersPerTopic": Policy(
        "max_consumers_per_topic", "maxConsumersPerTopic", "maxConsumersPerTopic"
    ),
    "maxConsumersPerSubscription": Policy(
        "max_consumers_per_subscription",
        "maxConsumersPerSubscription",
        "maxConsumersPerSubscription",
    ),
    "maxSubscriptionsPerTopic": Policy(
        "max_subscriptions_per_topic", "maxSubscriptionsPerTopic", "maxSubscriptionsPerTopic"
    ),
    # Schemas (broker/schema/): Pulsar's Policies and TopicPolicies fields.
    "schemaCompatibilityStrategy": Policy(
        "schema_compatibility_strategy",
        "schemaCompatibilityStrategy",
        "schemaCompatibilityStrategy",
        unset_value="UNDEFINED",
    ),
    "isAllowAutoUpdateSchema": Policy(
        "is_allow_auto_update_schema", "isAllowAutoUpdateSchema", "isAllowAutoUpdateSchema"
    ),
    "schemaValidationEnforced": Policy(
        "schema_validation_enforced", "schemaValidationEnforced", "isSchemaValidationEnforced"
    ),
    # A namespace-only policy: resolved by namespace_effective.
    "maxTopicsPerNamespace": Policy(
        "max_topics_per_namespace", "maxTopicsPerNamespace", "maxTopicsPerNamespace"
    ),
    # --- backlog quotas and inactive topics (broker/backlog_quota.py,
    # broker/inactive_topics.py). Structured policies: their broker defaults come from several
    # broker.conf keys, built by those modules. The quota map (quota type -> BacklogQuota
    # JSON) resolves per type (PolicyService.effective_entry), as Pulsar merges it; Pulsar
    # spells the topic field ``backLogQuotaMap``. InactiveTopicPolicies resolve whole.
    "backlogQuotaMap": Policy("backlog_quota_map", "backLogQuotaMap", "", empty_is_unset=True),
    "inactiveTopicPolicies": Policy("inactive_topic_policies", "inactiveTopicPolicies", ""),
    # --- end of backlog quotas and inactive topics
    # --- Rate limits (broker/throttle.py) ------------------------------------------------------
    # Pulsar's PublishRate and DispatchRate objects. In the namespace's Policies each is a map
    # by cluster name (``topicDispatchRate`` is the 2.x ``clusterDispatchRate``); a rate with
    # no positive limit is unset, as Pulsar's normalize() makes it, and the next level applies.
    "publishRate": Policy(
        "publishMaxMessageRate",
        "publishRate",
        "maxPublishRatePerTopicInMessages",
        per_cluster=True,
        sets=lambda v: _limits(v, "publishThrottlingRateIn"),
        broker_default=lambda c: _publish_rate(
            c.maxPublishRatePerTopicInMessages, c.maxPublishRatePerTopicInBytes
        ),
    ),
    "dispatchRate": Policy(
        "topicDispatchRate",
        "dispatchRate",
        "dispatchThrottlingRatePerTopicInMsg",
        per_cluster=True,
        sets=lambda v: _limits(v, "dispatchThrottlingRateIn"),
        broker_default=lambda c: _dispatch_rate(
            c.dispatchThrottlingRatePerTopicInMsg, c.dispatchThrottlingRatePerTopicInByte
        ),
    ),
    "subscriptionDispatchRate": Policy(
        "subscriptionDispatchRate",
        "subscriptionDispatchRate",
        "dispatchThrottlingRatePerSubscriptionInMsg",
        per_cluster=True,
        sets=lambda v: _limits(v, "dispatchThrottlingRateIn"),
        broker_default=lambda c: _dispatch_rate(
            c.dispatchThrottlingRatePerSubscriptionInMsg,
            c.dispatchThrottlingRatePerSubscriptionInByte,
        ),
    ),
}
"""Every policy the broker resolves, by the name callers use."""

SUBSCRIPTION_POLICIES: dict[str, str] = {"subscriptionDispatchRate": "dispatchRate"}
"""Policies a single subscription may set (Pulsar's ``SubscriptionPolicies`` field, kept in the
topic's policies under ``subscriptionPolicies.<subscription>``), by policy name."""

POLICY_DEFAULTS: dict[str, str] = {
    name: p.broker_key for name, p in POLICIES.items() if p.broker_key
}
"""Policy name -> the ``broker.conf`` key of its default (structured policies have none)."""


class PolicyService:
    """Reads, writes and resolves namespace and topic policies (topic > namespace > broker)."""

    def __init__(self, metadata: MetadataStore, config: BrokerConfig) -> None:
        self.metadata = metadata
        self.config = config
        # Bumped on every change, so topics can cache resolved values cheaply.
        self.generation = 0
        self._listeners: list[Callable[[], None]] = []

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every policy change."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        self.generation += 1
        for listener in list(self._listeners):
            listener()

    # --- resolution ----------------------------------------------------------------------
    def effective(self, topic: TopicName, name: str) -> Any:
        """Policy ``name`` in force on ``topic``: topic policy, else namespace policy, else the
        broker setting."""
        policy = POLICIES[name]
        for level in self._topic_levels(topic):
            value = level.get(policy.topic_field)
            if policy.is_set(value):
                return value
        value = policy.namespace_entry(self.namespace(topic.namespace_name), self._cluster)
        if policy.is_set(value):
            return value
        return policy.default(self.config)

    def _topic_levels(self, topic: TopicName) -> list[dict[str, Any]]:
        """The topic policies that apply to ``topic``: its own, then, for a partition, its
        partitioned topic's (Pulsar keeps topic policies under the partitioned topic's name,
        so a policy set on a partitioned topic reaches every partition)."""
        levels = [self.topic(topic.full)]
        if topic.partition_index >= 0:
            levels.append(self.topic(topic.partitioned_base.full))
        return levels

    def effective_entry(self, topic: TopicName, name: str, key: str) -> Any:
        """For a map policy (``backlogQuotaMap``: quota type -> quota), the entry ``key`` in
        force on ``topic``: the topic's entry, else the namespace's, else None (the owning
        module applies the broker default). Pulsar resolves its backlog quotas per type this
        way, so a topic may set a time quota and inherit the namespace's size quota."""
        policy = POLICIES[name]
        maps = [level.get(policy.topic_field) for level in self._topic_levels(topic)]
        maps.append((self.namespace(topic.namespace_name) or {}).get(policy.namespace_field))
        for found in maps:
            if isinstance(found, dict) and found.get(key) is not None:
                return found[key]
        return None

    @property
    def _cluster(self) -> str:
        return self.config.clusterName

    def subscription_effective(self, topic: TopicName, subscription: str, name: str) -> Any:
        """Policy ``name`` in force on ``subscription`` of ``topic``: its own, else the topic's
        resolution."""
        value = self.subscription_value(topic, subscription, name)
        return self.effective(topic, name) if value is None else value

    def subscription_value(self, topic: TopicName, subscription: str, name: str) -> Any:
        """Policy ``name`` as set on ``subscription`` itself (None when unset)."""
        policy = POLICIES[name]
        field = SUBSCRIPTION_POLICIES[name]
        for level in dict.fromkeys((topic.full, topic.partitioned_base.full)):
            subs = self.topic(level).get("subscriptionPolicies")
            own = subs.get(subscription) if isinstance(subs, dict) else None
            value = own.get(field) if isinstance(own, dict) else None
            if policy.is_set(value):
                return value
        return None

    def update_subscription(self, topic: str, subscription: str, name: str, value: Any) -> None:
        """Set (None removes) policy ``name`` of one subscription of ``topic``."""
        field = SUBSCRIPTION_POLICIES[name]
        subs = self.topic(topic).get("subscriptionPolicies")
        subs = dict(subs) if isinstance(subs, dict) else {}
        own = dict(subs.get(subscription) or {})
        if value is None:
            own.pop(field, None)
        else:
            own[field] = value
        if own:
            subs[subscription] = own
        else:
            subs.pop(subscription, None)
        self._write_topic(topic, {"subscriptionPolicies": subs or None})

    def namespace_effective(self, namespace: str, name: str) -> Any:
        """Policy ``name`` in force on ``namespace``: its own value, else the broker setting."""
        value = self.namespace_value(namespace, name)
        return POLICIES[name].default(self.config) if value is None else value

    def enabled_sub_types(self, topic: TopicName) -> frozenset[str]:
        """Subscription types ``topic`` accepts (``subscriptionTypesEnabled`` resolved)."""
        from keyshared.broker.sub_types import parse_types

        return parse_types(self.effective(topic, "subscription_types_enabled"))

    # --- one level's value ---------------------------------------------------------------
    def namespace_value(self, namespace: str, name: str) -> Any:
        """Policy ``name`` as set on ``namespace`` itself (None when unset)."""
        policy = POLICIES[name]
        value = policy.namespace_entry(self.namespace(namespace), self._cluster)
        return value if policy.is_set(value) else None

    def topic_value(self, topic: str, name: str) -> Any:
        """Policy ``name`` as set on ``topic`` itself (None when unset)."""
        policy = POLICIES[name]
        value = self.topic(topic).get(policy.topic_field)
        return value if policy.is_set(value) else None

    def update_namespace(self, namespace: str, values: Mapping[str, Any]) -> None:
        """Set policies (by name; None removes one) on ``namespace`` in one change."""
        record = self.namespace(namespace) or {}
        fields: dict[str, Any] = {}
        for name, value in values.items():
            policy = POLICIES[name]
            if policy.per_cluster:
                by_cluster = record.get(policy.namespace_field)
                merged = dict(by_cluster) if isinstance(by_cluster, dict) else {}
                if value is None:
                    merged.pop(self._cluster, None)
                else:
                    merged[self._cluster] = value
                value = merged or None
            fields[policy.namespace_field] = value
        self._write_namespace(namespace, fields)

    def update_topic(self, topic: str, values: Mapping[str, Any]) -> None:
        """Set policies (by name; None removes one) on ``topic`` in one change."""
        fields = {POLICIES[name].topic_field: v for name, v in values.items()}
        self._write_topic(topic, fields)

    # --- namespaces ----------------------------------------------------------------------
    def namespace(self, namespace: str) -> dict[str, Any] | None:
        """The namespace's stored record, or None if the namespace does not exist."""
        value = self.metadata.get_json(NAMESPACES_PREFIX + namespace)
        return dict(value) if isinstance(value, dict) else None

    def namespace_exists(self, namespace: str) -> bool:
        """True if ``tenant/namespace`` exists."""
        return self.metadata.get(NAMESPACES_PREFIX + namespace) is not None

    def namespaces_of(self, tenant: str) -> list[str]:
        """``tenant/ns`` names of the tenant's namespaces."""
        prefix = NAMESPACES_PREFIX + tenant + "/"
        return [k[len(NAMESPACES_PREFIX) :] for k in self.metadata.list_keys(prefix)]

    def create_namespace(self, namespace: str, record: Mapping[str, Any] | None = None) -> None:
        """Create ``namespace`` with its initial stored record (raw ``Policies`` fields)."""
        self.metadata.put_json(NAMESPACES_PREFIX + namespace, dict(record or {}))
        self._changed()

    def delete_namespace(self, namespace: str) -> None:
        """Forget ``namespace`` and its policies."""
        self.metadata.delete(NAMESPACES_PREFIX + namespace)
        self._changed()

    def set_namespace(self, namespace: str, field: str, value: Any) -> None:
        """Set (or with ``value=None`` remove) one raw field of the namespace record."""
        self._write_namespace(namespace, {field: value})

    def _write_namespace(self, namespace: str, fields: Mapping[str, Any]) -> None:
        record = self.namespace(namespace) or {}
        for field, value in fields.items():
            if value is None:
                record.pop(field, None)
            else:
                record[field] = value
        self.metadata.put_json(NAMESPACES_PREFIX + namespace, record)
        self._changed()

    # --- permissions (Pulsar's Policies.auth_policies.namespace_auth) -----------------------
    def namespace_permissions(self, namespace: str) -> dict[str, list[str]]:
        """``role -> actions`` granted on ``namespace`` (empty when none or no namespace)."""
        auth = (self.namespace(namespace) or {}).get("auth_policies")
        granted = auth.get("namespace_auth") if isinstance(auth, dict) else None
        if not isinstance(granted, dict):
            return {}
        return {
            role: [a for a in actions if isinstance(a, str)]
            for role, actions in granted.items()
            if isinstance(actions, list)
        }

    def set_namespace_permission(
        self, namespace: str, role: str, actions: list[str] | None
    ) -> bool:
        """Grant ``actions`` to ``role`` (replacing its grant; None revokes). False when the
        namespace does not exist."""
        record = self.namespace(namespace)
        if record is None:
            return False
        auth = record.setdefault("auth_policies", {})
        granted = auth.setdefault("namespace_auth", {})
        auth.setdefault("destination_auth", {})
        auth.setdefault("subscription_auth_roles", {})
        if actions is None:
            granted.pop(role, None)
        else:
            granted[role] = sorted(set(actions))
        self.metadata.put_json(NAMESPACES_PREFIX + namespace, record)
        self._changed()
        return True

    # --- topics --------------------------------------------------------------------------
    def topic(self, topic: str) -> dict[str, Any]:
        """The topic's own stored policies (empty if none)."""
        value = self.metadata.get_json(TOPIC_POLICIES_PREFIX + topic)
        return dict(value) if isinstance(value, dict) else {}

    def set_topic(self, topic: str, field: str, value: Any) -> None:
        """Set (or with ``value=None`` remove) one raw field of the topic's policies."""
        self._write_topic(topic, {field: value})

    def _write_topic(self, topic: str, fields: Mapping[str, Any]) -> None:
        policies = self.topic(topic)
        for field, value in fields.items():
            if value is None:
                policies.pop(field, None)
            else:
                policies[field] = value
        if policies:
            self.metadata.put_json(TOPIC_POLICIES_PREFIX + topic, policies)
        else:
            self.metadata.delete(TOPIC_POLICIES_PREFIX + topic)
        self._changed()

    def delete_topic(self, topic: str) -> None:
        """Forget a deleted topic's policies."""
        self.metadata.delete(TOPIC_POLICIES_PREFIX + topic)
        self._changed()
