"""ServerProtocol: the CONNECT handshake state machine."""

from __future__ import annotations

import pytest

from keyshared.protocol import commands as c
from keyshared.protocol import pulsar_api_pb2 as pb
from keyshared.protocol.connection import ConnectionState, ServerProtocol
from keyshared.protocol.errors import FrameTooLarge, MalformedFrame, ProtocolViolation


def state(proto: ServerProtocol) -> ConnectionState:
    # A call, so that mypy does not narrow the attribute across receive_data().
    return proto.state


def test_connect_then_commands() -> None:
    proto = ServerProtocol()
    assert state(proto) is ConnectionState.AWAITING_CONNECT
    assert proto.max_frame_size == 5 * 1024 * 1024 + 10 * 1024
    data = c.connect(protocol_version=15) + c.ping() + c.flow(consumer_id=1, permits=5)
    frames = proto.receive_data(data[:10])
    assert frames == []
    frames = proto.receive_data(data[10:])
    assert [f.type for f in frames] == [
        pb.BaseCommand.CONNECT,
        pb.BaseCommand.PING,
        pb.BaseCommand.FLOW,
    ]
    assert state(proto) is ConnectionState.CONNECTED
    assert proto.client_protocol_version == 15
    assert proto.protocol_version == 15
    proto.close()
    assert state(proto) is ConnectionState.CLOSED
    assert proto.receive_data(c.ping()) == []


def test_protocol_version_is_capped_at_ours() -> None:
    proto = ServerProtocol()
    proto.receive_data(c.connect(protocol_version=99))
    assert proto.protocol_version == 20


@pytest.mark.parametrize(
    "first",
    [
        c.ping(),
        c.lookup(topic="t", request_id=1),
        c.producer(topic="t", producer_id=0, request_id=0),
    ],
)
def test_anything_before_connect_is_a_violation(first: bytes) -> None:
    proto = ServerProtocol()
    with pytest.raises(ProtocolViolation, match="expected CONNECT first") as info:
        proto.receive_data(first)
    assert info.value.code == pb.NotAllowedError
    assert state(proto) is ConnectionState.CLOSED


def test_second_connect_is_a_violation() -> None:
    proto = ServerProtocol()
    proto.receive_data(c.connect())
    with pytest.raises(ProtocolViolation, match="twice"):
        proto.receive_data(c.connect())
    assert state(proto) is ConnectionState.CLOSED


def test_frame_limit_follows_max_message_size() -> None:
    proto = ServerProtocol(max_message_size=1000)
    assert proto.max_frame_size == 1000 + 10240
    proto.receive_data(c.connect())
    with pytest.raises(FrameTooLarge):
        proto.receive_data((1000 + 10241).to_bytes(4, "big"))
    assert state(proto) is ConnectionState.CLOSED


def test_malformed_frame_closes() -> None:
    proto = ServerProtocol()
    with pytest.raises(MalformedFrame):
        proto.receive_data(b"\x00\x00\x00\x05\x00\x00\x00\x01\xff")
    assert state(proto) is ConnectionState.CLOSED
