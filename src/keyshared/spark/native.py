"""A range reader that speaks the binary protocol itself, for the source's hot path.

The official client hands Python one ``pulsar.Message`` at a time; each row then costs a dozen
calls into C++ (about 13 µs a row, ~75 000 rows/s on one core here). Entries arrive on the wire
whole, batch and all, so this reader takes MESSAGE frames with keyshared's sans-IO codec and
splits each batch entry into columns in one pass (several times faster). It covers what the
source needs: LOOKUP (following redirects), a non-durable Exclusive subscription at a start
position, FLOW, PING; plain-text ``pulsar://`` without authentication, uncompressed or
ZLIB/LZ4/ZSTD/SNAPPY payloads (the last three with their optional Python modules).

Anything else (TLS, authentication, compacted reads, chunked or encrypted messages) goes through
the official client: ``reader=client`` forces it, ``reader=auto`` (the default) picks it when
needed.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

from keyshared.protocol import FrameDecoder, commands, max_frame_size, pb, split_payload
from keyshared.protocol.metadata import decompress
from keyshared.spark.positions import BEFORE_ALL, AckedRanges, Pos
from keyshared.spark.schema import BatchBuilder

_T = pb.BaseCommand
_U32 = struct.Struct(">I")
_CONSUMER_ID = 1
_PERMITS = 5000


class NativeReadError(RuntimeError):
    """The broker refused or dropped the read (the task fails; Spark retries it)."""


class NeedsClient(NativeReadError):
    """The entries need a feature only the official client has (chunks, encryption)."""


def usable(service_url: str, client_kwargs: dict[str, Any], read_compacted: bool) -> bool:
    """Whether the native reader can serve this read."""
    return (
        service_url.startswith("pulsar://")
        and "," not in service_url
        and not read_compacted
        and "authentication" not in client_kwargs
    )


def _varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class _Conn:
    """One blocking connection with a frame decoder."""

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = FrameDecoder(max_frame_size())
        self.sock.sendall(commands.connect())
        frame = self.next_frame()
        if frame.type != _T.CONNECTED:
            raise NativeReadError(f"CONNECT answered {_T.Type.Name(frame.type)}")

    def next_frame(self) -> Any:
        decoder = self.decoder
        while True:
            frame = decoder.next_frame()
            if frame is not None:
                if frame.type == _T.PING:
                    self.sock.sendall(commands.pong())
                    continue
                return frame
            data = self.sock.recv(1 << 20)
            if not data:
                raise NativeReadError("the broker closed the connection")
            decoder.feed(data)

    def request(self, data: bytes, want: int) -> Any:
        """Send a request and return the first answer of type ``want`` (or fail on ERROR)."""
        self.sock.sendall(data)
        while True:
            frame = self.next_frame()
            if frame.type == want:
                return frame
            if frame.type == _T.ERROR:
                err = frame.command.error
                raise NativeReadError(f"{pb.ServerError.Name(err.error)}: {err.message}")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def _connect(service_url: str, topic: str, timeout_s: float) -> _Conn:
    """A connection to the broker that owns ``topic`` (LOOKUP, following redirects)."""
    url = urlparse(service_url)
    host, port = url.hostname or "127.0.0.1", url.port or 6650
    authoritative = False
    for _ in range(8):
        conn = _Conn(host, port, timeout_s)
        frame = conn.request(
            commands.lookup(topic=topic, request_id=1, authoritative=authoritative),
            _T.LOOKUP_RESPONSE,
        )
        answer = frame.command.lookupTopicResponse
        if answer.response == pb.CommandLookupTopicResponse.Failed:
            conn.close()
            raise NativeReadError(f"lookup of {topic} failed: {answer.message}")
        target = urlparse(answer.brokerServiceUrl) if answer.brokerServiceUrl else url
        same = answer.proxy_through_service_url or (
            (target.hostname, target.port or 6650) == (host, port)
        )
        if answer.response == pb.CommandLookupTopicResponse.Connect and same:
            return conn
        conn.close()
        host, port = target.hostname or host, target.port or 6650
        authoritative = answer.authoritative
    raise NativeReadError(f"lookup of {topic}: too many redirects")


def read_native(
    service_url: str,
    topic: str,
    partition: int,
    start: Pos,
    end: Pos,
    *,
    acked: AckedRanges,
    builder: BatchBuilder,
    rows_per_batch: int,
    poll_timeout_ms: int,
    on_first: Any,
    on_timeout: Any,
) -> Iterator[Any]:
    """Yield record batches of the entries in ``(start, end]`` (minus ``acked``).

    ``on_first(pos)`` is called with the first entry in range; ``on_timeout(last)`` when nothing
    arrives for ``poll_timeout_ms`` (it raises or returns to end the read).
    """
    timeout_s = max(poll_timeout_ms / 1000.0, 0.001)
    conn = _connect(service_url, topic, min(timeout_s, 30.0))
    sock = conn.sock
    try:
        start_id = None
        if start != BEFORE_ALL:
            mask = (1 << 64) - 1  # -1 travels as uint64 max, as the C++ client sends it
            start_id = pb.MessageIdData(ledgerId=start[0] & mask, entryId=start[1] & mask)
        conn.request(
            commands.subscribe(
                topic=topic,
                subscription=f"keyshared-spark-{uuid.uuid4().hex[:12]}",
                sub_type=pb.CommandSubscribe.Exclusive,
                consumer_id=_CONSUMER_ID,
                request_id=2,
                durable=False,
                start_message_id=start_id,
                initial_position=pb.CommandSubscribe.Earliest,
            ),
            _T.SUCCESS,
        )
        sock.sendall(commands.flow(consumer_id=_CONSUMER_ID, permits=_PERMITS))
        sock.settimeout(timeout_s)
        yield from _entries(
            conn, partition, start, end, acked, builder, rows_per_batch, on_first, on_timeout
        )
    finally:
        # The subscription is non-durable: closing the connection removes it (a CLOSE_CONSUMER
        # would first have to wait behind the entries already in flight).
        conn.close()


def _entries(
    conn: _Conn,
    partition: int,
    start: Pos,
    end: Pos,
    acked: AckedRanges,
    builder: BatchBuilder,
    rows_per_batch: int,
    on_first: Any,
    on_timeout: Any,
) -> Iterator[Any]:
    MESSAGE = _T.MESSAGE
    SMM = pb.SingleMessageMetadata
    unpack = _U32.unpack_from
    part_bytes = b"\x18" + _varint(partition)
    suffixes: dict[int, list[bytes]] = {}
    since = 0
    last = start
    first = True
    b = builder
    values, keys, okeys, ids = b.values, b.keys, b.okeys, b.ids
    lids, eids, bidx, pubs, evs = b.lids, b.eids, b.batch, b.publish_ms, b.event_ms
    poff, pkeys, pvals = b.prop_offsets, b.prop_keys, b.prop_vals
    while True:
        try:
            frame = conn.next_frame()
        except TimeoutError:
            on_timeout(last)
            break
        if frame.type != MESSAGE:
            if frame.type == _T.CLOSE_CONSUMER:
                raise NativeReadError("the broker closed the reader (topic moved or deleted)")
            if frame.type == _T.REACHED_END_OF_TOPIC:
                on_timeout(last)
                break
            continue
        if not frame.checksum_ok:
            raise NativeReadError("corrupt entry (CRC32C mismatch)")
        mid = frame.command.message.message_id
        pos = (mid.ledgerId, mid.entryId)
        md, payload = split_payload(frame.payload)
        count = md.num_messages_in_batch if md.HasField("num_messages_in_batch") else 0
        since += count or 1
        if since >= _PERMITS // 2:
            conn.sock.sendall(commands.flow(consumer_id=_CONSUMER_ID, permits=since))
            since = 0
        if pos <= start:
            continue
        if pos > end:
            break
        if first:
            on_first(pos)
            first = False
        last = pos
        if acked and acked.contains(pos):
            if pos == end:
                break
            continue
        if md.HasField("num_chunks_from_msg") and md.num_chunks_from_msg > 1:
            raise NeedsClient(f"chunked message at {pos}: use the option reader=client")
        if len(md.encryption_keys):
            raise NeedsClient(f"encrypted message at {pos}: use the option reader=client")
        if md.compression:
            payload = memoryview(decompress(md, payload))
        lid, eid = pos
        pub = md.publish_time
        prefix = b"\x08" + _varint(lid) + b"\x10" + _varint(eid) + part_bytes
        if count:
            sfx = suffixes.get(count)
            if sfx is None:
                tail = b"\x30" + _varint(count)
                sfx = suffixes[count] = [b"\x20" + _varint(i) + tail for i in range(count)]
            off = 0
            for i in range(count):
                size = unpack(payload, off)[0]
                off += 4
                single = SMM()
                single.ParseFromString(payload[off : off + size])  # type: ignore[arg-type]  # upb takes any buffer
                off += size
                psize = single.payload_size
                if single.compacted_out:
                    off += psize
                    continue
                values.append(bytes(payload[off : off + psize]))
                off += psize
                keys.append(single.partition_key or None)
                okeys.append(single.ordering_key or None)
                ids.append(prefix + sfx[i])
                lids.append(lid)
                eids.append(eid)
                bidx.append(i)
                pubs.append(pub)
                evs.append(single.event_time or None)
                if single.properties:
                    for kv in single.properties:
                        pkeys.append(kv.key)
                        pvals.append(kv.value)
                poff.append(len(pkeys))
        else:
            values.append(bytes(payload))
            keys.append(md.partition_key or None)
            okeys.append(md.ordering_key or None)
            ids.append(prefix)
            lids.append(lid)
            eids.append(eid)
            bidx.append(-1)
            pubs.append(pub)
            evs.append(md.event_time or None)
            for kv in md.properties:
                pkeys.append(kv.key)
                pvals.append(kv.value)
            poff.append(len(pkeys))
        if len(values) >= rows_per_batch:
            yield b.build()
            values, keys, okeys, ids = b.values, b.keys, b.okeys, b.ids
            lids, eids, bidx, pubs, evs = b.lids, b.eids, b.batch, b.publish_ms, b.event_ms
            poff, pkeys, pvals = b.prop_offsets, b.prop_keys, b.prop_vals
        if pos == end:
            break
    if values:
        yield b.build()
