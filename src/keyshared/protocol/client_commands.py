"""Builders of the commands a client sends: tests, fuzzers, benchmarks and the replicator.

Same conventions as :mod:`keyshared.protocol.broker_commands`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import cast

from keyshared.protocol import pulsar_api_pb2 as pb
from keyshared.protocol.checksum import Bytes
from keyshared.protocol.constants import PROTOCOL_VERSION, UINT64_MASK
from keyshared.protocol.encode import encode_command, encode_payload_command
from keyshared.protocol.message_ids import copy_id
from keyshared.protocol.metadata import encode_payload_section

CLIENT_VERSION = "Pulsar-CPP-v4.2.0"
"""Default ``client_version`` of the test-side CONNECT (what pulsar-client 3.13 sends)."""

_T = pb.BaseCommand


def connect(
    *,
    client_version: str = CLIENT_VERSION,
    protocol_version: int = PROTOCOL_VERSION,
    auth_method_name: str | None = "none",
    auth_data: bytes | None = None,
    supports_auth_refresh: bool = True,
    supports_broker_entry_metadata: bool = True,
) -> bytes:
    """CONNECT as pulsar-client 3.13 sends it (feature flags included)."""
    cmd = pb.BaseCommand(type=_T.CONNECT)
    sub = cmd.connect
    sub.client_version = client_version
    if auth_data is not None:
        sub.auth_data = auth_data
    sub.protocol_version = protocol_version
    if auth_method_name is not None:
        sub.auth_method_name = auth_method_name
    sub.feature_flags.supports_auth_refresh = supports_auth_refresh
    sub.feature_flags.supports_broker_entry_metadata = supports_broker_entry_metadata
    return encode_command(cmd)


def auth_response(
    *, auth_method_name: str, auth_data: bytes, client_version: str = CLIENT_VERSION
) -> bytes:
    """AUTH_RESPONSE to an AUTH_CHALLENGE (no protocol_version, like the C++ client)."""
    cmd = pb.BaseCommand(type=_T.AUTH_RESPONSE)
    sub = cmd.authResponse
    sub.client_version = client_version
    sub.response.auth_method_name = auth_method_name
    sub.response.auth_data = auth_data
    return encode_command(cmd)


def partitioned_metadata(*, topic: str, request_id: int) -> bytes:
    """PARTITIONED_METADATA request."""
    cmd = pb.BaseCommand(type=_T.PARTITIONED_METADATA)
    sub = cmd.partitionMetadata
    sub.topic = topic
    sub.request_id = request_id
    return encode_command(cmd)


def lookup(
    *,
    topic: str,
    request_id: int,
    authoritative: bool = False,
    advertised_listener_name: str | None = "",
) -> bytes:
    """LOOKUP request (the C++ client always sets ``advertised_listener_name``)."""
    cmd = pb.BaseCommand(type=_T.LOOKUP)
    sub = cmd.lookupTopic
    sub.topic = topic
    sub.request_id = request_id
    sub.authoritative = authoritative
    if advertised_listener_name is not None:
        sub.advertised_listener_name = advertised_listener_name
    return encode_command(cmd)


def producer(
    *,
    topic: str,
    producer_id: int,
    request_id: int,
    producer_name: str | None = None,
    epoch: int = 0,
    access_mode: int = pb.Shared,
    schema: pb.Schema | None = None,
    metadata: Mapping[str, str] | None = None,
    topic_epoch: int | None = None,
    initial_subscription_name: str | None = None,
) -> bytes:
    """PRODUCER; ``user_provided_producer_name`` follows whether a name is given."""
    cmd = pb.BaseCommand(type=_T.PRODUCER)
    sub = cmd.producer
    sub.topic = topic
    sub.producer_id = producer_id
    sub.request_id = request_id
    if producer_name is not None:
        sub.producer_name = producer_name
    sub.encrypted = False
    for key, value in (metadata or {}).items():
        sub.metadata.add(key=key, value=value)
    if schema is not None:
        sub.schema.CopyFrom(schema)
    sub.epoch = epoch
    sub.user_provided_producer_name = producer_name is not None
    sub.producer_access_mode = cast(pb.ProducerAccessMode, access_mode)
    if topic_epoch is not None:
        sub.topic_epoch = topic_epoch
    if initial_subscription_name is not None:
        sub.initial_subscription_name = initial_subscription_name
    return encode_command(cmd)


def send(
    *,
    producer_id: int,
    sequence_id: int,
    metadata: pb.MessageMetadata,
    payload: Bytes = b"",
    num_messages: int | None = None,
    highest_sequence_id: int | None = None,
    is_chunk: bool = False,
    checksum: int | None = None,
    with_checksum: bool = True,
) -> bytes:
    """A full SEND frame: command, magic + CRC32C, metadataSize + ``metadata`` + ``payload``.

    ``num_messages`` defaults to the metadata's ``num_messages_in_batch`` when that is set (as
    the client does); ``checksum`` overrides the computed CRC (to test corruption);
    ``with_checksum=False`` sends no magic and CRC, like a pre-v6 client.
    """
    cmd = pb.BaseCommand(type=_T.SEND)
    sub = cmd.send
    sub.producer_id = producer_id
    sub.sequence_id = sequence_id & UINT64_MASK
    if num_messages is None and metadata.HasField("num_messages_in_batch"):
        num_messages = metadata.num_messages_in_batch
    if num_messages is not None:
        sub.num_messages = num_messages
    if highest_sequence_id is not None:
        sub.highest_sequence_id = highest_sequence_id & UINT64_MASK
    if is_chunk:
        sub.is_chunk = True
    section = encode_payload_section(metadata, payload)
    return encode_payload_command(cmd, section, checksum, with_checksum=with_checksum)


def key_shared_meta(
    *,
    mode: int = pb.AUTO_SPLIT,
    hash_ranges: Iterable[tuple[int, int]] = (),
    allow_out_of_order_delivery: bool = False,
) -> pb.KeySharedMeta:
    """A ``KeySharedMeta`` for :func:`subscribe`; ranges are inclusive ``(start, end)`` pairs."""
    meta = pb.KeySharedMeta(keySharedMode=cast(pb.KeySharedMode, mode))
    for start, end in hash_ranges:
        meta.hashRanges.add(start=start, end=end)
    meta.allowOutOfOrderDelivery = allow_out_of_order_delivery
    return meta


def subscribe(
    *,
    topic: str,
    subscription: str,
    sub_type: int,
    consumer_id: int,
    request_id: int,
    consumer_name: str = "",
    priority_level: int = 0,
    durable: bool = True,
    start_message_id: pb.MessageIdData | None = None,
    metadata: Mapping[str, str] | None = None,
    read_compacted: bool = False,
    schema: pb.Schema | None = None,
    initial_position: int = pb.CommandSubscribe.Latest,
    replicate_subscription_state: bool = False,
    key_shared: pb.KeySharedMeta | None = None,
    subscription_properties: Mapping[str, str] | None = None,
) -> bytes:
    """SUBSCRIBE; ``sub_type`` is a ``pb.CommandSubscribe.SubType`` value (Key_Shared = 3).

    For Key_Shared pass ``key_shared`` (see :func:`key_shared_meta`); the client always does.
    """
    cmd = pb.BaseCommand(type=_T.SUBSCRIBE)
    sub = cmd.subscribe
    sub.topic = topic
    sub.subscription = subscription
    sub.subType = cast(pb.CommandSubscribe.SubType, sub_type)
    sub.consumer_id = consumer_id
    sub.request_id = request_id
    sub.consumer_name = consumer_name
    sub.priority_level = priority_level
    sub.durable = durable
    if start_message_id is not None:
        copy_id(sub.start_message_id, start_message_id)
    for key, value in (metadata or {}).items():
        sub.metadata.add(key=key, value=value)
    sub.read_compacted = read_compacted
    if schema is not None:
        sub.schema.CopyFrom(schema)
    sub.initialPosition = cast(pb.CommandSubscribe.InitialPosition, initial_position)
    sub.replicate_subscription_state = replicate_subscription_state
    if key_shared is not None:
        sub.keySharedMeta.CopyFrom(key_shared)
    for key, value in (subscription_properties or {}).items():
        sub.subscription_properties.add(key=key, value=value)
    return encode_command(cmd)


def flow(*, consumer_id: int, permits: int) -> bytes:
    """FLOW granting ``permits`` more messages."""
    cmd = pb.BaseCommand(type=_T.FLOW)
    sub = cmd.flow
    sub.consumer_id = consumer_id
    sub.messagePermits = permits
    return encode_command(cmd)


def ack(
    *,
    consumer_id: int,
    message_ids: Iterable[pb.MessageIdData],
    cumulative: bool = False,
    validation_error: int | None = None,
    request_id: int | None = None,
) -> bytes:
    """ACK, individual or cumulative; batch-index acks put the unacked bitset in ``ack_set``."""
    cmd = pb.BaseCommand(type=_T.ACK)
    sub = cmd.ack
    sub.consumer_id = consumer_id
    sub.ack_type = pb.CommandAck.Cumulative if cumulative else pb.CommandAck.Individual
    for mid in message_ids:
        copy_id(sub.message_id.add(), mid)
    if validation_error is not None:
        sub.validation_error = cast(pb.CommandAck.ValidationError, validation_error)
    if request_id is not None:
        sub.request_id = request_id
    return encode_command(cmd)


def redeliver(*, consumer_id: int, message_ids: Iterable[pb.MessageIdData] = ()) -> bytes:
    """REDELIVER_UNACKNOWLEDGED_MESSAGES; no ids means every unacked message."""
    cmd = pb.BaseCommand(type=_T.REDELIVER_UNACKNOWLEDGED_MESSAGES)
    sub = cmd.redeliverUnacknowledgedMessages
    sub.consumer_id = consumer_id
    for mid in message_ids:
        copy_id(sub.message_ids.add(), mid)
    return encode_command(cmd)


def seek(
    *,
    consumer_id: int,
    request_id: int,
    message_id: pb.MessageIdData | None = None,
    publish_time: int | None = None,
) -> bytes:
    """SEEK to a message id or to a publish time in ms (exactly one of them)."""
    if (message_id is None) == (publish_time is None):
        raise ValueError("seek needs exactly one of message_id and publish_time")
    cmd = pb.BaseCommand(type=_T.SEEK)
    sub = cmd.seek
    sub.consumer_id = consumer_id
    sub.request_id = request_id
    if message_id is not None:
        copy_id(sub.message_id, message_id)
    if publish_time is not None:
        sub.message_publish_time = publish_time
    return encode_command(cmd)


def get_last_message_id(*, consumer_id: int, request_id: int) -> bytes:
    """GET_LAST_MESSAGE_ID request."""
    cmd = pb.BaseCommand(type=_T.GET_LAST_MESSAGE_ID)
    sub = cmd.getLastMessageId
    sub.consumer_id = consumer_id
    sub.request_id = request_id
    return encode_command(cmd)


def unsubscribe(*, consumer_id: int, request_id: int) -> bytes:
    """UNSUBSCRIBE request."""
    cmd = pb.BaseCommand(type=_T.UNSUBSCRIBE)
    sub = cmd.unsubscribe
    sub.consumer_id = consumer_id
    sub.request_id = request_id
    return encode_command(cmd)


def consumer_stats(*, request_id: int, consumer_id: int) -> bytes:
    """CONSUMER_STATS request."""
    cmd = pb.BaseCommand(type=_T.CONSUMER_STATS)
    sub = cmd.consumerStats
    sub.request_id = request_id
    sub.consumer_id = consumer_id
    return encode_command(cmd)


def get_schema(*, request_id: int, topic: str, schema_version: bytes | None = None) -> bytes:
    """GET_SCHEMA request (Avro consumers fetch the writer schema by version)."""
    cmd = pb.BaseCommand(type=_T.GET_SCHEMA)
    sub = cmd.getSchema
    sub.request_id = request_id
    sub.topic = topic
    if schema_version is not None:
        sub.schema_version = schema_version
    return encode_command(cmd)


def get_topics_of_namespace(
    *,
    request_id: int,
    namespace: str,
    mode: int = pb.CommandGetTopicsOfNamespace.PERSISTENT,
    topics_pattern: str | None = None,
    topics_hash: str | None = None,
) -> bytes:
    """GET_TOPICS_OF_NAMESPACE request."""
    cmd = pb.BaseCommand(type=_T.GET_TOPICS_OF_NAMESPACE)
    sub = cmd.getTopicsOfNamespace
    sub.request_id = request_id
    sub.namespace = namespace
    sub.mode = cast(pb.CommandGetTopicsOfNamespace.Mode, mode)
    if topics_pattern is not None:
        sub.topics_pattern = topics_pattern
    if topics_hash is not None:
        sub.topics_hash = topics_hash
    return encode_command(cmd)
