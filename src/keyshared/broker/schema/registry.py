"""Versioned schemas per topic, stored in the metadata store and survive restarts.

One record per topic under ``schemas/<persistent://tenant/ns/topic>`` (a partition's schema is
its partitioned topic's): the list of versions, oldest first, version N at index N. As in
Pulsar, deleting a topic's schema leaves a tombstone so that version numbers never go back.
The compatibility strategy, auto-update and validation flags come from the policy owner
(topic > namespace > ``broker.conf``).
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.schema.compatibility import (
    Definition,
    IncompatibleSchemaError,
    check_compatible,
)
from keyshared.storage.metadata import MetadataStore

if TYPE_CHECKING:
    from keyshared.broker.policies import PolicyService
    from keyshared.broker.topic_name import TopicName

SCHEMAS_PREFIX = "schemas/"
NONE_TYPE = 0  # Schema.Type NONE (Pulsar's BYTES on the wire): "no schema"


def version_bytes(version: int) -> bytes:
    """A version as Pulsar's ``LongSchemaVersion`` on the wire: 8 bytes big-endian."""
    return version.to_bytes(8, "big", signed=True)


def version_of(raw: bytes) -> int:
    """The version ``raw`` (8 bytes big-endian) names; ValueError if it is not 8 bytes."""
    if len(raw) != 8:
        raise ValueError(f"Invalid schema version: {len(raw)} bytes, expected 8")
    return int.from_bytes(raw, "big", signed=True)


@dataclass(frozen=True, slots=True)
class StoredSchema:
    """One version of a topic's schema."""

    version: int
    type: int
    data: bytes
    properties: dict[str, str] = field(default_factory=dict)
    timestamp: int = 0

    @property
    def definition(self) -> Definition:
        """Type and definition, for the compatibility rules."""
        return Definition(self.type, self.data)

    def to_json(self) -> dict[str, Any]:
        """The stored form."""
        return {
            "version": self.version,
            "type": self.type,
            "data": base64.b64encode(self.data).decode(),
            "properties": self.properties,
            "timestamp": self.timestamp,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StoredSchema:
        """Back from the stored form."""
        return cls(
            int(d["version"]),
            int(d["type"]),
            base64.b64decode(d["data"]),
            dict(d.get("properties") or {}),
            int(d.get("timestamp", 0)),
        )


def _incompatible(message: str) -> BrokerError:
    return BrokerError(ServerError.IncompatibleSchema, message)


class SchemaRegistry:
    """Pulsar's schema registry service for one broker."""

    def __init__(self, metadata: MetadataStore, policies: PolicyService) -> None:
        self.metadata = metadata
        self.policies = policies

    @staticmethod
    def _key(topic: TopicName) -> str:
        return SCHEMAS_PREFIX + topic.partitioned_base.full

    def _record(self, topic: TopicName) -> dict[str, Any]:
        value = self.metadata.get_json(self._key(topic))
        return value if isinstance(value, dict) else {"versions": [], "deleted_at": -1}

    def versions(self, topic: TopicName) -> list[StoredSchema]:
        """Every live version of ``topic``'s schema, oldest first (empty after a delete)."""
        record = self._record(topic)
        live_from = int(record.get("deleted_at", -1)) + 1
        return [
            StoredSchema.from_json(v)
            for v in record.get("versions", [])
            if v["version"] >= live_from
        ]

    def get(self, topic: TopicName, version: int | None = None) -> StoredSchema | None:
        """The latest version, or version ``version``; None when there is none."""
        versions = self.versions(topic)
        if not versions:
            return None
        if version is None:
            return versions[-1]
        for s in versions:
            if s.version == version:
                return s
        return None

    # --- resolved policies -------------------------------------------------------------------
    def strategy(self, topic: TopicName) -> str:
        """The compatibility strategy in force on ``topic``."""
        return str(self.policies.effective(topic, "schemaCompatibilityStrategy"))

    def allow_auto_update(self, topic: TopicName) -> bool:
        """Whether a new compatible version may be added by a producer."""
        return bool(self.policies.effective(topic, "isAllowAutoUpdateSchema"))

    def validation_enforced(self, topic: TopicName) -> bool:
        """Whether a producer without a schema is refused on a topic with one."""
        return bool(self.policies.effective(topic, "schemaValidationEnforced"))

    # --- changes ----------------------------------------------------------------------------
    def _find(self, versions: list[StoredSchema], type_: int, data: bytes) -> StoredSchema | None:
        for s in reversed(versions):
            if s.type == type_ and s.data == data:
                return s
        return None

    def check(self, topic: TopicName, type_: int, data: bytes) -> None:
        """Raise IncompatibleSchema unless the schema could be added to ``topic`` now."""
        versions = self.versions(topic)
        if self._find(versions, type_, data) is not None:
            return
        try:
            check_compatible(
                Definition(type_, data), [v.definition for v in versions], self.strategy(topic)
            )
        except IncompatibleSchemaError as exc:
            raise _incompatible(str(exc)) from None

    def _add(
        self, topic: TopicName, type_: int, data: bytes, properties: dict[str, str]
    ) -> StoredSchema:
        record = self._record(topic)
        stored = record.setdefault("versions", [])
        version = int(stored[-1]["version"]) + 1 if stored else 0
        schema = StoredSchema(version, type_, data, properties, int(time.time() * 1000))
        stored.append(schema.to_json())
        self.metadata.put_json(self._key(topic), record)
        return schema

    def put(
        self,
        topic: TopicName,
        type_: int,
        data: bytes,
        properties: dict[str, str],
        *,
        auto_update: bool = True,
    ) -> StoredSchema:
        """The version of this schema on ``topic``: an existing one with the same type and
        definition, else a new version once the strategy allows it (IncompatibleSchema when it
        does not, or when ``auto_update`` is off and the topic already has a schema)."""
        versions = self.versions(topic)
        found = self._find(versions, type_, data)
        if found is not None:
            return found
        if versions and not auto_update:
            raise _incompatible("Schema not found and schema auto updating is disabled.")
        self.check(topic, type_, data)
        return self._add(topic, type_, data, properties)

    def for_producer(
        self, topic: TopicName, schema: tuple[int, bytes, dict[str, str]] | None
    ) -> StoredSchema | None:
        """The version a producer with ``schema`` (None: no schema) publishes with."""
        if schema is None or schema[0] == NONE_TYPE:
            if self.validation_enforced(topic) and self.versions(topic):
                raise _incompatible(
                    "Producers cannot connect or send message without a schema to topics with "
                    "a schema if SchemaValidationEnforced is enabled"
                )
            return None
        type_, data, properties = schema
        return self.put(topic, type_, data, properties, auto_update=self.allow_auto_update(topic))

    def for_consumer(
        self, topic: TopicName, schema: tuple[int, bytes, dict[str, str]], *, idle: bool = True
    ) -> None:
        """Check a consumer's schema (Pulsar's ``addSchemaIfIdleOrCheckCompatible``): on a topic
        without a schema it is registered when the topic is ``idle`` (no producer, consumer or
        stored data), else accepted as is; on a topic with one it must be compatible."""
        type_, data, properties = schema
        if type_ == NONE_TYPE:
            return
        versions = self.versions(topic)
        if self._find(versions, type_, data) is not None:
            return
        try:
            check_compatible(
                Definition(type_, data), [v.definition for v in versions], self.strategy(topic)
            )
        except IncompatibleSchemaError as exc:
            raise _incompatible(f"Trying to subscribe with incompatible schema: {exc}") from None
        if not versions and idle:
            self._add(topic, type_, data, properties)

    def delete(self, topic: TopicName) -> int | None:
        """Delete ``topic``'s schema (all versions); the deleted version, None if none."""
        record = self._record(topic)
        versions = self.versions(topic)
        if not versions:
            return None
        last = versions[-1].version
        record["deleted_at"] = last
        self.metadata.put_json(self._key(topic), record)
        return last
