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

RETENTION_TIME = "retentionTimeInMinutes"
RETENTION_SIZE = "retentionSizeInMB"
DEDUPLICATION = "deduplicationEnabled"
MESSAGE_TTL = "message_ttl_in_seconds"
PAUSE_ON_ACK_STATE = "dispatcherPauseOnAckStatePersistentEnabled"


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


class NamespacePolicies(BaseModel):
    """The part of Pulsar's ``Policies`` this broker honours when a namespace is created."""

    model_config = ConfigDict(extra="ignore")

    deduplicationEnabled: bool | None = None
    message_ttl_in_seconds: Int64 | None = None
    retention_policies: RetentionPolicies | None = None
    dispatcherPauseOnAckStatePersistentEnabled: bool | None = None

    def flat(self) -> dict[str, Any]:
        """The stored (flat) policy keys this body sets."""
        out: dict[str, Any] = {}
        if self.deduplicationEnabled is not None:
            out[DEDUPLICATION] = self.deduplicationEnabled
        if self.message_ttl_in_seconds is not None:
            out[MESSAGE_TTL] = check_ttl(self.message_ttl_in_seconds)
        if self.retention_policies is not None:
            self.retention_policies.validate_pulsar()
            out[RETENTION_TIME] = self.retention_policies.retentionTimeInMinutes
            out[RETENTION_SIZE] = self.retention_policies.retentionSizeInMB
        if self.dispatcherPauseOnAckStatePersistentEnabled is not None:
            out[PAUSE_ON_ACK_STATE] = self.dispatcherPauseOnAckStatePersistentEnabled
        return out


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
        "replication_clusters": [cluster],
        "deduplicationEnabled": policies.get(DEDUPLICATION),
        "message_ttl_in_seconds": policies.get(MESSAGE_TTL),
        "retention_policies": retention_of(policies),
        "dispatcherPauseOnAckStatePersistentEnabled": policies.get(PAUSE_ON_ACK_STATE),
        "deleted": False,
    }
