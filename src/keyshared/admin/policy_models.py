"""The policy bodies of the admin API, with Pulsar's JSON field names and validation rules.

Policies are stored flat in the policy store (``retentionTimeInMinutes``, ``retentionSizeInMB``,
``message_ttl_in_seconds``, ``deduplicationEnabled``, ...), which is what topics resolve; these
helpers convert to and from the nested shapes Pulsar's REST API uses (``RetentionPolicies``,
``Policies``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from keyshared.admin.rest import Int64, RestError
from keyshared.broker import backlog_quota, inactive_topics
from keyshared.broker.sub_types import parse_types
from keyshared.config import SCHEMA_STRATEGIES

RETENTION_TIME = "retentionTimeInMinutes"
RETENTION_SIZE = "retentionSizeInMB"
DEDUPLICATION = "deduplicationEnabled"
MESSAGE_TTL = "message_ttl_in_seconds"
PAUSE_ON_ACK_STATE = "dispatcherPauseOnAckStatePersistentEnabled"
SUB_TYPES = "subscription_types_enabled"
COMPACTION_THRESHOLD = "compaction_threshold"
SCHEMA_STRATEGY = "schema_compatibility_strategy"
SCHEMA_AUTO_UPDATE = "is_allow_auto_update_schema"
SCHEMA_VALIDATION = "schema_validation_enforced"
BACKLOG_QUOTA_MAP = "backlog_quota_map"
INACTIVE_TOPIC_POLICIES = "inactive_topic_policies"


class RetentionPolicies(BaseModel):
    """Pulsar's ``RetentionPolicies``: -1 means no limit; both 0 means no retention."""

    model_config = ConfigDict(extra="ignore")

    retentionTimeInMinutes: Int64 = 0
    retentionSizeInMB: Int64 = 0

    def validate_pulsar(self) -> None:
        """Pulsar's ``validateRetentionPolicies`` (412 when it fails)."""
        t, s = self.retentionTimeInMinutes, self.retentionSizeInMB
        if s < -1:
            raise RestError(412, "Invalid retention policy: size limit must be >= -1")
        if t < -1:
            raise RestError(412, "Invalid retention policy: time limit must be >= -1")
        if (t == 0) != (s == 0):
            raise RestError(
                412,
                "Invalid retention policy: Setting a single time or size limit to 0 is invalid "
                "when one of the limits has a non-zero value. Use the value of -1 instead of 0 "
                "to ignore a specific limit. To disable retention both limits must be set to 0.",
            )


# Fields of Pulsar's ``Policies`` this broker does not implement, with the value that asks for
# nothing (Pulsar's default, which its Java client sends for every field of a new Policies). Any
# other value is refused by name. Fields not listed here default to "empty" (null, false, 0, "",
# [] or {}).
_UNSUPPORTED_DEFAULTS: dict[str, Any] = {
    "offload_threshold": -1,
    "offload_threshold_in_seconds": -1,
    "subscription_auth_mode": "None",
    "schema_auto_update_compatibility_strategy": "Full",
}
# Accepted whatever their value, with the reason: one broker owns every bundle of every
# namespace, and ``deleted`` is Pulsar's own bookkeeping.
NAMESPACE_NO_OPS: dict[str, str] = {
    "bundles": "one broker owns every bundle",
    "deleted": "Pulsar's deletion marker, not a policy",
}
_AUTH_FIELDS = ("namespace_auth", "destination_auth", "subscription_auth_roles")
_ACTIONS = frozenset({"produce", "consume", "functions", "sources", "sinks", "packages"})


def _asks_nothing(field: str, value: Any) -> bool:
    if field in _UNSUPPORTED_DEFAULTS:
        return bool(value == _UNSUPPORTED_DEFAULTS[field])
    return value is None or value is False or value == 0 or value in ("", [], {})


class NamespacePolicies:
    """A ``PUT /admin/v2/namespaces/{t}/{ns}`` body: Pulsar's ``Policies``, honoured whole.

    Every field this broker implements is applied; a field it does not implement is accepted only
    with the value that asks for nothing, and otherwise refused by name (501).
    """

    def __init__(self, body: Any) -> None:
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise RestError(400, "The namespace policies must be a JSON object (Policies)")
        self.body: dict[str, Any] = body

    def _get(self, key: str, kind: type) -> Any:
        value = self.body.get(key)
        if value is None:
            return None
        # JSON true/false must not pass for a number, nor a number for a boolean.
        fits = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
        if not fits:
            raise RestError(400, f"Invalid value for Policies field {key}: {value!r}")
        return value

    def unsupported(self) -> list[str]:
        """Fields set to something this broker does not implement."""
        return sorted(
            key
            for key, value in self.body.items()
            if key not in _HANDLED and key not in NAMESPACE_NO_OPS and not _asks_nothing(key, value)
        )

    def replication_clusters(self) -> list[str]:
        """The ``replication_clusters`` asked for (empty: the local cluster)."""
        value = self._get("replication_clusters", list)
        if value is None:
            return []
        if not all(isinstance(c, str) for c in value):
            raise RestError(400, "Invalid value for Policies field replication_clusters")
        return sorted(set(value))

    def auth_policies(self) -> dict[str, Any] | None:
        """``auth_policies`` checked (None when not given or empty)."""
        auth = self._get("auth_policies", dict)
        if not auth:
            return None
        unknown = sorted(set(auth) - set(_AUTH_FIELDS))
        if unknown:
            raise RestError(400, f"Unknown auth_policies field(s): {', '.join(unknown)}")
        out: dict[str, Any] = {}
        for field in _AUTH_FIELDS:
            value = auth.get(field) or {}
            if not isinstance(value, dict):
                raise RestError(400, f"Invalid value for auth_policies.{field}")
            out[field] = value
        for role, actions in out["namespace_auth"].items():
            if not isinstance(actions, list) or not set(actions) <= _ACTIONS:
                raise RestError(400, f"Invalid actions for role {role!r} in namespace_auth")
            out["namespace_auth"][role] = sorted(set(actions))
        if not any(out.values()):
            return None
        return out

    def flat(self) -> dict[str, Any]:
        """The stored (flat) policy keys this body sets (501 naming what is not implemented)."""
        unsupported = self.unsupported()
        if unsupported:
            raise RestError(
                501, f"Namespace policies not implemented by keyshared: {', '.join(unsupported)}"
            )
        out: dict[str, Any] = {}
        dedup = self._get(DEDUPLICATION, bool)
        if dedup is not None:
            out[DEDUPLICATION] = dedup
        ttl = self._get(MESSAGE_TTL, int)
        if ttl is not None:
            out[MESSAGE_TTL] = check_ttl(ttl)
        retention = self._get("retention_policies", dict)
        if retention is not None:
            try:
                model = RetentionPolicies.model_validate(retention)
            except ValueError:
                raise RestError(
                    400, "Invalid value for Policies field retention_policies"
                ) from None
            model.validate_pulsar()
            out[RETENTION_TIME] = model.retentionTimeInMinutes
            out[RETENTION_SIZE] = model.retentionSizeInMB
        pause = self._get(PAUSE_ON_ACK_STATE, bool)
        if pause is not None:
            out[PAUSE_ON_ACK_STATE] = pause
        types = self._get(SUB_TYPES, list)
        if types:
            try:
                parse_types(types)
            except (ValueError, AttributeError) as exc:
                raise RestError(412, str(exc)) from None
            out[SUB_TYPES] = sorted(set(types))
        for field, policy in LIMIT_FIELDS.items():
            limit = self._get(field, int)
            if limit is not None:
                if limit < 0:
                    raise RestError(412, f"{policy} must be 0 or more")
                out[field] = limit
        threshold = self._get(COMPACTION_THRESHOLD, int)
        if threshold is not None:
            if threshold < 0:
                raise RestError(412, "compactionThreshold must be 0 or more")
            out[COMPACTION_THRESHOLD] = threshold
        strategy = self._get(SCHEMA_STRATEGY, str)
        if strategy is not None and strategy != "UNDEFINED":
            if strategy not in SCHEMA_STRATEGIES:
                raise RestError(412, f"Invalid schema compatibility strategy {strategy}")
            out[SCHEMA_STRATEGY] = strategy
        for flag in (SCHEMA_AUTO_UPDATE, SCHEMA_VALIDATION):
            value = self._get(flag, bool)
            if value is not None:
                out[flag] = value
        quotas = self._get(BACKLOG_QUOTA_MAP, dict)
        if quotas:
            out[BACKLOG_QUOTA_MAP] = _quota_map(quotas)
        inactive = self._get(INACTIVE_TOPIC_POLICIES, dict)
        if inactive is not None:
            try:
                inactive_policy = inactive_topics.InactiveTopicPolicies.from_json(inactive)
            except inactive_topics.InactivePolicyError as exc:
                raise RestError(
                    400, f"Invalid value for Policies field {INACTIVE_TOPIC_POLICIES}: {exc}"
                ) from None
            out[INACTIVE_TOPIC_POLICIES] = inactive_policy.to_json()
        return out


def _quota_map(quotas: dict[str, Any]) -> dict[str, Any]:
    """A ``backlog_quota_map`` checked (400 naming what is wrong), as stored."""
    out: dict[str, Any] = {}
    for kind, body in quotas.items():
        try:
            backlog_quota.check_quota_type(kind)
            out[kind] = backlog_quota.BacklogQuota.from_json(body).to_json()
        except backlog_quota.QuotaError as exc:
            raise RestError(
                400, f"Invalid value for Policies field {BACKLOG_QUOTA_MAP}: {exc}"
            ) from None
    return out


# Pulsar's Policies fields of the limits (broker/limits.py), by policy name.
LIMIT_FIELDS: dict[str, str] = {
    "max_producers_per_topic": "maxProducersPerTopic",
    "max_consumers_per_topic": "maxConsumersPerTopic",
    "max_consumers_per_subscription": "maxConsumersPerSubscription",
    "max_subscriptions_per_topic": "maxSubscriptionsPerTopic",
    "max_topics_per_namespace": "maxTopicsPerNamespace",
}

_HANDLED = frozenset(
    {
        *LIMIT_FIELDS,
        "auth_policies",
        "replication_clusters",
        DEDUPLICATION,
        MESSAGE_TTL,
        "retention_policies",
        PAUSE_ON_ACK_STATE,
        SUB_TYPES,
        COMPACTION_THRESHOLD,
        SCHEMA_STRATEGY,
        SCHEMA_AUTO_UPDATE,
        SCHEMA_VALIDATION,
        BACKLOG_QUOTA_MAP,
        INACTIVE_TOPIC_POLICIES,
    }
)


# Pulsar's Policies fields of the rate limits (admin/routes_rates.py): maps by cluster name.
RATE_FIELDS = ("publishMaxMessageRate", "topicDispatchRate", "subscriptionDispatchRate")


def check_ttl(ttl: int) -> int:
    """A message TTL in seconds; Pulsar refuses negative ones (412)."""
    if ttl < 0:
        raise RestError(412, "Invalid value for message TTL")
    return ttl


def retention_of(policies: dict[str, Any]) -> dict[str, int] | None:
    """``RetentionPolicies`` from stored flat keys (None when not set)."""
    t, s = policies.get(RETENTION_TIME), policies.get(RETENTION_SIZE)
    if t is None and s is None:
        return None
    return {RETENTION_TIME: int(t or 0), RETENTION_SIZE: int(s or 0)}


def namespace_view(
    policies: dict[str, Any], permissions: dict[str, list[str]], cluster: str
) -> dict[str, Any]:
    """A namespace's stored record as Pulsar's ``Policies`` JSON (the fields this broker uses)."""
    auth = policies.get("auth_policies")
    if not isinstance(auth, dict):
        auth = {}
    return {
        "auth_policies": {
            "namespace_auth": permissions,
            "destination_auth": auth.get("destination_auth", {}),
            "subscription_auth_roles": auth.get("subscription_auth_roles", {}),
        },
        "replication_clusters": policies.get("replication_clusters") or [cluster],
        "deduplicationEnabled": policies.get(DEDUPLICATION),
        "message_ttl_in_seconds": policies.get(MESSAGE_TTL),
        "retention_policies": retention_of(policies),
        "dispatcherPauseOnAckStatePersistentEnabled": policies.get(PAUSE_ON_ACK_STATE),
        SUB_TYPES: policies.get(SUB_TYPES) or [],
        COMPACTION_THRESHOLD: policies.get(COMPACTION_THRESHOLD),
        SCHEMA_STRATEGY: policies.get(SCHEMA_STRATEGY) or "UNDEFINED",
        SCHEMA_AUTO_UPDATE: policies.get(SCHEMA_AUTO_UPDATE),
        SCHEMA_VALIDATION: bool(policies.get(SCHEMA_VALIDATION)),
        **{field: policies.get(field) for field in LIMIT_FIELDS},
        BACKLOG_QUOTA_MAP: policies.get(BACKLOG_QUOTA_MAP) or {},
        INACTIVE_TOPIC_POLICIES: policies.get(INACTIVE_TOPIC_POLICIES),
        **{field: policies.get(field) or {} for field in RATE_FIELDS},
        "deleted": False,
    }
