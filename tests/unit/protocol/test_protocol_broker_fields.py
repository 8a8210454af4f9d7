"""``broker_fields`` (the publish path's one-pass metadata read) against the full helpers.

For any payload section, well-formed or not, it must give what ``split_payload`` followed by
``num_messages`` and ``sticky_key`` give, or raise the same error.
"""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from keyshared.protocol import MalformedFrame, pb
from keyshared.protocol.metadata import (
    broker_fields,
    encode_payload_section,
    num_messages,
    split_payload,
    sticky_key,
)


def _reference(section: bytes) -> tuple[int, bytes, int, int, int, int] | str:
    try:
        md, _ = split_payload(section)
    except MalformedFrame as exc:
        return str(exc)
    return (
        num_messages(md),
        sticky_key(md),
        md.publish_time,
        md.deliver_at_time if md.HasField("deliver_at_time") else 0,
        md.event_time,
        md.marker_type,
    )


def _fast(section: bytes) -> tuple[int, bytes, int, int, int, int] | str:
    try:
        return broker_fields(section)
    except MalformedFrame as exc:
        return str(exc)


_u64 = st.integers(0, 2**64 - 1)
_text = st.text(max_size=12)


@st.composite
def metadata(draw: st.DrawFn) -> pb.MessageMetadata:
    md = pb.MessageMetadata()
    if draw(st.booleans()) or draw(st.booleans()):
        md.producer_name = draw(_text)
    if draw(st.integers(0, 9)):
        md.sequence_id = draw(_u64)
    if draw(st.integers(0, 9)):
        md.publish_time = draw(_u64)
    if draw(st.booleans()):
        md.partition_key = draw(st.one_of(_text, st.sampled_from(["a2V5", "a2V5LQ", "!!"])))
        md.partition_key_b64_encoded = draw(st.booleans())
    if draw(st.booleans()):
        md.ordering_key = draw(st.binary(max_size=8))
    if draw(st.booleans()):
        md.num_messages_in_batch = draw(st.integers(-(2**31), 2**31 - 1))
    if draw(st.booleans()):
        md.deliver_at_time = draw(st.integers(-(2**63), 2**63 - 1))
    if draw(st.booleans()):
        md.event_time = draw(_u64)
    if draw(st.integers(0, 3)) == 0:
        md.marker_type = draw(st.integers(0, 2**31 - 1))
    for _ in range(draw(st.integers(0, 2))):
        kv = md.properties.add()
        if draw(st.integers(0, 4)):
            kv.key = draw(_text)
        if draw(st.integers(0, 4)):
            kv.value = draw(_text)
    if draw(st.integers(0, 5)) == 0:
        ek = md.encryption_keys.add()
        if draw(st.booleans()):
            ek.key = "k"
        ek.value = b"v"
    return md


@settings(max_examples=400, deadline=None)
@given(metadata(), st.binary(max_size=16))
def test_same_fields_and_errors_as_the_full_parse(md: pb.MessageMetadata, payload: bytes) -> None:
    # Serialised partially: required fields may be missing, as a broken client could send.
    body = md.SerializePartialToString()
    section = struct.pack(">I", len(body)) + body + payload
    assert _fast(section) == _reference(section)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_same_verdict_on_arbitrary_bytes(section: bytes) -> None:
    assert _fast(section) == _reference(section)


@settings(max_examples=300, deadline=None)
@given(
    metadata(),
    st.lists(st.tuples(st.integers(0, 80), st.integers(0, 255)), min_size=1, max_size=4),
    st.integers(0, 3),
)
def test_same_verdict_on_mutated_metadata(
    md: pb.MessageMetadata, flips: list[tuple[int, int]], cut: int
) -> None:
    """Well-formed metadata with bytes overwritten and its end cut: the field reads that skip
    a presence check for a non-default value must still agree with the full parse."""
    body = bytearray(md.SerializePartialToString())
    for at, value in flips:
        if at < len(body):
            body[at] = value
    raw = bytes(body[: max(0, len(body) - cut)])
    section = struct.pack(">I", len(raw)) + raw
    assert _fast(section) == _reference(section)


def test_invalid_utf8_in_the_names_the_broker_reads() -> None:
    base = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=2)
    body = base.SerializeToString()
    for extra in (b"\x0a\x01\xff", b"\x32\x01\xff", b"\x32\x01\xff\x92\x01\x01k"):
        raw = body + extra  # producer_name or partition_key (with and without ordering_key)
        section = struct.pack(">I", len(raw)) + raw
        assert _fast(section) == _reference(section)
        assert isinstance(_fast(section), str)


def test_ordinary_unbatched_and_batched_sends() -> None:
    single = pb.MessageMetadata(
        producer_name="standalone-0-1", sequence_id=7, publish_time=1_700_000_000_000
    )
    single.partition_key = "key-7"
    batch = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=5)
    batch.num_messages_in_batch = 1000
    unkeyed = pb.MessageMetadata(producer_name="p", sequence_id=9, publish_time=5, event_time=3)
    for md in (single, batch, unkeyed):
        section = encode_payload_section(md, b"payload")
        assert _fast(section) == _reference(section)
    assert broker_fields(encode_payload_section(unkeyed))[1] == b"p-9"
