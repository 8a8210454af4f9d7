"""Namespace and topic policies, resolved topic over namespace over broker setting.

Stored in the metadata store as JSON objects with Pulsar's policy field names:
``namespaces/<tenant>/<ns>`` (the namespace record itself, as Pulsar keeps ``Policies``) and
``topic-policies/<persistent://...>`` (Pulsar's ``TopicPolicies``).
"""

from __future__ import annotations

from typing import Any

from keyshared.storage.metadata import MetadataStore

NAMESPACES_PREFIX = "namespaces/"
TOPIC_POLICIES_PREFIX = "topic-policies/"

# Pulsar's field names of the policies this broker honours, with the broker.conf key that
# gives the default when neither the topic nor the namespace sets one.
POLICY_DEFAULTS: dict[str, str] = {
    "deduplicationEnabled": "brokerDeduplicationEnabled",
    "dispatcherPauseOnAckStatePersistentEnabled": "dispatcherPauseOnAckStatePersistentEnabled",
    "message_ttl_in_seconds": "ttlDurationDefaultInSeconds",
    "retentionTimeInMinutes": "defaultRetentionTimeInMinutes",
    "retentionSizeInMB": "defaultRetentionSizeInMB",
    "delayedDeliveryEnabled": "delayedDeliveryEnabled",
}


class PolicyStore:
    """Reads and writes namespace and topic policies."""

    def __init__(self, metadata: MetadataStore) -> None:
        self.metadata = metadata
        # Bumped on every change, so topics can cache resolved values cheaply.
        self.generation = 0

    # --- namespaces ----------------------------------------------------------------------
    def namespace(self, namespace: str) -> dict[str, Any] | None:
        """The namespace's policies object, or None if the namespace does not exist."""
        value = self.metadata.get_json(NAMESPACES_PREFIX + namespace)
        return dict(value) if isinstance(value, dict) else None

    def set_namespace(self, namespace: str, key: str, value: Any) -> None:
        """Set (or with ``value=None`` remove) one namespace policy."""
        policies = self.namespace(namespace) or {}
        if value is None:
            policies.pop(key, None)
        else:
            policies[key] = value
        self.metadata.put_json(NAMESPACES_PREFIX + namespace, policies)
        self.generation += 1

    # --- topics --------------------------------------------------------------------------
    def topic(self, topic: str) -> dict[str, Any]:
        """The topic's own policies (empty if none)."""
        value = self.metadata.get_json(TOPIC_POLICIES_PREFIX + topic)
        return dict(value) if isinstance(value, dict) else {}

    def set_topic(self, topic: str, key: str, value: Any) -> None:
        """Set (or with ``value=None`` remove) one topic policy."""
        policies = self.topic(topic)
        if value is None:
            policies.pop(key, None)
        else:
            policies[key] = value
        if policies:
            self.metadata.put_json(TOPIC_POLICIES_PREFIX + topic, policies)
        else:
            self.metadata.delete(TOPIC_POLICIES_PREFIX + topic)
        self.generation += 1

    def delete_topic(self, topic: str) -> None:
        """Forget a deleted topic's policies."""
        self.metadata.delete(TOPIC_POLICIES_PREFIX + topic)
        self.generation += 1

    # --- resolution ----------------------------------------------------------------------
    def resolve(self, topic: str, namespace: str, key: str, broker_default: Any) -> Any:
        """Topic policy, else namespace policy, else ``broker_default``."""
        value = self.topic(topic).get(key)
        if value is not None:
            return value
        ns = self.namespace(namespace) or {}
        value = ns.get(key)
        return broker_default if value is None else value
