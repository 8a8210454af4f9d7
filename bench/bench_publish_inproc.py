"""The publish path in one process, without a client: CPU per SEND on the event loop.

A real ``BrokerService`` over real storage (a temporary data directory, the journal thread,
``fdatasync`` on by default) and a real ``ServerConnection`` whose transport only counts what
is written to it. SEND frames shaped as the official client sends them (a checksum; metadata
with producer name, sequence id, publish time, partition key, uncompressed size; for batches
``num_messages_in_batch`` and a batch body) are encoded up front and fed to
``data_received`` in 64 KB chunks, ``--window`` sends ahead of the receipts, as a client with
that many pending sends would. Reports CPU µs per message (or per batched entry) of the loop
thread (``time.thread_time``) and of the whole process, which include the journal thread.

Not the end-to-end figure (``bench_publish_cpu.py`` is): no socket reads, no client. A quick,
steady measure of the Python work per send while changing it, and what ``valgrind --tool=
callgrind`` can count instructions of:

    PYTHONPATH=src .venv/bin/python bench/bench_publish_inproc.py [--batch 0] [--messages 50000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from keyshared.config import load_config
from keyshared.protocol import client_commands, pb
from keyshared.protocol.metadata import encode_batch
from keyshared.server.connection import ServerConnection
from keyshared.server.listener import BrokerServer
from keyshared.standalone import _settle_gc


class CountingTransport:
    """Enough of ``asyncio.Transport`` for a ServerConnection; counts bytes written."""

    def __init__(self) -> None:
        self.written = 0
        self.writes = 0
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def write(self, data: bytes) -> None:
        self.writes += 1
        self.written += len(data)

    def writelines(self, chunks: list[bytes]) -> None:
        self.writes += 1
        self.written += sum(map(len, chunks))

    def is_reading(self) -> bool:
        return True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def send_frames(count: int, size: int, batch: int) -> list[bytes]:
    """``count`` SEND frames of one producer (batches of ``batch`` messages when > 0)."""
    frames = []
    body = b"x" * size
    seq = 0
    now = int(time.time() * 1000)
    for i in range(count):
        md = pb.MessageMetadata(producer_name="standalone-0-1", sequence_id=seq, publish_time=now)
        if batch:
            singles = []
            for j in range(batch):
                single = pb.SingleMessageMetadata(
                    partition_key=f"key-{(seq + j) % 10000}", sequence_id=seq + j
                )
                singles.append((single, body))
            payload = encode_batch(singles)
            md.num_messages_in_batch = batch
            md.uncompressed_size = len(payload)
            n = batch
        else:
            md.partition_key = f"key-{i % 10000}"
            md.uncompressed_size = size
            payload = body
            n = 1
        frames.append(
            client_commands.send(producer_id=1, sequence_id=seq, metadata=md, payload=payload)
        )
        seq += n
    return frames


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build the broker, feed the frames, wait for every receipt; the CPU figures."""
    from keyshared.broker.service import BrokerService
    from keyshared.storage.store import Storage, StorageConfig

    with tempfile.TemporaryDirectory(prefix="inproc-") as tmp:
        cfg = load_config(None, overrides={"dataDir": tmp})
        storage = Storage(Path(tmp), StorageConfig(journal_sync_data=not args.no_sync))
        storage.open()
        service = BrokerService(cfg, storage, default_namespace=False)
        service.create_default_namespace()
        server = BrokerServer(service)
        conn = ServerConnection(server)
        transport = CountingTransport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        conn.data_received(client_commands.connect())
        conn.data_received(
            client_commands.producer(
                topic="persistent://public/default/inproc", producer_id=1, request_id=1
            )
        )
        for _ in range(50):
            await asyncio.sleep(0.01)
            if conn.producers.get(1) is not None:
                break
        frames = send_frames(args.messages, args.size, args.batch)
        stream = b"".join(frames)
        # Fed as views: the harness must not add a copy of its own to what is measured.
        view = memoryview(stream)
        # Where each frame ends in the stream, to feed whole chunks ``window`` sends ahead.
        ends = []
        pos = 0
        for frame in frames:
            pos += len(frame)
            ends.append(pos)
        # Receipts counted by wrapping the connection's method (a call and an add per send);
        # the feeder sleeps on an event until the window has room, as a client would.
        receipts = [0]
        wanted = [0]
        room = asyncio.Event()
        send_receipt = conn.send_receipt

        def counted(*a: Any) -> None:
            receipts[0] += 1
            send_receipt(*a)
            if receipts[0] >= wanted[0]:
                room.set()

        conn.send_receipt = counted  # type: ignore[method-assign]
        receipts_before = transport.writes
        total = len(frames)
        step = max(1, args.window // 2)
        # The collector as the standalone broker tunes it once started.
        _settle_gc()
        loop_cpu = time.thread_time()
        ru = resource.getrusage(resource.RUSAGE_THREAD)
        proc_cpu = time.process_time()
        began = time.perf_counter()
        fed = 0
        sent = 0
        while receipts[0] < total:
            limit = min(total, receipts[0] + args.window)
            if sent < limit:
                end = ends[limit - 1]
                while fed < end:
                    chunk = view[fed : min(end, fed + 65536)]
                    conn.data_received(chunk)
                    fed += len(chunk)
                sent = limit
            # Wake when half the window is confirmed (or everything is).
            wanted[0] = min(total, receipts[0] + step)
            room.clear()
            if receipts[0] < wanted[0]:
                await room.wait()
        elapsed = time.perf_counter() - began
        loop_cpu = time.thread_time() - loop_cpu
        ru2 = resource.getrusage(resource.RUSAGE_THREAD)
        loop_sys = ru2.ru_stime - ru.ru_stime
        faults = ru2.ru_minflt - ru.ru_minflt
        proc_cpu = time.process_time() - proc_cpu
        entries = total
        messages = total * (args.batch or 1)
        result = {
            "messages": messages,
            "entries": entries,
            "sync": not args.no_sync,
            "elapsed_s": round(elapsed, 3),
            "loop_cpu_us_per_entry": round(loop_cpu / entries * 1e6, 2),
            "process_cpu_us_per_entry": round(proc_cpu / entries * 1e6, 2),
            "loop_sys_us_per_entry": round(loop_sys / entries * 1e6, 2),
            "loop_page_faults_per_entry": round(faults / entries, 2),
            "loop_cpu_us_per_message": round(loop_cpu / messages * 1e6, 3),
            "transport_writes": transport.writes - receipts_before,
        }
        conn.connection_lost(None)
        await service.close()
        await storage.close()
        return result


def main() -> None:
    """Parse options, run, print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000, help="SEND frames")
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=0, help="messages per batch (0: none)")
    parser.add_argument("--window", type=int, default=1000, help="sends in flight")
    parser.add_argument("--no-sync", action="store_true")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args)), indent=2))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
