"""The admin layer's pure parts, without a broker: entry responses and their headers, finding
the n-th entry, and the CLI's argument parsing and message decoding."""

from __future__ import annotations

import json
import zlib

import pytest
import typer
from hypothesis import given
from hypothesis import strategies as st

from keyshared.admin.messages import entry_response, pulsar_time
from keyshared.admin.topic_ops import nth_entry
from keyshared.admin_cli.args import (
    parse_message_id,
    parse_reset_time,
    parse_seconds,
    parse_size_mb,
    topic_path,
)
from keyshared.admin_cli.http import HttpResult, parse_auth_params
from keyshared.admin_cli.messages import decode_messages
from keyshared.protocol import pulsar_api_pb2 as pb
from keyshared.protocol.metadata import encode_batch, encode_payload_section
from keyshared.storage.entry import Entry
from keyshared.storage.ledger import LedgerInfo
from keyshared.storage.position import Position


def _meta(**fields: object) -> pb.MessageMetadata:
    md = pb.MessageMetadata(producer_name="p", sequence_id=7, publish_time=1_700_000_000_123)
    for key, value in fields.items():
        setattr(md, key, value)
    return md


def _as_result(entry: Entry) -> HttpResult:
    resp = entry_response(entry)
    headers = {k.decode().lower(): v.decode("latin-1") for k, v in resp.raw_headers}
    return HttpResult(resp.status_code, headers, bytes(resp.body))


def test_entry_headers_follow_pulsar() -> None:
    md = _meta(partition_key="k1", event_time=1_700_000_000_000)
    md.properties.add(key="plain", value="v")
    md.properties.add(key="uni", value="é€")  # not Latin-1: only in the JSON header
    md.properties.add(key="bad key", value="x")  # not an HTTP token: only in the JSON header
    entry = Entry(Position(3, 4), encode_payload_section(md, b"hello"), 0)
    result = _as_result(entry)
    h = result.headers
    assert result.data == b"hello"
    assert h["x-pulsar-message-id"] == "3:4"
    assert h["x-pulsar-property-plain"] == "v"
    assert "x-pulsar-property-uni" not in h and "x-pulsar-property-bad key" not in h
    assert json.loads(h["x-pulsar-property"]) == {"plain": "v", "uni": "é€", "bad key": "x"}
    assert h["x-pulsar-publish-time"] == "2023-11-14T22:13:20.123Z"
    assert h["x-pulsar-event-time"] == "2023-11-14T22:13:20.000Z"
    assert h["x-pulsar-producer-name"] == "p" and h["x-pulsar-sequence-id"] == "7"
    assert h["x-pulsar-partition-key"] == "k1"
    assert "x-pulsar-num-batch-message" not in h
    [msg] = decode_messages(result)
    assert msg["payload"] == "hello" and msg["key"] == "k1"
    assert msg["properties"] == {"plain": "v", "uni": "é€", "bad key": "x"}


def test_compressed_batch_is_sent_uncompressed_and_split_by_the_cli() -> None:
    singles = []
    for i in range(3):
        single = pb.SingleMessageMetadata(partition_key=f"k{i}", sequence_id=10 + i)
        single.properties.add(key="i", value=str(i))
        singles.append((single, f"body-{i}".encode()))
    body = encode_batch(singles)
    md = _meta(num_messages_in_batch=3, compression=pb.ZLIB, uncompressed_size=len(body))
    entry = Entry(Position(1, 0), encode_payload_section(md, zlib.compress(body)), 0)
    result = _as_result(entry)
    assert result.data == body
    assert result.headers["x-pulsar-num-batch-message"] == "3"
    messages = decode_messages(result)
    assert [m["messageId"] for m in messages] == ["1:0:0", "1:0:1", "1:0:2"]
    assert [m["payload"] for m in messages] == ["body-0", "body-1", "body-2"]
    assert [m["key"] for m in messages] == ["k0", "k1", "k2"]
    assert [m["properties"] for m in messages] == [{"i": "0"}, {"i": "1"}, {"i": "2"}]
    assert [m["sequenceId"] for m in messages] == [10, 11, 12]


def test_non_pulsar_bytes_and_binary_payloads() -> None:
    odd = _as_result(Entry(Position(1, 1), b"\x00\x01", 0))
    assert odd.status == 200 and odd.data == b"\x00\x01"
    binary = _as_result(Entry(Position(1, 2), encode_payload_section(_meta(), b"\xff\xfe"), 0))
    assert decode_messages(binary)[0]["payloadBase64"] == "//4="


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_pulsar_time_never_fails(ms: int) -> None:
    assert pulsar_time(ms).endswith("Z")


class _Ledger:
    def __init__(self, spans: list[tuple[int, int]]) -> None:
        self.ledgers = [LedgerInfo(lid, n, 0) for lid, n in spans]


def test_nth_entry_counts_across_ledgers_from_either_end() -> None:
    ledger = _Ledger([(1, 2), (2, 0), (3, 3)])
    earliest = [nth_entry(ledger, n, from_latest=False) for n in range(1, 7)]  # type: ignore[arg-type]
    assert earliest == [
        Position(1, 0),
        Position(1, 1),
        Position(3, 0),
        Position(3, 1),
        Position(3, 2),
        None,
    ]
    latest = [nth_entry(ledger, n, from_latest=True) for n in range(1, 7)]  # type: ignore[arg-type]
    assert latest == [
        Position(3, 2),
        Position(3, 1),
        Position(3, 0),
        Position(1, 1),
        Position(1, 0),
        None,
    ]


def test_cli_argument_parsing() -> None:
    assert parse_size_mb("10M") == 10 and parse_size_mb("2g") == 2048
    assert parse_size_mb("-1") == -1 and parse_size_mb("4096") == 0
    assert parse_seconds("3h") == 10800 and parse_seconds("100m") == 6000
    assert parse_seconds("45") == 45 and parse_seconds("2w") == 14 * 86400
    assert parse_seconds("-1") == -1
    assert parse_reset_time("10m", now_ms=1_000_000) == 400_000
    assert parse_reset_time("2024-05-01T10:00:00Z") == 1_714_557_600_000
    assert parse_message_id("12:34") == {"ledgerId": 12, "entryId": 34, "partitionIndex": -1}
    assert parse_message_id("12:34:2")["partitionIndex"] == 2
    assert parse_message_id("earliest")["ledgerId"] == -1
    assert topic_path("t") == "/admin/v2/persistent/public/default/t"
    assert topic_path("persistent://a/b/c", "stats") == "/admin/v2/persistent/a/b/c/stats"
    for bad in (
        lambda: parse_size_mb("x"),
        lambda: parse_seconds("-5"),
        lambda: parse_message_id("1"),
        lambda: parse_reset_time("yesterday"),
        lambda: topic_path("a/b"),
    ):
        with pytest.raises(typer.BadParameter):
            bad()


def test_auth_params_forms(tmp_path: object) -> None:
    from pathlib import Path

    token_file = Path(str(tmp_path)) / "t.txt"
    token_file.write_text("abc\n")
    assert parse_auth_params("token:abc") == "abc"
    assert parse_auth_params(f"file://{token_file}") == "abc"
    assert parse_auth_params(f"file:{token_file}") == "abc"
    assert parse_auth_params('{"token": "abc"}') == "abc"
    assert parse_auth_params("abc") == "abc"
    assert parse_auth_params("") is None
