"""Builders and encoders: every frame decodes back to the fields it was built from."""

from __future__ import annotations

import pytest
from google.protobuf.message import EncodeError
from hypothesis import given
from hypothesis import strategies as st

from keyshared.protocol import commands as c
from keyshared.protocol import pulsar_api_pb2 as pb
from keyshared.protocol.checksum import crc32c
from keyshared.protocol.encode import (
    encode_command,
    encode_message,
    encode_message_header,
    encode_payload_command,
    encode_send_receipt,
    to_int64,
    to_uint64,
)
from keyshared.protocol.framing import Frame, FrameDecoder
from keyshared.protocol.metadata import encode_payload_section

U64 = 2**64 - 1
T = pb.BaseCommand


def decode_one(data: bytes) -> Frame:
    decoder = FrameDecoder(16 * 1024 * 1024)
    decoder.feed(data)
    frames = list(decoder)
    assert len(frames) == 1
    assert decoder.buffered == 0
    return frames[0]


def metadata(**fields: object) -> pb.MessageMetadata:
    md = pb.MessageMetadata(producer_name="prod-1", sequence_id=0, publish_time=1_700_000_000_000)
    for name, value in fields.items():
        setattr(md, name, value)
    return md


# ---------------------------------------------------------------------------------------------
# Id conversion
# ---------------------------------------------------------------------------------------------


def test_signed_unsigned_id_conversion() -> None:
    assert to_uint64(-1) == U64
    assert to_int64(U64) == -1
    assert to_int64(2**63 - 1) == 2**63 - 1
    assert to_int64(2**63) == -(2**63)
    assert to_uint64(5) == 5 and to_int64(5) == 5
    mid = c.message_id(-1, -1)
    assert mid.ledgerId == U64 and mid.entryId == U64
    assert c.position_of(mid) == (-1, -1)
    assert not mid.HasField("partition") and not mid.HasField("batch_index")
    mid = c.message_id(3, 0, partition=2, batch_index=0, ack_set=[5], batch_size=3)
    assert mid.HasField("entryId") and mid.entryId == 0
    assert (mid.partition, mid.batch_index, list(mid.ack_set), mid.batch_size) == (2, 0, [5], 3)


# ---------------------------------------------------------------------------------------------
# Broker to client
# ---------------------------------------------------------------------------------------------


def test_connected() -> None:
    cmd = decode_one(c.connected()).command
    assert cmd.type == T.CONNECTED
    assert cmd.connected.server_version.startswith("keyshared-")
    assert cmd.connected.protocol_version == 20
    assert cmd.connected.max_message_size == 5 * 1024 * 1024
    assert not cmd.connected.HasField("feature_flags")
    flags = pb.FeatureFlags(supports_auth_refresh=True)
    cmd = decode_one(
        c.connected(
            server_version="x", protocol_version=12, max_message_size=10, feature_flags=flags
        )
    ).command
    assert (cmd.connected.server_version, cmd.connected.protocol_version) == ("x", 12)
    assert cmd.connected.feature_flags == flags


def test_success_encodes_request_id_zero() -> None:
    cmd = decode_one(c.success(request_id=0)).command
    assert cmd.type == T.SUCCESS
    assert cmd.success.HasField("request_id") and cmd.success.request_id == 0
    schema = pb.Schema(name="STRING", schema_data=b"null", type=pb.Schema.String)
    cmd = decode_one(c.success(request_id=4, schema=schema)).command
    assert cmd.success.schema == schema


def test_error() -> None:
    cmd = decode_one(c.error(request_id=0, error=pb.UnknownError, message="boom")).command
    assert cmd.type == T.ERROR
    assert cmd.error.HasField("request_id") and cmd.error.HasField("error")
    assert (cmd.error.request_id, cmd.error.error, cmd.error.message) == (0, 0, "boom")
    cmd = decode_one(c.error(request_id=-1, error=pb.AuthenticationError, message="")).command
    assert cmd.error.request_id == U64
    assert cmd.error.HasField("message")


@pytest.mark.parametrize("code", [-1, 26, 50])
def test_server_errors_outside_the_client_enum_are_refused(code: int) -> None:
    with pytest.raises(ValueError, match="outside"):
        c.error(request_id=1, error=code, message="x")
    with pytest.raises(ValueError):
        c.send_error(producer_id=1, sequence_id=1, error=code, message="x")


def test_partitioned_metadata_response() -> None:
    cmd = decode_one(c.partitioned_metadata_response(request_id=0, partitions=0)).command
    sub = cmd.partitionMetadataResponse
    assert cmd.type == T.PARTITIONED_METADATA_RESPONSE
    assert (
        sub.HasField("response")
        and sub.response == pb.CommandPartitionedTopicMetadataResponse.Success
    )
    assert sub.HasField("partitions") and sub.partitions == 0
    assert sub.HasField("request_id")
    cmd = decode_one(
        c.partitioned_metadata_failed(request_id=3, error=pb.TopicNotFound, message="nope")
    ).command
    sub = cmd.partitionMetadataResponse
    assert sub.response == pb.CommandPartitionedTopicMetadataResponse.Failed
    assert (sub.request_id, sub.error, sub.message) == (3, pb.TopicNotFound, "nope")
    assert not sub.HasField("partitions")


def test_lookup_response() -> None:
    cmd = decode_one(
        c.lookup_response(
            request_id=2,
            broker_service_url="pulsar://127.0.0.1:6650",
            broker_service_url_tls="pulsar+ssl://127.0.0.1:6651",
        )
    ).command
    sub = cmd.lookupTopicResponse
    assert cmd.type == T.LOOKUP_RESPONSE
    assert sub.response == pb.CommandLookupTopicResponse.Connect
    assert sub.brokerServiceUrl == "pulsar://127.0.0.1:6650"
    assert sub.brokerServiceUrlTls == "pulsar+ssl://127.0.0.1:6651"
    assert sub.authoritative and sub.request_id == 2
    assert not sub.HasField("proxy_through_service_url")
    sub = decode_one(
        c.lookup_response(request_id=0, broker_service_url="u", redirect=True)
    ).command.lookupTopicResponse
    assert sub.HasField("response") and sub.response == pb.CommandLookupTopicResponse.Redirect
    assert not sub.HasField("brokerServiceUrlTls")
    sub = decode_one(
        c.lookup_failed(request_id=9, error=pb.ServiceNotReady, message="later")
    ).command.lookupTopicResponse
    assert sub.response == pb.CommandLookupTopicResponse.Failed
    assert (sub.request_id, sub.error, sub.message) == (9, pb.ServiceNotReady, "later")


def test_producer_success() -> None:
    sub = decode_one(
        c.producer_success(request_id=0, producer_name="standalone-0-0")
    ).command.producer_success
    assert sub.HasField("request_id") and sub.producer_name == "standalone-0-0"
    assert sub.HasField("last_sequence_id") and sub.last_sequence_id == -1
    assert sub.HasField("producer_ready") and sub.producer_ready
    assert not sub.HasField("schema_version") and not sub.HasField("topic_epoch")
    sub = decode_one(
        c.producer_success(
            request_id=1,
            producer_name="p",
            last_sequence_id=41,
            schema_version=(7).to_bytes(8, "big"),
            topic_epoch=3,
            producer_ready=False,
        )
    ).command.producer_success
    assert (sub.last_sequence_id, sub.schema_version, sub.topic_epoch) == (
        41,
        (7).to_bytes(8, "big"),
        3,
    )
    assert not sub.producer_ready


def test_send_receipt_and_error() -> None:
    sub = decode_one(
        c.send_receipt(producer_id=0, sequence_id=0, ledger_id=0, entry_id=0)
    ).command.send_receipt
    assert sub.HasField("producer_id") and sub.HasField("sequence_id")
    assert sub.message_id.HasField("ledgerId") and sub.message_id.HasField("entryId")
    assert not sub.HasField("highest_sequence_id")
    err = decode_one(
        c.send_error(producer_id=2, sequence_id=5, error=pb.ChecksumError, message="crc")
    ).command.send_error
    assert (err.producer_id, err.sequence_id, err.error, err.message) == (
        2,
        5,
        pb.ChecksumError,
        "crc",
    )


def test_close_producer_and_consumer() -> None:
    cmd = decode_one(c.close_producer(producer_id=0, request_id=0)).command
    assert cmd.type == T.CLOSE_PRODUCER
    assert cmd.close_producer.HasField("producer_id") and cmd.close_producer.HasField("request_id")
    assert not cmd.close_producer.HasField("assignedBrokerServiceUrl")
    cmd = decode_one(
        c.close_consumer(
            consumer_id=3,
            request_id=4,
            assigned_broker_service_url="pulsar://h:1",
            assigned_broker_service_url_tls="pulsar+ssl://h:2",
        )
    ).command
    sub = cmd.close_consumer
    assert cmd.type == T.CLOSE_CONSUMER
    assert (sub.consumer_id, sub.request_id) == (3, 4)
    assert (sub.assignedBrokerServiceUrl, sub.assignedBrokerServiceUrlTls) == (
        "pulsar://h:1",
        "pulsar+ssl://h:2",
    )


def test_ping_and_pong_carry_their_empty_sub_message() -> None:
    assert c.ping() == b"\x00\x00\x00\x09\x00\x00\x00\x05\x08\x12\x92\x01\x00"
    for data, ctype, field in ((c.ping(), T.PING, "ping"), (c.pong(), T.PONG, "pong")):
        cmd = decode_one(data).command
        assert cmd.type == ctype and cmd.HasField(field)


def test_active_consumer_change() -> None:
    sub = decode_one(c.active_consumer_change(consumer_id=0, is_active=False)).command
    assert sub.type == T.ACTIVE_CONSUMER_CHANGE
    assert sub.active_consumer_change.HasField("is_active")
    assert not sub.active_consumer_change.is_active


def test_get_last_message_id_response() -> None:
    cmd = decode_one(
        c.get_last_message_id_response(
            request_id=0,
            last_message_id=c.message_id(7, -1, partition=1),
            consumer_mark_delete_position=c.message_id(-1, -1),
        )
    ).command
    sub = cmd.getLastMessageIdResponse
    assert cmd.type == T.GET_LAST_MESSAGE_ID_RESPONSE
    assert c.position_of(sub.last_message_id) == (7, -1)
    assert sub.last_message_id.partition == 1
    assert c.position_of(sub.consumer_mark_delete_position) == (-1, -1)
    sub = decode_one(
        c.get_last_message_id_response(
            request_id=1, last_message_id=c.message_id(7, 3, batch_index=9)
        )
    ).command.getLastMessageIdResponse
    assert sub.last_message_id.batch_index == 9
    assert not sub.HasField("consumer_mark_delete_position")


def test_get_topics_of_namespace_response() -> None:
    sub = decode_one(
        c.get_topics_of_namespace_response(
            request_id=5, topics=["persistent://t/n/a", "persistent://t/n/b"], topics_hash="h"
        )
    ).command.getTopicsOfNamespaceResponse
    assert list(sub.topics) == ["persistent://t/n/a", "persistent://t/n/b"]
    assert sub.HasField("filtered") and not sub.filtered
    assert sub.HasField("changed") and sub.changed
    assert sub.topics_hash == "h"


def test_get_schema_response() -> None:
    schema = pb.Schema(name="rec", schema_data=b"{}", type=pb.Schema.Avro)
    sub = decode_one(
        c.get_schema_response(request_id=1, schema=schema, schema_version=b"\0" * 8)
    ).command.getSchemaResponse
    assert sub.schema == schema and sub.schema_version == b"\0" * 8
    assert not sub.HasField("error_code")
    sub = decode_one(
        c.get_schema_response(request_id=2, error=pb.TopicNotFound, error_message="no schema")
    ).command.getSchemaResponse
    assert (sub.error_code, sub.error_message) == (pb.TopicNotFound, "no schema")
    assert not sub.HasField("schema")


def test_ack_response() -> None:
    sub = decode_one(c.ack_response(consumer_id=0, request_id=0)).command.ackResponse
    assert sub.HasField("consumer_id") and sub.HasField("request_id")
    assert not sub.HasField("error")
    sub = decode_one(
        c.ack_response(consumer_id=1, request_id=2, error=pb.NotAllowedError, message="no")
    ).command.ackResponse
    assert (sub.error, sub.message) == (pb.NotAllowedError, "no")


def test_auth_challenge_and_response() -> None:
    sub = decode_one(
        c.auth_challenge(auth_method_name="token", auth_data=b"refresh")
    ).command.authChallenge
    assert sub.challenge.auth_method_name == "token" and sub.challenge.auth_data == b"refresh"
    assert sub.protocol_version == 20 and sub.server_version
    sub2 = decode_one(c.auth_response(auth_method_name="token", auth_data=b"jwt")).command
    assert sub2.type == T.AUTH_RESPONSE
    assert sub2.authResponse.response.auth_data == b"jwt"
    assert not sub2.authResponse.HasField("protocol_version")


def test_consumer_stats() -> None:
    cmd = decode_one(c.consumer_stats(request_id=0, consumer_id=0)).command
    assert cmd.consumerStats.HasField("request_id") and cmd.consumerStats.HasField("consumer_id")
    sub = decode_one(
        c.consumer_stats_response(
            request_id=1,
            msg_rate_out=1.5,
            consumer_name="c",
            available_permits=-3,
            unacked_messages=2,
            blocked_consumer_on_unacked_msgs=False,
            subscription_type="Key_Shared",
            msg_backlog=10,
        )
    ).command.consumerStatsResponse
    assert (sub.msgRateOut, sub.consumerName, sub.availablePermits) == (1.5, "c", 0)
    assert (sub.unackedMessages, sub.type, sub.msgBacklog) == (2, "Key_Shared", 10)
    assert sub.HasField("blockedConsumerOnUnackedMsgs")
    assert not sub.HasField("msgThroughputOut") and not sub.HasField("error_code")


# ---------------------------------------------------------------------------------------------
# Client to broker
# ---------------------------------------------------------------------------------------------


def test_connect_matches_the_real_client_frame() -> None:
    observed = bytes.fromhex(
        "0000002900000025080212210a1150756c7361722d4350502d76342e322e3020142a046e6f6e65520408011001"
    )
    assert c.connect() == observed
    sub = decode_one(c.connect(auth_method_name="token", auth_data=b"my.jwt.token")).command.connect
    assert (sub.auth_method_name, sub.auth_data) == ("token", b"my.jwt.token")


def test_discovery_requests() -> None:
    sub = decode_one(c.partitioned_metadata(topic="persistent://a/b/c", request_id=1)).command
    assert sub.partitionMetadata.topic == "persistent://a/b/c"
    lk = decode_one(c.lookup(topic="persistent://a/b/c", request_id=0)).command.lookupTopic
    assert lk.HasField("request_id") and lk.HasField("authoritative") and not lk.authoritative
    assert lk.HasField("advertised_listener_name") and lk.advertised_listener_name == ""


def test_producer_request() -> None:
    sub = decode_one(
        c.producer(topic="persistent://a/b/c", producer_id=0, request_id=0)
    ).command.producer
    assert sub.HasField("producer_id") and sub.HasField("request_id")
    assert not sub.HasField("producer_name")
    assert sub.HasField("user_provided_producer_name") and not sub.user_provided_producer_name
    assert sub.HasField("producer_access_mode") and sub.producer_access_mode == pb.Shared
    assert sub.HasField("epoch") and sub.HasField("encrypted")
    sub = decode_one(
        c.producer(
            topic="t",
            producer_id=1,
            request_id=2,
            producer_name="named",
            epoch=3,
            access_mode=pb.Exclusive,
            metadata={"k": "v"},
            topic_epoch=4,
            initial_subscription_name="s",
        )
    ).command.producer
    assert sub.user_provided_producer_name and sub.producer_name == "named"
    assert (sub.epoch, sub.producer_access_mode, sub.topic_epoch) == (3, pb.Exclusive, 4)
    assert [(kv.key, kv.value) for kv in sub.metadata] == [("k", "v")]
    assert sub.initial_subscription_name == "s"


def test_send_builds_a_checksummed_payload_frame() -> None:
    md = metadata(partition_key="key-1")
    frame = decode_one(c.send(producer_id=0, sequence_id=0, metadata=md, payload=b"hi"))
    sub = frame.command.send
    assert sub.HasField("producer_id") and sub.HasField("sequence_id")
    assert not sub.HasField("num_messages")
    assert frame.payload == encode_payload_section(md, b"hi")
    assert frame.checksum == crc32c(frame.payload) and frame.checksum_ok

    batch = metadata(num_messages_in_batch=3)
    frame = decode_one(c.send(producer_id=1, sequence_id=10, metadata=batch, payload=b"body"))
    assert frame.command.send.num_messages == 3

    frame = decode_one(c.send(producer_id=1, sequence_id=1, metadata=md, with_checksum=False))
    assert frame.checksum is None and frame.checksum_ok
    frame = decode_one(c.send(producer_id=1, sequence_id=1, metadata=md, checksum=1234))
    assert frame.checksum == 1234 and not frame.checksum_ok

    frame = decode_one(
        c.send(
            producer_id=1,
            sequence_id=2,
            metadata=md,
            num_messages=1,
            highest_sequence_id=5,
            is_chunk=True,
        )
    )
    assert frame.command.send.HasField("num_messages")
    assert frame.command.send.highest_sequence_id == 5 and frame.command.send.is_chunk


def test_subscribe_request() -> None:
    meta = c.key_shared_meta(
        mode=pb.STICKY, hash_ranges=[(0, 32767)], allow_out_of_order_delivery=True
    )
    sub = decode_one(
        c.subscribe(
            topic="persistent://a/b/c",
            subscription="sub",
            sub_type=pb.CommandSubscribe.Key_Shared,
            consumer_id=0,
            request_id=0,
            consumer_name="c1",
            key_shared=meta,
            metadata={"a": "b"},
            subscription_properties={"x": "y"},
            initial_position=pb.CommandSubscribe.Earliest,
        )
    ).command.subscribe
    assert sub.subType == pb.CommandSubscribe.Key_Shared
    assert sub.HasField("consumer_id") and sub.HasField("request_id")
    assert sub.keySharedMeta.keySharedMode == pb.STICKY
    assert [(r.start, r.end) for r in sub.keySharedMeta.hashRanges] == [(0, 32767)]
    assert sub.keySharedMeta.allowOutOfOrderDelivery
    assert sub.initialPosition == pb.CommandSubscribe.Earliest
    assert sub.durable and not sub.HasField("start_message_id")
    assert [(kv.key, kv.value) for kv in sub.subscription_properties] == [("x", "y")]

    reader = decode_one(
        c.subscribe(
            topic="t",
            subscription="reader-0123456789",
            sub_type=pb.CommandSubscribe.Exclusive,
            consumer_id=1,
            request_id=1,
            durable=False,
            start_message_id=c.message_id(-1, -1),
        )
    ).command.subscribe
    assert reader.HasField("durable") and not reader.durable
    assert c.position_of(reader.start_message_id) == (-1, -1)
    assert reader.HasField("subType") and reader.subType == pb.CommandSubscribe.Exclusive
    assert not reader.HasField("keySharedMeta")
    # AUTO_SPLIT (0) must be present: keySharedMode is required.
    auto = c.key_shared_meta()
    assert auto.HasField("keySharedMode") and auto.keySharedMode == pb.AUTO_SPLIT


def test_flow_ack_redeliver() -> None:
    sub = decode_one(c.flow(consumer_id=0, permits=1000)).command.flow
    assert sub.HasField("consumer_id") and sub.messagePermits == 1000
    ids = [c.message_id(7, 0, ack_set=[5]), c.message_id(7, 1)]
    ack = decode_one(c.ack(consumer_id=2, message_ids=ids)).command.ack
    assert ack.HasField("ack_type") and ack.ack_type == pb.CommandAck.Individual
    assert list(ack.message_id) == ids
    assert list(ack.message_id[0].ack_set) == [5]
    assert not ack.HasField("request_id")
    cum = decode_one(
        c.ack(
            consumer_id=2,
            message_ids=[c.message_id(7, -1)],
            cumulative=True,
            validation_error=pb.CommandAck.ChecksumMismatch,
            request_id=0,
        )
    ).command.ack
    assert cum.ack_type == pb.CommandAck.Cumulative
    assert c.position_of(cum.message_id[0]) == (7, -1)
    assert cum.validation_error == pb.CommandAck.ChecksumMismatch
    assert cum.HasField("request_id")
    red = decode_one(c.redeliver(consumer_id=3)).command
    assert red.type == T.REDELIVER_UNACKNOWLEDGED_MESSAGES
    assert len(red.redeliverUnacknowledgedMessages.message_ids) == 0
    red = decode_one(c.redeliver(consumer_id=3, message_ids=ids)).command
    assert list(red.redeliverUnacknowledgedMessages.message_ids) == ids


def test_seek_and_consumer_requests() -> None:
    sk = decode_one(c.seek(consumer_id=1, request_id=2, message_id=c.message_id(7, 1))).command.seek
    assert c.position_of(sk.message_id) == (7, 1) and not sk.HasField("message_publish_time")
    sk = decode_one(c.seek(consumer_id=1, request_id=2, publish_time=0)).command.seek
    assert sk.HasField("message_publish_time") and not sk.HasField("message_id")
    with pytest.raises(ValueError):
        c.seek(consumer_id=1, request_id=2)
    with pytest.raises(ValueError):
        c.seek(consumer_id=1, request_id=2, message_id=c.message_id(1, 1), publish_time=5)
    for data, ctype, field in (
        (
            c.get_last_message_id(consumer_id=0, request_id=0),
            T.GET_LAST_MESSAGE_ID,
            "getLastMessageId",
        ),
        (c.unsubscribe(consumer_id=0, request_id=0), T.UNSUBSCRIBE, "unsubscribe"),
    ):
        cmd = decode_one(data).command
        assert cmd.type == ctype
        assert getattr(cmd, field).HasField("consumer_id")
        assert getattr(cmd, field).HasField("request_id")
    gs = decode_one(c.get_schema(request_id=1, topic="t", schema_version=b"v")).command.getSchema
    assert (gs.topic, gs.schema_version) == ("t", b"v")
    gt = decode_one(
        c.get_topics_of_namespace(request_id=1, namespace="public/default", topics_pattern=".*")
    ).command.getTopicsOfNamespace
    assert gt.HasField("mode") and gt.namespace == "public/default" and gt.topics_pattern == ".*"


def test_encode_command_refuses_missing_required_fields() -> None:
    with pytest.raises(EncodeError):
        encode_command(pb.BaseCommand(type=T.SEND, send=pb.CommandSend(producer_id=1)))
    with pytest.raises(EncodeError):
        encode_payload_command(
            pb.BaseCommand(type=T.SEND, send=pb.CommandSend(producer_id=1)), b"x"
        )


# ---------------------------------------------------------------------------------------------
# Hand-encoded hot paths against the protobuf encoding
# ---------------------------------------------------------------------------------------------

u64 = st.integers(min_value=0, max_value=U64)
ids = st.one_of(st.integers(min_value=-1, max_value=2**63 - 1), st.just(U64))
small = st.integers(min_value=0, max_value=300)


@given(
    producer_id=st.one_of(small, u64),
    sequence_id=st.one_of(small, u64),
    ledger_id=st.one_of(small, ids),
    entry_id=st.one_of(small, ids),
    highest=st.one_of(st.none(), small, u64),
)
def test_encode_send_receipt_equals_protobuf(
    producer_id: int, sequence_id: int, ledger_id: int, entry_id: int, highest: int | None
) -> None:
    fast = encode_send_receipt(producer_id, sequence_id, ledger_id, entry_id, highest)
    reference = c.send_receipt(
        producer_id=producer_id,
        sequence_id=sequence_id,
        ledger_id=ledger_id,
        entry_id=entry_id,
        highest_sequence_id=highest,
    )
    assert fast == reference
    assert decode_one(fast).command == decode_one(reference).command


@given(
    consumer_id=st.one_of(small, u64),
    ledger_id=st.one_of(small, ids),
    entry_id=st.one_of(small, ids),
    payload=st.binary(max_size=300),
    checksum=st.integers(min_value=0, max_value=2**32 - 1),
    redelivery_count=st.one_of(st.just(0), st.integers(min_value=0, max_value=2**32 - 1)),
    partition=st.one_of(st.just(-1), st.integers(min_value=0, max_value=2**31 - 1)),
    ack_set=st.one_of(
        st.none(),
        st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=4),
    ),
)
def test_encode_message_equals_protobuf(
    consumer_id: int,
    ledger_id: int,
    entry_id: int,
    payload: bytes,
    checksum: int,
    redelivery_count: int,
    partition: int,
    ack_set: list[int] | None,
) -> None:
    fast = encode_message(
        consumer_id,
        ledger_id,
        entry_id,
        payload,
        checksum,
        redelivery_count=redelivery_count,
        partition=partition,
        ack_set=ack_set,
    )
    reference = c.message_frame(
        consumer_id=consumer_id,
        ledger_id=ledger_id,
        entry_id=entry_id,
        payload=payload,
        checksum=checksum,
        redelivery_count=redelivery_count,
        partition=partition,
        ack_set=ack_set,
    )
    assert fast == reference
    header = encode_message_header(
        consumer_id,
        ledger_id,
        entry_id,
        len(payload),
        checksum,
        redelivery_count=redelivery_count,
        partition=partition,
        ack_set=ack_set,
    )
    assert header + payload == fast
    frame = decode_one(fast)
    assert frame.command == decode_one(reference).command
    assert frame.payload == payload and frame.checksum == checksum


def test_encode_message_carries_a_stored_section_and_its_crc() -> None:
    md = metadata(num_messages_in_batch=3)
    sec = encode_payload_section(md, b"batch-body")
    crc = crc32c(sec)
    frame = decode_one(encode_message(4, 9, 0, sec, crc, redelivery_count=1, ack_set=[5]))
    msg = frame.command.message
    assert frame.type == T.MESSAGE
    assert (msg.consumer_id, msg.redelivery_count, list(msg.ack_set)) == (4, 1, [5])
    assert msg.message_id.HasField("entryId") and msg.message_id.entryId == 0
    assert not msg.message_id.HasField("partition")
    assert frame.payload == sec and frame.checksum_ok
    no_crc = decode_one(
        c.message_frame(consumer_id=4, ledger_id=9, entry_id=0, payload=sec, with_checksum=False)
    )
    assert no_crc.checksum is None and no_crc.payload == sec
