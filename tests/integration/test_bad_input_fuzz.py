"""Hypothesis feeds random bytes and mutated valid sessions to the codec and to a live broker.

For every example the sans-IO codec (:class:`keyshared.protocol.ServerProtocol`, the decoder the
broker runs plus the CONNECT rule) gives a verdict on the bytes; then the same bytes go to the
broker on a fresh raw connection:

- if the codec rejects them, the broker closes that connection by itself (we never send EOF);
- otherwise, once we half-close, the broker closes too (it never hangs on a dead client);
- everything the broker sent on the way decodes, and every error code is one the client knows;
- the broker is alive, and an official-client producer/consumer pair on another connection
  completes a round trip after every example; at the end every message ever confirmed to it is
  read back from the earliest position, in order.
"""

from __future__ import annotations

import contextlib
import os
import struct
import uuid
from collections.abc import Iterator

import pulsar
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyshared.protocol import Frame, ProtocolError, ServerProtocol, commands, pb
from tests.broker_process import BrokerProcess
from tests.integration.conftest import make_client
from tests.raw_client import ConnectionClosed, RawClient, metadata, raw_command

pytestmark = pytest.mark.integration

T = pb.BaseCommand
MAX_MESSAGE_SIZE = 5 * 1024 * 1024
# The client's ServerError enum stops at 25: anything higher would make it drop the connection.
MAX_SERVER_ERROR = 25

FUZZ_TOPIC = f"persistent://public/default/fuzz-{uuid.uuid4().hex[:12]}"


def _session_frames() -> list[bytes]:
    """A valid session, frame by frame: what mutations start from."""
    md = metadata(producer_name="fuzz-producer", sequence_id=0, publish_time=1_700_000_000_000)
    md.partition_key = "k"
    batch_md = metadata(producer_name="fuzz-producer", sequence_id=1, publish_time=1)
    batch_md.num_messages_in_batch = 2
    single = pb.SingleMessageMetadata(payload_size=3)
    single_bytes = single.SerializeToString()
    batch_body = (struct.pack(">I", len(single_bytes)) + single_bytes + b"abc") * 2
    return [
        commands.connect(),
        commands.partitioned_metadata(topic=FUZZ_TOPIC, request_id=1),
        commands.lookup(topic=FUZZ_TOPIC, request_id=2),
        commands.producer(
            topic=FUZZ_TOPIC, producer_id=1, request_id=3, producer_name="fuzz-producer"
        ),
        commands.send(producer_id=1, sequence_id=0, metadata=md, payload=b"hello"),
        commands.send(producer_id=1, sequence_id=1, metadata=batch_md, payload=batch_body),
        commands.subscribe(
            topic=FUZZ_TOPIC,
            subscription="fuzz-sub",
            sub_type=pb.CommandSubscribe.Key_Shared,
            consumer_id=1,
            request_id=4,
            initial_position=pb.CommandSubscribe.Earliest,
            key_shared=commands.key_shared_meta(),
        ),
        commands.flow(consumer_id=1, permits=5),
        commands.ack(consumer_id=1, message_ids=[commands.message_id(0, 0)], request_id=5),
        commands.redeliver(consumer_id=1),
        commands.seek(consumer_id=1, request_id=6, message_id=commands.message_id(-1, -1)),
        commands.get_last_message_id(consumer_id=1, request_id=7),
        commands.consumer_stats(request_id=8, consumer_id=1),
        commands.ping(),
        commands.get_topics_of_namespace(request_id=9, namespace="public/default"),
        commands.unsubscribe(consumer_id=1, request_id=10),
    ]


SESSION = _session_frames()


@st.composite
def mutated_session(draw: st.DrawFn) -> bytes:
    """A valid session (CONNECT first, usually) with a few byte-level mutations."""
    picks = draw(st.lists(st.integers(0, len(SESSION) - 1), min_size=0, max_size=8))
    frames = [SESSION[i] for i in picks]
    if draw(st.booleans()):
        frames.insert(0, SESSION[0])
    data = bytearray(b"".join(frames))
    for _ in range(draw(st.integers(0, 4))):
        if not data:
            data += draw(st.binary(min_size=1, max_size=16))
            continue
        at = draw(st.integers(0, len(data) - 1))
        kind = draw(st.sampled_from(["flip", "set", "delete", "insert", "truncate", "size"]))
        if kind == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set":
            data[at] = draw(st.integers(0, 255))
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 8))]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "truncate":
            del data[at:]
        else:
            value = draw(
                st.one_of(
                    st.integers(0, 64),
                    st.integers(MAX_MESSAGE_SIZE, MAX_MESSAGE_SIZE + 20 * 1024),
                    st.integers(0, 0xFFFFFFFF),
                )
            )
            data[at : at + 4] = struct.pack(">I", value)
    return bytes(data)


def random_bytes() -> st.SearchStrategy[bytes]:
    """Random bytes, raw or after a valid CONNECT."""
    return st.one_of(
        st.binary(max_size=600),
        st.binary(max_size=600).map(lambda b: SESSION[0] + b),
    )


def codec_rejects(data: bytes) -> bool:
    """Whether the sans-IO codec raises on ``data`` (an incomplete last frame is no error)."""
    proto = ServerProtocol(MAX_MESSAGE_SIZE)
    try:
        proto.receive_data(data)
    except ProtocolError:
        return True
    return False


class Witness:
    """An official-client producer/consumer pair that must keep working."""

    def __init__(self, client: pulsar.Client) -> None:
        self.client = client
        self.topic = f"persistent://public/default/fuzz-witness-{uuid.uuid4().hex[:12]}"
        self.consumer = client.subscribe(
            self.topic, "w", initial_position=pulsar.InitialPosition.Earliest
        )
        self.producer = client.create_producer(self.topic, batching_enabled=False)
        self.confirmed: list[tuple[pulsar.MessageId, bytes]] = []

    def round_trip(self) -> None:
        payload = f"w{len(self.confirmed)}".encode()
        mid = self.producer.send(payload)
        self.confirmed.append((mid, payload))
        msg = self.consumer.receive(timeout_millis=5000)
        assert (msg.message_id(), msg.data()) == (mid, payload)
        self.consumer.acknowledge(msg)

    def read_back(self) -> None:
        reader = self.client.create_reader(self.topic, pulsar.MessageId.earliest)
        got = []
        for _ in self.confirmed:
            msg = reader.read_next(timeout_millis=5000)
            got.append((msg.message_id(), msg.data()))
        assert got == self.confirmed
        reader.close()


def broker_log_since(broker: BrokerProcess, offset: int) -> str:
    """What the broker logged after byte ``offset`` of its log."""
    return broker.log_path.read_bytes()[offset:].decode(errors="replace")


@pytest.fixture(scope="module")
def witness(broker: BrokerProcess) -> Iterator[Witness]:
    """The module's witness; read back in full at the end."""
    log_offset = broker.log_path.stat().st_size
    client = make_client(broker.service_url)
    w = Witness(client)
    w.round_trip()
    yield w
    try:
        assert broker.proc is not None and broker.proc.poll() is None, "broker died"
        w.round_trip()
        w.read_back()
        text = broker_log_since(broker, log_offset)
        assert "Traceback" not in text and "unexpected error" not in text, text
    finally:
        client.close()


def check_frames_sent(raw: RawClient) -> None:
    """Every error the broker sent is a ServerError the official client can parse."""
    for frame in raw.received:
        cmd = frame.command
        if frame.type == T.ERROR:
            assert 0 <= cmd.error.error <= MAX_SERVER_ERROR, cmd
        elif frame.type == T.SEND_ERROR:
            assert 0 <= cmd.send_error.error <= MAX_SERVER_ERROR, cmd


def feed_broker(broker: BrokerProcess, data: bytes) -> None:
    """Send ``data`` on a fresh connection and check how the broker ends it."""
    rejects = codec_rejects(data)
    raw = RawClient.to(broker.service_url, timeout=5.0)
    try:
        try:
            raw.send(data)
        except ConnectionClosed:
            # The broker already closed on an early error and reset the rest.
            assert rejects, "broker closed on bytes the codec accepts"
        if not raw.closed_by_peer:
            if not rejects:
                raw.half_close()
            # With a codec error the broker closes by itself; otherwise it must follow our EOF.
            raw.wait_closed(timeout=5.0)
        check_frames_sent(raw)
    finally:
        raw.close()
    assert broker.proc is not None and broker.proc.poll() is None, "broker died"


# FUZZ_EXAMPLES=2000 for a longer hunt; the default keeps the module to a few seconds.
FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    print_blob=True,
)


@FUZZ
@given(data=random_bytes())
def test_random_bytes(broker: BrokerProcess, witness: Witness, data: bytes) -> None:
    feed_broker(broker, data)
    witness.round_trip()


@FUZZ
@given(data=mutated_session())
def test_mutated_sessions(broker: BrokerProcess, witness: Witness, data: bytes) -> None:
    feed_broker(broker, data)
    witness.round_trip()


# --- well-formed commands with hostile values -----------------------------------------------------

U64 = st.one_of(st.integers(0, 8), st.integers(0, (1 << 64) - 1))
I32 = st.one_of(st.integers(-2, 8), st.integers(-(1 << 31), (1 << 31) - 1))
TOPICS = st.sampled_from(
    [FUZZ_TOPIC, FUZZ_TOPIC + "-partition-0", FUZZ_TOPIC + "-b", "fuzz-short", "a/b/c", "x://y"]
)


@st.composite
def message_ids(draw: st.DrawFn) -> pb.MessageIdData:
    """Message ids that may or may not exist, with or without batch parts."""
    mid = pb.MessageIdData(ledgerId=draw(U64), entryId=draw(U64))
    if draw(st.booleans()):
        mid.batch_index = draw(I32)
        mid.batch_size = draw(I32)
    mid.ack_set.extend(draw(st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=3)))
    if draw(st.booleans()):
        mid.partition = draw(I32)
    return mid


@st.composite
def well_formed_command(draw: st.DrawFn) -> bytes:
    """One syntactically valid client command with random, often nonsensical, values."""
    kind = draw(
        st.sampled_from(
            [
                "producer",
                "subscribe",
                "send",
                "flow",
                "ack",
                "redeliver",
                "seek",
                "last",
                "stats",
                "unsubscribe",
                "close_producer",
                "close_consumer",
                "lookup",
                "metadata",
            ]
        )
    )
    small = st.integers(0, 4)
    if kind == "producer":
        return commands.producer(
            topic=draw(TOPICS),
            producer_id=draw(small),
            request_id=draw(U64),
            producer_name=draw(st.none() | st.sampled_from(["p", "fuzz-producer", ""])),
            epoch=draw(U64),
            access_mode=draw(st.integers(0, 3)),
        )
    if kind == "subscribe":
        sub_type = draw(st.integers(0, 3))
        ks = None
        if sub_type == pb.CommandSubscribe.Key_Shared:
            ks = commands.key_shared_meta(
                mode=draw(st.sampled_from([pb.AUTO_SPLIT, pb.STICKY])),
                hash_ranges=draw(st.lists(st.tuples(I32, I32), max_size=3)),
                allow_out_of_order_delivery=draw(st.booleans()),
            )
        return commands.subscribe(
            topic=draw(TOPICS),
            subscription=draw(st.sampled_from(["s1", "s2", ""])),
            sub_type=sub_type,
            consumer_id=draw(small),
            request_id=draw(U64),
            priority_level=draw(I32),
            durable=draw(st.booleans()),
            start_message_id=draw(st.none() | message_ids()),
            initial_position=draw(st.integers(0, 1)),
            key_shared=ks,
        )
    if kind == "send":
        md = pb.MessageMetadata(
            producer_name=draw(st.sampled_from(["p", "fuzz-producer"])),
            sequence_id=draw(U64),
            publish_time=draw(U64),
        )
        if draw(st.booleans()):
            md.num_messages_in_batch = draw(I32)
        if draw(st.booleans()):
            md.partition_key = draw(st.text(max_size=8))
            md.partition_key_b64_encoded = draw(st.booleans())
        if draw(st.booleans()):
            md.ordering_key = draw(st.binary(max_size=8))
        if draw(st.booleans()):
            md.compression = draw(st.sampled_from([pb.NONE, pb.LZ4, pb.ZLIB, pb.ZSTD, pb.SNAPPY]))
            md.uncompressed_size = draw(st.integers(0, 1 << 20))
        return commands.send(
            # Mostly the producer the session created, so that most SENDs get stored.
            producer_id=draw(st.sampled_from([1, 1, 1, 0, 2])),
            sequence_id=draw(U64),
            metadata=md,
            payload=draw(st.binary(max_size=64)),
            num_messages=draw(st.none() | I32),
            highest_sequence_id=draw(st.none() | U64),
            is_chunk=draw(st.booleans()),
        )
    if kind == "flow":
        return commands.flow(consumer_id=draw(small), permits=draw(st.integers(0, (1 << 32) - 1)))
    if kind == "ack":
        return commands.ack(
            consumer_id=draw(small),
            message_ids=draw(st.lists(message_ids(), max_size=3)),
            cumulative=draw(st.booleans()),
            validation_error=draw(st.none() | st.integers(0, 4)),
            request_id=draw(st.none() | U64),
        )
    if kind == "redeliver":
        return commands.redeliver(
            consumer_id=draw(small), message_ids=draw(st.lists(message_ids(), max_size=3))
        )
    if kind == "seek":
        if draw(st.booleans()):
            return commands.seek(
                consumer_id=draw(small), request_id=draw(U64), message_id=draw(message_ids())
            )
        return commands.seek(consumer_id=draw(small), request_id=draw(U64), publish_time=draw(U64))
    if kind == "last":
        return commands.get_last_message_id(consumer_id=draw(small), request_id=draw(U64))
    if kind == "stats":
        return commands.consumer_stats(request_id=draw(U64), consumer_id=draw(small))
    if kind == "unsubscribe":
        return commands.unsubscribe(consumer_id=draw(small), request_id=draw(U64))
    if kind in ("close_producer", "close_consumer"):
        cmd = pb.BaseCommand()
        if kind == "close_producer":
            cmd.type = T.CLOSE_PRODUCER
            cmd.close_producer.producer_id = draw(small)
            cmd.close_producer.request_id = draw(U64)
        else:
            cmd.type = T.CLOSE_CONSUMER
            cmd.close_consumer.consumer_id = draw(small)
            cmd.close_consumer.request_id = draw(U64)
        return raw_command(cmd.SerializeToString())
    if kind == "lookup":
        return commands.lookup(topic=draw(st.text(max_size=40)), request_id=draw(U64))
    return commands.partitioned_metadata(topic=draw(st.text(max_size=40)), request_id=draw(U64))


@FUZZ
@given(cmds=st.lists(well_formed_command(), min_size=1, max_size=12))
def test_well_formed_commands_with_hostile_values(
    broker: BrokerProcess, witness: Witness, cmds: list[bytes]
) -> None:
    """Valid frames with random ids, sizes, ranges and positions: the broker answers or closes
    the connection, and never fails inside (no traceback in its log)."""
    log_offset = broker.log_path.stat().st_size
    raw = RawClient.to(broker.service_url, timeout=5.0)
    try:
        setup = [
            commands.connect(),
            commands.producer(
                topic=FUZZ_TOPIC, producer_id=1, request_id=1, producer_name="fuzz-producer"
            ),
        ]
        # Closing is a fair answer, e.g. to a SEND for a producer id that does not exist.
        with contextlib.suppress(ConnectionClosed):
            raw.send(b"".join(setup + cmds))
            raw.ping_pong(timeout=5.0)
        check_frames_sent(raw)
    finally:
        raw.abort()
    assert broker.proc is not None and broker.proc.poll() is None, "broker died"
    witness.round_trip()
    text = broker_log_since(broker, log_offset)
    assert "Traceback" not in text and "unexpected error" not in text, text


def request_id_of(frame: Frame) -> int | None:
    """The request id of a response frame, if its command has one."""
    field = T.DESCRIPTOR.fields_by_number.get(frame.type)
    if field is None or not frame.command.HasField(field.name):
        return None
    sub = getattr(frame.command, field.name)
    if "request_id" not in sub.DESCRIPTOR.fields_by_name:
        return None
    return int(sub.request_id)


def test_unmutated_session_is_served_and_ends_cleanly(broker: BrokerProcess) -> None:
    """The mutation base itself is valid: every request is answered, then EOF closes."""
    assert not codec_rejects(b"".join(SESSION))
    raw = RawClient.to(broker.service_url)
    try:
        raw.send(b"".join(SESSION))
        answered: dict[int, int] = {}
        receipts = 0
        for frame in raw.frames(timeout=5.0):
            rid = request_id_of(frame)
            if rid is not None:
                answered[rid] = frame.type
            receipts += frame.type == T.SEND_RECEIPT
            if receipts == 2 and len(answered) == 10:
                break
        assert receipts == 2
        assert answered == {
            1: T.PARTITIONED_METADATA_RESPONSE,
            2: T.LOOKUP_RESPONSE,
            3: T.PRODUCER_SUCCESS,
            4: T.SUCCESS,
            5: T.ACK_RESPONSE,
            6: T.SUCCESS,
            7: T.GET_LAST_MESSAGE_ID_RESPONSE,
            8: T.CONSUMER_STATS_RESPONSE,
            9: T.GET_TOPICS_OF_NAMESPACE_RESPONSE,
            10: T.SUCCESS,
        }, [f.command for f in raw.received]
        raw.half_close()
        raw.wait_closed()
        check_frames_sent(raw)
    finally:
        raw.close()
