"""Bad input on one connection: that client gets Pulsar's reaction, everyone else goes on.

Each test does one bad thing on a raw socket (:mod:`tests.raw_client`) and asserts the broker's
exact answer: the error frame Pulsar would send, or the closing of that one connection. Around
every test a *witness* (the official client, with a producer and a consumer on their own
connection) and a *bystander* (a raw connection with a producer) must keep working, on the same
connections, before and after; at the end of the module every message confirmed to the witness is
read back from the earliest position.
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pulsar
import pytest

from keyshared.protocol import commands, crc32c, max_frame_size, pb
from tests.broker_process import BrokerProcess
from tests.integration.conftest import make_client
from tests.raw_client import RawClient, frame_with_size, metadata, raw_command

pytestmark = pytest.mark.integration

T = pb.BaseCommand
MAX_MESSAGE_SIZE = 5 * 1024 * 1024
FRAME_LIMIT = max_frame_size(MAX_MESSAGE_SIZE)


def new_topic(prefix: str = "bad") -> str:
    """A fresh topic name."""
    return f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:12]}"


@dataclass
class Witness:
    """An official-client producer and consumer that must work throughout the module."""

    client: pulsar.Client
    topic: str
    producer: pulsar.Producer = field(init=False)
    consumer: pulsar.Consumer = field(init=False)
    confirmed: list[tuple[pulsar.MessageId, bytes]] = field(default_factory=list)
    counter: int = 0

    def __post_init__(self) -> None:
        self.consumer = self.client.subscribe(
            self.topic, "witness", initial_position=pulsar.InitialPosition.Earliest
        )
        self.producer = self.client.create_producer(self.topic, batching_enabled=False)

    def round_trip(self, n: int = 3) -> None:
        """Send ``n`` messages and receive exactly them, in order."""
        sent = []
        for _ in range(n):
            payload = f"w-{self.counter}".encode()
            self.counter += 1
            mid = self.producer.send(payload)
            self.confirmed.append((mid, payload))
            sent.append((mid, payload))
        for mid, payload in sent:
            msg = self.consumer.receive(timeout_millis=5000)
            assert (msg.message_id(), msg.data()) == (mid, payload)
            self.consumer.acknowledge(msg)


@dataclass
class Bystander:
    """A raw connection with a producer; it must stay open through every test."""

    raw: RawClient
    producer_id: int
    producer_name: str
    seq: int = 0

    def check(self) -> None:
        """The same socket still gets a receipt for a new message."""
        self.raw.publish(self.producer_id, self.producer_name, self.seq, b"bystander")
        self.seq += 1


@pytest.fixture(scope="module")
def witness(broker: BrokerProcess) -> Iterator[Witness]:
    """The module's witness; at the end, every confirmed message is read back."""
    client = make_client(broker.service_url)
    w = Witness(client, new_topic("witness"))
    yield w
    try:
        assert broker.proc is not None and broker.proc.poll() is None, "broker died"
        reader = client.create_reader(w.topic, pulsar.MessageId.earliest)
        got = []
        for _ in range(len(w.confirmed)):
            msg = reader.read_next(timeout_millis=5000)
            got.append((msg.message_id(), msg.data()))
        assert got == w.confirmed
    finally:
        client.close()


@pytest.fixture(scope="module")
def bystander(broker: BrokerProcess) -> Iterator[Bystander]:
    """The module's bystander connection."""
    raw = RawClient.to(broker.service_url)
    raw.handshake()
    pid, name = raw.create_producer(new_topic("bystander"))
    b = Bystander(raw, pid, name)
    yield b
    raw.close()


@pytest.fixture(autouse=True)
def others_keep_working(
    broker: BrokerProcess, witness: Witness, bystander: Bystander
) -> Iterator[None]:
    """Witness and bystander work before and after each test, on the same connections."""
    witness.round_trip()
    bystander.check()
    yield
    assert broker.proc is not None and broker.proc.poll() is None, "broker died"
    witness.round_trip()
    bystander.check()


@pytest.fixture
def raw(broker: BrokerProcess) -> Iterator[RawClient]:
    """A raw connection, not yet CONNECTed."""
    r = RawClient.to(broker.service_url)
    yield r
    r.close()


@pytest.fixture
def connected(raw: RawClient) -> RawClient:
    """A raw connection after CONNECT/CONNECTED."""
    raw.handshake()
    return raw


def read_all(client: pulsar.Client, topic: str, expected: int) -> list[pulsar.Message]:
    """Read ``topic`` from the earliest message until nothing more comes."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    out: list[pulsar.Message] = []
    try:
        while True:
            timeout = 5000 if len(out) < expected else 300
            out.append(reader.read_next(timeout_millis=timeout))
    except pulsar.Timeout:
        pass
    finally:
        reader.close()
    return out


# --- checksums ---------------------------------------------------------------------------------


def test_wrong_checksum_gets_checksum_error_and_is_not_stored(
    connected: RawClient, broker: BrokerProcess
) -> None:
    topic = new_topic()
    pid, name = connected.create_producer(topic)
    good = connected.send_frame(pid, name, 0, b"good-0")
    bad_payload = b"corrupted"
    # The frame's bytes are intact but its CRC32C is that of another payload.
    wrong_crc = crc32c(b"something else")
    bad = connected.send_frame(pid, name, 1, bad_payload, checksum=wrong_crc)
    # The receipt of the good message waits for the disk; the error does not (as in Pulsar), so
    # send the bad one only once the good one is confirmed to get a fixed order of answers.
    connected.send(good)
    receipt = connected.expect(T.SEND_RECEIPT).send_receipt
    assert receipt.sequence_id == 0
    connected.send(bad)
    err = connected.expect(T.SEND_ERROR).send_error
    assert (err.producer_id, err.sequence_id, err.error) == (pid, 1, pb.ChecksumError)
    # The connection is still usable: the next good SEND is stored and confirmed.
    after = connected.publish(pid, name, 2, b"good-2")
    assert (after.message_id.ledgerId, after.message_id.entryId) > (
        receipt.message_id.ledgerId,
        receipt.message_id.entryId,
    )
    client = make_client(broker.service_url)
    try:
        msgs = read_all(client, topic, 2)
        assert [m.data() for m in msgs] == [b"good-0", b"good-2"]
    finally:
        client.close()


def test_send_without_checksum_is_accepted(connected: RawClient, broker: BrokerProcess) -> None:
    """The CRC is optional on the wire (clients before protocol v6 leave it out)."""
    topic = new_topic()
    pid, name = connected.create_producer(topic)
    connected.send(
        commands.send(
            producer_id=pid,
            sequence_id=0,
            metadata=metadata(producer_name=name, sequence_id=0),
            payload=b"no crc",
            with_checksum=False,
        )
    )
    assert connected.expect(T.SEND_RECEIPT).send_receipt.sequence_id == 0
    client = make_client(broker.service_url)
    try:
        assert [m.data() for m in read_all(client, topic, 1)] == [b"no crc"]
    finally:
        client.close()


def test_payload_flipped_after_checksum_gets_checksum_error(connected: RawClient) -> None:
    """A bit flipped in transit (after the CRC was computed) is caught the same way."""
    pid, name = connected.create_producer(new_topic())
    frame = bytearray(connected.send_frame(pid, name, 0, b"some payload bytes"))
    frame[-3] ^= 0x10
    connected.send(bytes(frame))
    err = connected.expect(T.SEND_ERROR).send_error
    assert (err.sequence_id, err.error) == (0, pb.ChecksumError)
    connected.publish(pid, name, 1, b"fine")


# --- sizes ---------------------------------------------------------------------------------------


def test_frame_at_the_limit_is_accepted_and_one_byte_more_closes(
    broker: BrokerProcess, connected: RawClient
) -> None:
    topic = new_topic()
    pid, name = connected.create_producer(topic)
    probe = connected.send_frame(pid, name, 0, b"")
    payload = b"L" * (FRAME_LIMIT - (len(probe) - 4))
    exact = connected.send_frame(pid, name, 0, payload)
    assert struct.unpack_from(">I", exact)[0] == FRAME_LIMIT
    connected.send(exact)
    connected.expect(T.SEND_RECEIPT, timeout=15)

    over = connected.send_frame(pid, name, 1, payload + b"!")
    assert struct.unpack_from(">I", over)[0] == FRAME_LIMIT + 1
    # The broker must refuse on the header alone, before the body arrives.
    connected.send(over[:4096])
    assert [f.type for f in connected.wait_closed()] == []

    client = make_client(broker.service_url)
    try:
        msgs = read_all(client, topic, 1)
        assert [len(m.data()) for m in msgs] == [len(payload)]
    finally:
        client.close()


def test_huge_announced_frame_closes_before_the_body(raw: RawClient) -> None:
    raw.handshake()
    raw.send(struct.pack(">I", 0xFFFFFFFF) + b"\x00" * 16)
    raw.wait_closed()


def test_official_client_too_big_message_fails_client_side(broker: BrokerProcess) -> None:
    client = make_client(broker.service_url)
    try:
        topic = new_topic()
        producer = client.create_producer(topic, batching_enabled=False)
        with pytest.raises(pulsar.MessageTooBig):
            producer.send(b"x" * (MAX_MESSAGE_SIZE + 1))
        # The producer and the broker go on.
        mid = producer.send(b"small")
        msgs = read_all(client, topic, 1)
        assert [(m.message_id(), m.data()) for m in msgs] == [(mid, b"small")]
    finally:
        client.close()


# --- framing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "first",
    [
        pytest.param(
            lambda: commands.producer(topic=new_topic(), producer_id=1, request_id=1), id="PRODUCER"
        ),
        pytest.param(
            lambda: commands.subscribe(
                topic=new_topic(),
                subscription="s",
                sub_type=pb.CommandSubscribe.Shared,
                consumer_id=1,
                request_id=1,
            ),
            id="SUBSCRIBE",
        ),
        pytest.param(lambda: commands.lookup(topic=new_topic(), request_id=1), id="LOOKUP"),
        pytest.param(
            lambda: commands.partitioned_metadata(topic=new_topic(), request_id=1),
            id="PARTITIONED_METADATA",
        ),
        pytest.param(
            lambda: commands.send(
                producer_id=1,
                sequence_id=0,
                metadata=pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1),
                payload=b"x",
            ),
            id="SEND",
        ),
        pytest.param(lambda: commands.flow(consumer_id=1, permits=10), id="FLOW"),
    ],
)
def test_command_before_connect_closes(raw: RawClient, first: Callable[[], bytes]) -> None:
    raw.send(first())
    assert raw.wait_closed() == []


def test_second_connect_closes(connected: RawClient) -> None:
    connected.send(commands.connect())
    assert connected.wait_closed() == []


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(raw_command(b"\x08\xc8\x01"), id="unknown-type-200"),
        pytest.param(raw_command(b"\x08\x32\x92\x03\x02\x08\x01"), id="NEW_TXN-unknown-to-us"),
        pytest.param(raw_command(b""), id="no-type"),
        pytest.param(raw_command(b"\xff\xff\xff\xff"), id="unparseable-command"),
        pytest.param(frame_with_size(b"\x00\x00\x00\x09\x08\x12"), id="cmd-size-past-frame"),
        pytest.param(frame_with_size(b"\x00\x00", 2), id="frame-too-small"),
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", id="http"),
        pytest.param(raw_command(b"\x08\x03"), id="CONNECTED-without-body"),
        pytest.param(raw_command(b"\x0a\x02\x08\x12"), id="type-with-wrong-wire-type"),
    ],
)
def test_malformed_frame_after_connect_closes(connected: RawClient, data: bytes) -> None:
    connected.send(data)
    assert connected.wait_closed() == []


def test_server_command_without_request_id_closes(connected: RawClient) -> None:
    cmd = pb.BaseCommand(type=T.ACTIVE_CONSUMER_CHANGE)
    cmd.active_consumer_change.consumer_id = 1
    cmd.active_consumer_change.is_active = True
    connected.send(raw_command(cmd.SerializeToString()))
    assert connected.wait_closed() == []


def test_unserved_command_with_request_id_gets_not_allowed(connected: RawClient) -> None:
    # A response sent to the broker: a command it knows but does not serve (GET_OR_CREATE_SCHEMA
    # was the example until the schema registry served it).
    cmd = pb.BaseCommand(type=T.GET_SCHEMA_RESPONSE)
    sub = cmd.getSchemaResponse
    sub.request_id = 77
    connected.send(raw_command(cmd.SerializeToString()))
    err = connected.expect(T.ERROR).error
    assert (err.request_id, err.error) == (77, pb.NotAllowedError)
    connected.ping_pong()


def test_truncated_frame_then_close_releases_the_connection(
    broker: BrokerProcess, raw: RawClient
) -> None:
    raw.handshake()
    topic = new_topic()
    pid, name = raw.create_producer(topic)
    frame = raw.send_frame(pid, name, 0, b"half")
    raw.send(frame[: len(frame) // 2])
    raw.half_close()
    raw.wait_closed()
    assert_no_publishers(broker, topic)


# --- names and ids -------------------------------------------------------------------------------

BAD_TOPICS = [
    "persistent://public/default/a/b",
    "unknown://public/default/x",
    "persistent://public/default/",
    "persistent:///default/x",
    "persistent://public/default/sp ace",
    "",
]


@pytest.mark.parametrize("topic", BAD_TOPICS)
def test_producer_on_bad_topic_name_gets_invalid_topic_name(
    connected: RawClient, topic: str
) -> None:
    rid = connected.request_id()
    connected.send(commands.producer(topic=topic, producer_id=9, request_id=rid))
    err = connected.expect(T.ERROR).error
    assert (err.request_id, err.error) == (rid, pb.InvalidTopicName)
    connected.create_producer(new_topic())


@pytest.mark.parametrize("topic", BAD_TOPICS)
def test_subscribe_on_bad_topic_name_gets_invalid_topic_name(
    connected: RawClient, topic: str
) -> None:
    rid = connected.request_id()
    connected.send(
        commands.subscribe(
            topic=topic,
            subscription="s",
            sub_type=pb.CommandSubscribe.Shared,
            consumer_id=9,
            request_id=rid,
        )
    )
    err = connected.expect(T.ERROR).error
    assert (err.request_id, err.error) == (rid, pb.InvalidTopicName)
    connected.subscribe(new_topic(), "s")


@pytest.mark.parametrize("topic", BAD_TOPICS)
def test_lookup_and_metadata_on_bad_topic_name_fail_with_invalid_topic_name(
    connected: RawClient, topic: str
) -> None:
    rid1, rid2 = connected.request_id(), connected.request_id()
    connected.send(commands.lookup(topic=topic, request_id=rid1))
    connected.send(commands.partitioned_metadata(topic=topic, request_id=rid2))
    lookup = connected.expect(T.LOOKUP_RESPONSE).lookupTopicResponse
    assert (lookup.request_id, lookup.response, lookup.error) == (
        rid1,
        pb.CommandLookupTopicResponse.Failed,
        pb.InvalidTopicName,
    )
    meta = connected.expect(T.PARTITIONED_METADATA_RESPONSE).partitionMetadataResponse
    assert (meta.request_id, meta.response, meta.error) == (
        rid2,
        pb.CommandPartitionedTopicMetadataResponse.Failed,
        pb.InvalidTopicName,
    )


def test_send_for_unknown_producer_closes(connected: RawClient) -> None:
    """Pulsar's ServerCnx closes the connection on a SEND for a producer it does not know."""
    connected.create_producer(new_topic())
    connected.send(connected.send_frame(12345, "nobody", 0, b"x"))
    assert connected.wait_closed() == []


def test_flow_ack_redeliver_for_unknown_consumer_are_ignored(connected: RawClient) -> None:
    """Pulsar drops these silently (no request to answer, or an ACK it discards)."""
    connected.send(commands.flow(consumer_id=4242, permits=100))
    connected.send(commands.ack(consumer_id=4242, message_ids=[commands.message_id(1, 2)]))
    connected.send(
        commands.ack(
            consumer_id=4242,
            message_ids=[commands.message_id(1, 2)],
            request_id=connected.request_id(),
        )
    )
    connected.send(commands.redeliver(consumer_id=4242))
    connected.send(commands.redeliver(consumer_id=4242, message_ids=[commands.message_id(1, 2)]))
    assert connected.ping_pong() == []


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(
            lambda rid: commands.seek(
                consumer_id=4242, request_id=rid, message_id=commands.message_id(0, 0)
            ),
            id="SEEK-message-id",
        ),
        pytest.param(
            lambda rid: commands.seek(consumer_id=4242, request_id=rid, publish_time=1),
            id="SEEK-time",
        ),
        pytest.param(
            lambda rid: commands.get_last_message_id(consumer_id=4242, request_id=rid),
            id="GET_LAST_MESSAGE_ID",
        ),
        pytest.param(
            lambda rid: commands.unsubscribe(consumer_id=4242, request_id=rid), id="UNSUBSCRIBE"
        ),
    ],
)
def test_request_for_unknown_consumer_gets_metadata_error(
    connected: RawClient, build: Callable[[int], bytes]
) -> None:
    """Pulsar answers ERROR MetadataError "Consumer not found" and keeps the connection."""
    rid = connected.request_id()
    connected.send(build(rid))
    err = connected.expect(T.ERROR).error
    assert (err.request_id, err.error) == (rid, pb.MetadataError)
    assert connected.ping_pong() == []


def test_consumer_stats_for_unknown_consumer_gets_consumer_not_found(
    connected: RawClient,
) -> None:
    rid = connected.request_id()
    connected.send(commands.consumer_stats(request_id=rid, consumer_id=4242))
    resp = connected.expect(T.CONSUMER_STATS_RESPONSE).consumerStatsResponse
    assert (resp.request_id, resp.error_code) == (rid, pb.ConsumerNotFound)


def test_close_unknown_producer_or_consumer_succeeds(connected: RawClient) -> None:
    """Pulsar answers SUCCESS: the client may close what the broker already dropped."""
    rid1, rid2 = connected.request_id(), connected.request_id()
    cp = pb.BaseCommand(type=T.CLOSE_PRODUCER)
    cp.close_producer.producer_id = 4242
    cp.close_producer.request_id = rid1
    cc = pb.BaseCommand(type=T.CLOSE_CONSUMER)
    cc.close_consumer.consumer_id = 4242
    cc.close_consumer.request_id = rid2
    connected.send(raw_command(cp.SerializeToString()) + raw_command(cc.SerializeToString()))
    assert connected.expect(T.SUCCESS).success.request_id == rid1
    assert connected.expect(T.SUCCESS).success.request_id == rid2


@pytest.mark.parametrize(
    ("sub_type", "cumulative"),
    [
        (pb.CommandSubscribe.Shared, False),
        (pb.CommandSubscribe.Key_Shared, False),
        (pb.CommandSubscribe.Exclusive, False),
        (pb.CommandSubscribe.Exclusive, True),
    ],
    ids=["Shared", "Key_Shared", "Exclusive", "Exclusive-cumulative"],
)
def test_ack_of_positions_that_do_not_exist_acks_nothing(
    connected: RawClient, sub_type: int, cumulative: bool
) -> None:
    """ACKs naming messages that do not exist (yet) are answered but must not swallow the
    messages that later arrive at those positions."""
    topic = new_topic()
    cid = connected.new_id()
    rid = connected.request_id()
    connected.send(
        commands.subscribe(
            topic=topic,
            subscription="s",
            sub_type=sub_type,
            consumer_id=cid,
            request_id=rid,
            initial_position=pb.CommandSubscribe.Earliest,
            key_shared=commands.key_shared_meta()
            if sub_type == pb.CommandSubscribe.Key_Shared
            else None,
        )
    )
    assert connected.expect(T.SUCCESS).success.request_id == rid
    pid, name = connected.create_producer(topic)
    first = connected.publish(pid, name, 0, b"m0").message_id
    ledger, entry = first.ledgerId, first.entryId
    bogus = [
        commands.message_id(ledger, entry + 3),
        commands.message_id(ledger + 1000, 0),
        commands.message_id(-1, -1),
        commands.message_id((1 << 63) - 1, (1 << 63) - 1),
    ]
    for mid in bogus:
        ack_rid = connected.request_id()
        connected.send(
            commands.ack(
                consumer_id=cid, message_ids=[mid], cumulative=cumulative, request_id=ack_rid
            )
        )
        assert connected.expect(T.ACK_RESPONSE).ackResponse.request_id == ack_rid
    for seq in range(1, 6):
        connected.publish(pid, name, seq, f"m{seq}".encode())
    connected.send(commands.flow(consumer_id=cid, permits=100))
    got: list[int] = []
    deadline = time.monotonic() + 5
    while len(got) < 6 and time.monotonic() < deadline:
        frame = connected.recv(timeout=max(0.1, deadline - time.monotonic()))
        if frame.type == T.MESSAGE:
            got.append(frame.command.message.message_id.entryId)
    assert got == [entry + k for k in range(6)]


@pytest.mark.parametrize(
    "ranges",
    [
        [(50, 150)],
        [(200, 100)],
        [],
        [(-5, 10)],
        [(60_000, 70_000)],
        [(300, 400), (350, 450)],
    ],
    ids=["overlaps-other", "start-after-end", "none", "negative", "past-65535", "self-overlap"],
)
def test_bad_sticky_hash_ranges_get_consumer_assign_error(
    connected: RawClient, ranges: list[tuple[int, int]]
) -> None:
    topic = new_topic()

    def subscribe(hash_ranges: list[tuple[int, int]]) -> pb.BaseCommand:
        rid = connected.request_id()
        connected.send(
            commands.subscribe(
                topic=topic,
                subscription="ks",
                sub_type=pb.CommandSubscribe.Key_Shared,
                consumer_id=connected.new_id(),
                request_id=rid,
                key_shared=commands.key_shared_meta(mode=pb.STICKY, hash_ranges=hash_ranges),
            )
        )
        frame = connected.recv()
        assert request_id_of(frame.command) == rid
        return frame.command

    assert subscribe([(0, 100)]).type == T.SUCCESS
    answer = subscribe(ranges)
    assert answer.type == T.ERROR and answer.error.error == pb.ConsumerAssignError, answer
    assert subscribe([(1000, 2000)]).type == T.SUCCESS


def request_id_of(cmd: pb.BaseCommand) -> int:
    """The request id of a SUCCESS or ERROR."""
    return int(cmd.success.request_id if cmd.type == T.SUCCESS else cmd.error.request_id)


# --- vanishing clients -------------------------------------------------------------------------


def assert_no_publishers(broker: BrokerProcess, topic: str, timeout: float = 5.0) -> None:
    """The broker released every producer of ``topic`` (no leak after a lost connection)."""
    path = "/admin/v2/" + topic.replace("://", "/") + "/stats"
    deadline = time.monotonic() + timeout
    while True:
        status, stats = broker.admin("GET", path)
        assert status == 200, stats
        if not stats["publishers"]:
            return
        assert time.monotonic() < deadline, stats["publishers"]
        time.sleep(0.05)


def test_producer_vanishing_mid_frame_leaves_others_unaffected(
    broker: BrokerProcess, raw: RawClient
) -> None:
    raw.handshake()
    topic = new_topic()
    pid, name = raw.create_producer(topic)
    raw.publish(pid, name, 0, b"confirmed")
    frame = raw.send_frame(pid, name, 1, b"never finished" * 100)
    raw.send(frame[: len(frame) - 7])
    raw.abort()
    assert_no_publishers(broker, topic)
    client = make_client(broker.service_url)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"after")
        assert [m.data() for m in read_all(client, topic, 2)] == [b"confirmed", b"after"]
    finally:
        client.close()


def test_consumer_vanishing_mid_ack_redelivers_its_messages(
    broker: BrokerProcess, raw: RawClient
) -> None:
    raw.handshake()
    topic = new_topic()
    client = make_client(broker.service_url)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        cid = raw.subscribe(topic, "shared", pb.CommandSubscribe.Shared)
        sent = [producer.send(f"m{i}".encode()) for i in range(20)]
        raw.send(commands.flow(consumer_id=cid, permits=100))
        delivered: list[pb.MessageIdData] = []
        while len(delivered) < 20:
            frame = raw.recv()
            assert frame.type == T.MESSAGE
            delivered.append(frame.command.message.message_id)
        # Ack the first 5, then die in the middle of the ACK for the rest.
        raw.send(commands.ack(consumer_id=cid, message_ids=delivered[:5]))
        raw.ping_pong()
        ack_rest = commands.ack(consumer_id=cid, message_ids=delivered[5:])
        raw.send(ack_rest[: len(ack_rest) // 2])
        raw.abort()
        consumer = client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared)
        got = set()
        for _ in range(15):
            msg = consumer.receive(timeout_millis=5000)
            got.add(msg.data())
            consumer.acknowledge(msg)
        assert got == {f"m{i}".encode() for i in range(5, 20)}
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=300)
        assert len(sent) == 20
    finally:
        client.close()


def test_many_bad_connections_do_not_leak(broker: BrokerProcess) -> None:
    """Connections that die in every bad way are all released by the broker."""
    topic = new_topic()
    for i in range(30):
        r = RawClient.to(broker.service_url)
        r.handshake()
        pid, name = r.create_producer(topic)
        try:
            if i % 3 == 2:
                r.send(b"\xff" * 8)
                r.wait_closed()
                continue
            frame = r.send_frame(pid, name, 0, b"x" * 1000)
            r.send(frame[: 10 + i * 7])
            if i % 3 == 0:
                r.abort()
            else:
                r.half_close()
                r.wait_closed()
        finally:
            r.close()
    assert_no_publishers(broker, topic)


def test_silent_clients_are_closed_by_keepalive(fresh_broker: BrokerProcess) -> None:
    """A client that stops answering (gone without FIN or RST, or stuck mid-frame) is closed
    after two keepalive intervals and its producer released; a live client stays connected."""
    fresh_broker.conf["keepAliveIntervalSeconds"] = 1
    fresh_broker.start()
    topic = new_topic()
    silent = RawClient.to(fresh_broker.service_url)
    stuck = RawClient.to(fresh_broker.service_url)
    client = make_client(fresh_broker.service_url)
    try:
        silent.handshake()
        silent.create_producer(topic)
        stuck.handshake()
        pid, name = stuck.create_producer(topic)
        frame = stuck.send_frame(pid, name, 0, b"stuck")
        stuck.send(frame[:-3])
        producer = client.create_producer(topic, batching_enabled=False)
        started = time.monotonic()
        # Read without answering PINGs: the broker must give up on both.
        silent.wait_closed_silently(timeout=6)
        stuck.wait_closed_silently(timeout=6 - (time.monotonic() - started))
        # The official client answered the broker's PINGs and kept its connection.
        producer.send(b"alive")
        status, stats = fresh_broker.admin(
            "GET", "/admin/v2/" + topic.replace("://", "/") + "/stats"
        )
        assert status == 200
        assert len(stats["publishers"]) == 1
    finally:
        silent.close()
        stuck.close()
        client.close()


def test_consumer_that_never_reads_does_not_stall_the_others(
    broker: BrokerProcess, raw: RawClient
) -> None:
    """A Shared consumer with unlimited permits that stops reading its socket holds only what
    fits in the buffers; the other consumer gets the rest, and everything once it vanishes."""
    raw.handshake()
    topic = new_topic()
    client = make_client(broker.service_url)
    try:
        raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        cid = raw.subscribe(topic, "shared", pb.CommandSubscribe.Shared)
        raw.send(commands.flow(consumer_id=cid, permits=(1 << 32) - 1))
        other = client.subscribe(
            topic, "shared", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=100
        )
        producer = client.create_producer(
            topic, batching_enabled=False, max_pending_messages=2000, block_if_queue_full=True
        )
        n, filler = 3000, b"x" * 10_000
        for i in range(n):
            producer.send_async(filler + str(i).encode(), None)
        producer.flush()

        def drain() -> set[bytes]:
            got = set()
            try:
                while True:
                    msg = other.receive(timeout_millis=1000)
                    got.add(msg.data()[len(filler) :])
                    other.acknowledge(msg)
            except pulsar.Timeout:
                return got

        first = drain()
        assert len(first) > n // 2, len(first)
        raw.abort()
        assert first | drain() == {str(i).encode() for i in range(n)}
    finally:
        client.close()


def test_send_in_flight_after_broker_closed_the_producer_is_ignored(
    broker: BrokerProcess, connected: RawClient
) -> None:
    """When the broker closes a producer (here: topic unload), SENDs the client had already
    written are expected: Pulsar ignores them for a keepalive interval instead of closing the
    connection, which would also cut every other producer and consumer sharing it."""
    topic = new_topic()
    pid, name = connected.create_producer(topic)
    connected.publish(pid, name, 0, b"before")
    status, body = broker.admin("PUT", "/admin/v2/" + topic.replace("://", "/") + "/unload")
    assert status == 204, body
    connected.send(connected.send_frame(pid, name, 1, b"in flight"))
    frames = connected.ping_pong()
    assert [f.type for f in frames] == [T.CLOSE_PRODUCER]
    assert frames[0].command.close_producer.producer_id == pid
    # The client re-creates the producer under the same id and resends.
    rid = connected.request_id()
    connected.send(commands.producer(topic=topic, producer_id=pid, request_id=rid))
    assert connected.expect(T.PRODUCER_SUCCESS).producer_success.request_id == rid
    connected.publish(pid, name, 1, b"in flight")
