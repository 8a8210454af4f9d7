"""The schema commands of a connection (GET_SCHEMA, GET_OR_CREATE_SCHEMA) and the schema part of
PRODUCER and SUBSCRIBE, over the broker's schema registry (broker/schema/)."""

from __future__ import annotations

from typing import cast

from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.nonpersistent_topic import NonPersistentTopic
from keyshared.broker.schema import SchemaRegistry, StoredSchema, version_bytes
from keyshared.broker.schema.registry import version_of
from keyshared.broker.topic import PersistentTopic
from keyshared.broker.topic_name import TopicName
from keyshared.protocol import pb

T = pb.BaseCommand
SchemaTuple = tuple[int, bytes, dict[str, str]]


def schema_tuple(schema: pb.Schema) -> SchemaTuple:
    """A wire Schema as (type, definition, properties)."""
    return int(schema.type), bytes(schema.schema_data), {p.key: p.value for p in schema.properties}


def to_wire(name: TopicName, stored: StoredSchema) -> pb.Schema:
    """A stored version as the wire Schema (named after the topic, as Pulsar does)."""
    return pb.Schema(
        name=name.partitioned_base.local_name,
        schema_data=stored.data,
        type=cast("pb.Schema.Type", stored.type),
        properties=[pb.KeyValue(key=k, value=v) for k, v in stored.properties.items()],
    )


def topic_is_idle(topic: PersistentTopic | NonPersistentTopic) -> bool:
    """No producer, no consumer and nothing stored: a consumer's schema may become the topic's
    first (Pulsar's ``addSchemaIfIdleOrCheckCompatible``)."""
    if len(topic.producers) or any(sub.consumers for sub in topic.subscriptions.values()):
        return False
    return isinstance(topic, NonPersistentTopic) or topic.ledger.total_size == 0


def get_schema(registry: SchemaRegistry, name: TopicName, r: pb.CommandGetSchema) -> T:
    """GET_SCHEMA_RESPONSE for ``r``: the latest version, or the one ``schema_version`` names."""
    resp = pb.CommandGetSchemaResponse(request_id=r.request_id)
    try:
        version = version_of(bytes(r.schema_version)) if r.HasField("schema_version") else None
    except ValueError as exc:
        resp.error_code = cast("pb.ServerError", int(ServerError.IncompatibleSchema))
        resp.error_message = str(exc)
        return T(type=T.GET_SCHEMA_RESPONSE, getSchemaResponse=resp)
    stored = registry.get(name, version)
    if stored is None:
        resp.error_code = cast("pb.ServerError", int(ServerError.TopicNotFound))
        resp.error_message = "Topic not found or no-schema"
    else:
        resp.schema.CopyFrom(to_wire(name, stored))
        resp.schema_version = version_bytes(stored.version)
    return T(type=T.GET_SCHEMA_RESPONSE, getSchemaResponse=resp)


def get_or_create_schema(
    registry: SchemaRegistry, name: TopicName, r: pb.CommandGetOrCreateSchema
) -> T:
    """GET_OR_CREATE_SCHEMA_RESPONSE: the version of ``r.schema``, added when compatible."""
    resp = pb.CommandGetOrCreateSchemaResponse(request_id=r.request_id)
    try:
        stored = registry.for_producer(name, schema_tuple(r.schema))
    except BrokerError as exc:
        resp.error_code = cast("pb.ServerError", int(exc.code))
        resp.error_message = exc.message
    else:
        resp.schema_version = version_bytes(stored.version) if stored is not None else b""
    return T(type=T.GET_OR_CREATE_SCHEMA_RESPONSE, getOrCreateSchemaResponse=resp)
