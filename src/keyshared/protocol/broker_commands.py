"""Builders of every command the broker sends to clients.

Each builder takes keyword arguments and returns the complete frame as bytes. Required fields are
always set, even when zero: proto2 presence matters to the Pulsar client, which drops the
connection on a command missing a required field.

For the per-message hot paths use :func:`keyshared.protocol.encode.encode_message` and
:func:`keyshared.protocol.encode.encode_send_receipt`; :func:`message_frame` and
:func:`send_receipt` here are the protobuf-built reference versions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import cast

from keyshared import __version__
from keyshared.protocol import pulsar_api_pb2 as pb
from keyshared.protocol.checksum import Bytes
from keyshared.protocol.constants import DEFAULT_MAX_MESSAGE_SIZE, PROTOCOL_VERSION, UINT64_MASK
from keyshared.protocol.encode import encode_command, encode_payload_command
from keyshared.protocol.message_ids import copy_id, message_id

SERVER_VERSION = f"keyshared-{__version__}"
"""Default ``server_version`` in CONNECTED and AUTH_CHALLENGE."""

_MAX_SERVER_ERROR = 25

_T = pb.BaseCommand


def server_error(code: int) -> pb.ServerError:
    """``code`` as a ``ServerError``, refusing values the client cannot parse (outside 0..25)."""
    if not 0 <= code <= _MAX_SERVER_ERROR:
        raise ValueError(f"ServerError {code} is outside 0..{_MAX_SERVER_ERROR}")
    return cast(pb.ServerError, code)


def connected(
    *,
    server_version: str = SERVER_VERSION,
    protocol_version: int = PROTOCOL_VERSION,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    feature_flags: pb.FeatureFlags | None = None,
) -> bytes:
    """CONNECTED: handshake answer; the client stores ``max_message_size`` process-wide."""
    cmd = pb.BaseCommand(type=_T.CONNECTED)
    sub = cmd.connected
    sub.server_version = server_version
    sub.protocol_version = protocol_version
    sub.max_message_size = max_message_size
    if feature_flags is not None:
        sub.feature_flags.CopyFrom(feature_flags)
    return encode_command(cmd)


def success(*, request_id: int, schema: pb.Schema | None = None) -> bytes:
    """SUCCESS for a request (SUBSCRIBE, CLOSE_*, UNSUBSCRIBE, SEEK...)."""
    cmd = pb.BaseCommand(type=_T.SUCCESS)
    sub = cmd.success
    sub.request_id = request_id
    if schema is not None:
        sub.schema.CopyFrom(schema)
    return encode_command(cmd)


def error(*, request_id: int, error: int, message: str) -> bytes:
    """ERROR for a failed request; ``request_id`` -1 (e.g. auth failure) goes out as uint64 max."""
    cmd = pb.BaseCommand(type=_T.ERROR)
    sub = cmd.error
    sub.request_id = request_id & UINT64_MASK
    sub.error = server_error(error)
    sub.message = message
    return encode_command(cmd)


def partitioned_metadata_response(*, request_id: int, partitions: int) -> bytes:
    """PARTITIONED_METADATA_RESPONSE Success with the partition count (0 = not partitioned)."""
    cmd = pb.BaseCommand(type=_T.PARTITIONED_METADATA_RESPONSE)
    sub = cmd.partitionMetadataResponse
    sub.partitions = partitions
    sub.request_id = request_id
    sub.response = pb.CommandPartitionedTopicMetadataResponse.Success
    return encode_command(cmd)


def partitioned_metadata_failed(*, request_id: int, error: int, message: str) -> bytes:
    """PARTITIONED_METADATA_RESPONSE Failed (an ERROR would be ignored by the client)."""
    cmd = pb.BaseCommand(type=_T.PARTITIONED_METADATA_RESPONSE)
    sub = cmd.partitionMetadataResponse
    sub.request_id = request_id
    sub.response = pb.CommandPartitionedTopicMetadataResponse.Failed
    sub.error = server_error(error)
    sub.message = message
    return encode_command(cmd)


def lookup_response(
    *,
    request_id: int,
    broker_service_url: str,
    broker_service_url_tls: str | None = None,
    authoritative: bool = True,
    redirect: bool = False,
    proxy_through_service_url: bool | None = None,
) -> bytes:
    """LOOKUP_RESPONSE Connect (or Redirect); TLS clients need ``broker_service_url_tls``."""
    cmd = pb.BaseCommand(type=_T.LOOKUP_RESPONSE)
    sub = cmd.lookupTopicResponse
    sub.brokerServiceUrl = broker_service_url
    if broker_service_url_tls is not None:
        sub.brokerServiceUrlTls = broker_service_url_tls
    sub.response = (
        pb.CommandLookupTopicResponse.Redirect
        if redirect
        else pb.CommandLookupTopicResponse.Connect
    )
    sub.request_id = request_id
    sub.authoritative = authoritative
    if proxy_through_service_url is not None:
        sub.proxy_through_service_url = proxy_through_service_url
    return encode_command(cmd)


def lookup_failed(*, request_id: int, error: int, message: str) -> bytes:
    """LOOKUP_RESPONSE Failed (an ERROR would be ignored by the client)."""
    cmd = pb.BaseCommand(type=_T.LOOKUP_RESPONSE)
    sub = cmd.lookupTopicResponse
    sub.response = pb.CommandLookupTopicResponse.Failed
    sub.request_id = request_id
    sub.error = server_error(error)
    sub.message = message
    return encode_command(cmd)


def producer_success(
    *,
    request_id: int,
    producer_name: str,
    last_sequence_id: int = -1,
    schema_version: bytes | None = None,
    topic_epoch: int | None = None,
    producer_ready: bool = True,
) -> bytes:
    """PRODUCER_SUCCESS; ``last_sequence_id`` -1 means no message persisted for this name."""
    cmd = pb.BaseCommand(type=_T.PRODUCER_SUCCESS)
    sub = cmd.producer_success
    sub.request_id = request_id
    sub.producer_name = producer_name
    sub.last_sequence_id = last_sequence_id
    if schema_version is not None:
        sub.schema_version = schema_version
    if topic_epoch is not None:
        sub.topic_epoch = topic_epoch
    sub.producer_ready = producer_ready
    return encode_command(cmd)


def send_receipt(
    *,
    producer_id: int,
    sequence_id: int,
    ledger_id: int,
    entry_id: int,
    highest_sequence_id: int | None = None,
) -> bytes:
    """SEND_RECEIPT built with protobuf (reference for ``encode.encode_send_receipt``)."""
    cmd = pb.BaseCommand(type=_T.SEND_RECEIPT)
    sub = cmd.send_receipt
    sub.producer_id = producer_id
    sub.sequence_id = sequence_id & UINT64_MASK
    copy_id(sub.message_id, message_id(ledger_id, entry_id))
    if highest_sequence_id is not None:
        sub.highest_sequence_id = highest_sequence_id & UINT64_MASK
    return encode_command(cmd)


def send_error(*, producer_id: int, sequence_id: int, error: int, message: str) -> bytes:
    """SEND_ERROR; only ChecksumError keeps the client's connection, others make it reconnect."""
    cmd = pb.BaseCommand(type=_T.SEND_ERROR)
    sub = cmd.send_error
    sub.producer_id = producer_id
    sub.sequence_id = sequence_id & UINT64_MASK
    sub.error = server_error(error)
    sub.message = message
    return encode_command(cmd)


def message_frame(
    *,
    consumer_id: int,
    ledger_id: int,
    entry_id: int,
    payload: Bytes,
    checksum: int | None = None,
    redelivery_count: int = 0,
    partition: int = -1,
    ack_set: Sequence[int] | None = None,
    with_checksum: bool = True,
) -> bytes:
    """MESSAGE built with protobuf (reference for ``encode.encode_message``).

    ``with_checksum=False`` leaves out magic and CRC, which clients also accept.
    """
    cmd = pb.BaseCommand(type=_T.MESSAGE)
    sub = cmd.message
    sub.consumer_id = consumer_id
    copy_id(sub.message_id, message_id(ledger_id, entry_id, partition=partition))
    if redelivery_count:
        sub.redelivery_count = redelivery_count
    if ack_set:
        sub.ack_set.extend(ack_set)
    return encode_payload_command(cmd, payload, checksum, with_checksum=with_checksum)


def close_producer(
    *,
    producer_id: int,
    request_id: int,
    assigned_broker_service_url: str | None = None,
    assigned_broker_service_url_tls: str | None = None,
) -> bytes:
    """CLOSE_PRODUCER, either direction (the broker's makes the client re-create the producer)."""
    cmd = pb.BaseCommand(type=_T.CLOSE_PRODUCER)
    sub = cmd.close_producer
    sub.producer_id = producer_id
    sub.request_id = request_id
    if assigned_broker_service_url is not None:
        sub.assignedBrokerServiceUrl = assigned_broker_service_url
    if assigned_broker_service_url_tls is not None:
        sub.assignedBrokerServiceUrlTls = assigned_broker_service_url_tls
    return encode_command(cmd)


def close_consumer(
    *,
    consumer_id: int,
    request_id: int,
    assigned_broker_service_url: str | None = None,
    assigned_broker_service_url_tls: str | None = None,
) -> bytes:
    """CLOSE_CONSUMER, either direction (the broker's makes the client re-subscribe)."""
    cmd = pb.BaseCommand(type=_T.CLOSE_CONSUMER)
    sub = cmd.close_consumer
    sub.consumer_id = consumer_id
    sub.request_id = request_id
    if assigned_broker_service_url is not None:
        sub.assignedBrokerServiceUrl = assigned_broker_service_url
    if assigned_broker_service_url_tls is not None:
        sub.assignedBrokerServiceUrlTls = assigned_broker_service_url_tls
    return encode_command(cmd)


def ping() -> bytes:
    """PING (with its empty sub-message, as Pulsar sends it)."""
    cmd = pb.BaseCommand(type=_T.PING)
    cmd.ping.SetInParent()
    return encode_command(cmd)


def pong() -> bytes:
    """PONG (with its empty sub-message)."""
    cmd = pb.BaseCommand(type=_T.PONG)
    cmd.pong.SetInParent()
    return encode_command(cmd)


def active_consumer_change(*, consumer_id: int, is_active: bool) -> bytes:
    """ACTIVE_CONSUMER_CHANGE for Failover/Exclusive subscriptions."""
    cmd = pb.BaseCommand(type=_T.ACTIVE_CONSUMER_CHANGE)
    sub = cmd.active_consumer_change
    sub.consumer_id = consumer_id
    sub.is_active = is_active
    return encode_command(cmd)


def get_last_message_id_response(
    *,
    request_id: int,
    last_message_id: pb.MessageIdData,
    consumer_mark_delete_position: pb.MessageIdData | None = None,
) -> bytes:
    """GET_LAST_MESSAGE_ID_RESPONSE; build the ids with :func:`message_id`."""
    cmd = pb.BaseCommand(type=_T.GET_LAST_MESSAGE_ID_RESPONSE)
    sub = cmd.getLastMessageIdResponse
    copy_id(sub.last_message_id, last_message_id)
    sub.request_id = request_id
    if consumer_mark_delete_position is not None:
        copy_id(sub.consumer_mark_delete_position, consumer_mark_delete_position)
    return encode_command(cmd)


def get_topics_of_namespace_response(
    *,
    request_id: int,
    topics: Iterable[str],
    filtered: bool = False,
    topics_hash: str | None = None,
    changed: bool = True,
) -> bytes:
    """GET_TOPICS_OF_NAMESPACE_RESPONSE (regex subscriptions)."""
    cmd = pb.BaseCommand(type=_T.GET_TOPICS_OF_NAMESPACE_RESPONSE)
    sub = cmd.getTopicsOfNamespaceResponse
    sub.request_id = request_id
    sub.topics.extend(topics)
    sub.filtered = filtered
    if topics_hash is not None:
        sub.topics_hash = topics_hash
    sub.changed = changed
    return encode_command(cmd)


def get_schema_response(
    *,
    request_id: int,
    schema: pb.Schema | None = None,
    schema_version: bytes | None = None,
    error: int | None = None,
    error_message: str | None = None,
) -> bytes:
    """GET_SCHEMA_RESPONSE with a schema, or with ``error`` (TopicNotFound = no schema)."""
    cmd = pb.BaseCommand(type=_T.GET_SCHEMA_RESPONSE)
    sub = cmd.getSchemaResponse
    sub.request_id = request_id
    if error is not None:
        sub.error_code = server_error(error)
        sub.error_message = error_message or ""
    if schema is not None:
        sub.schema.CopyFrom(schema)
    if schema_version is not None:
        sub.schema_version = schema_version
    return encode_command(cmd)


def ack_response(
    *,
    consumer_id: int,
    request_id: int | None = None,
    error: int | None = None,
    message: str | None = None,
) -> bytes:
    """ACK_RESPONSE, owed only for an ACK that carried a ``request_id``."""
    cmd = pb.BaseCommand(type=_T.ACK_RESPONSE)
    sub = cmd.ackResponse
    sub.consumer_id = consumer_id
    if request_id is not None:
        sub.request_id = request_id
    if error is not None:
        sub.error = server_error(error)
        sub.message = message or ""
    return encode_command(cmd)


def auth_challenge(
    *,
    auth_method_name: str,
    auth_data: bytes = b"",
    server_version: str = SERVER_VERSION,
    protocol_version: int = PROTOCOL_VERSION,
) -> bytes:
    """AUTH_CHALLENGE asking an already connected client to refresh its credentials."""
    cmd = pb.BaseCommand(type=_T.AUTH_CHALLENGE)
    sub = cmd.authChallenge
    sub.server_version = server_version
    sub.challenge.auth_method_name = auth_method_name
    sub.challenge.auth_data = auth_data
    sub.protocol_version = protocol_version
    return encode_command(cmd)


def consumer_stats_response(
    *,
    request_id: int,
    error: int | None = None,
    error_message: str | None = None,
    msg_rate_out: float | None = None,
    msg_throughput_out: float | None = None,
    msg_rate_redeliver: float | None = None,
    consumer_name: str | None = None,
    available_permits: int | None = None,
    unacked_messages: int | None = None,
    blocked_consumer_on_unacked_msgs: bool | None = None,
    address: str | None = None,
    connected_since: str | None = None,
    subscription_type: str | None = None,
    msg_rate_expired: float | None = None,
    msg_backlog: int | None = None,
    message_ack_rate: float | None = None,
) -> bytes:
    """CONSUMER_STATS_RESPONSE; unset statistics are left out."""
    cmd = pb.BaseCommand(type=_T.CONSUMER_STATS_RESPONSE)
    sub = cmd.consumerStatsResponse
    sub.request_id = request_id
    if error is not None:
        sub.error_code = server_error(error)
        sub.error_message = error_message or ""
    if msg_rate_out is not None:
        sub.msgRateOut = msg_rate_out
    if msg_throughput_out is not None:
        sub.msgThroughputOut = msg_throughput_out
    if msg_rate_redeliver is not None:
        sub.msgRateRedeliver = msg_rate_redeliver
    if consumer_name is not None:
        sub.consumerName = consumer_name
    if available_permits is not None:
        sub.availablePermits = max(available_permits, 0)
    if unacked_messages is not None:
        sub.unackedMessages = unacked_messages
    if blocked_consumer_on_unacked_msgs is not None:
        sub.blockedConsumerOnUnackedMsgs = blocked_consumer_on_unacked_msgs
    if address is not None:
        sub.address = address
    if connected_since is not None:
        sub.connectedSince = connected_since
    if subscription_type is not None:
        sub.type = subscription_type
    if msg_rate_expired is not None:
        sub.msgRateExpired = msg_rate_expired
    if msg_backlog is not None:
        sub.msgBacklog = msg_backlog
    if message_ack_rate is not None:
        sub.messageAckRate = message_ack_rate
    return encode_command(cmd)
