"""Load under a crash, and the audit after it: confirmed messages against what a reader finds."""

from __future__ import annotations

import functools
import itertools
import json
import os
import random
import signal
import struct
import subprocess
import sys
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulsar

from tests.broker_process import BrokerProcess
from tests.crash.producer_worker import payload_of

MsgId = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class Confirmed:
    """One message the producer was told is stored."""

    topic: str
    producer: str
    seq: int
    id: MsgId
    length: int
    crc: int


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """What the worker produces: producers (topic, name, batching) and payload sizes."""

    producers: list[tuple[str, str, bool]]
    seed: int
    max_size: int = 4096
    limit: int = 1_000_000

    def to_json(self) -> str:
        """The worker's command-line form."""
        return json.dumps(
            {
                "producers": [{"topic": t, "name": n, "batching": b} for t, n, b in self.producers],
                "seed": self.seed,
                "max_size": self.max_size,
                "limit": self.limit,
            }
        )


def start_load(broker: BrokerProcess, out: Path, spec: LoadSpec) -> subprocess.Popen[bytes]:
    """Start the producing child process."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.crash.producer_worker",
            broker.service_url,
            str(out),
            spec.to_json(),
        ],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def count_lines(path: Path) -> int:
    """Complete lines in ``path`` so far (0 if it does not exist yet)."""
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def wait_for_confirmations(
    path: Path, n: int, worker: subprocess.Popen[bytes], timeout: float
) -> None:
    """Block until ``n`` confirmations are recorded."""
    deadline = time.monotonic() + timeout
    while count_lines(path) < n:
        assert worker.poll() is None, f"producer worker exited early with {worker.returncode}"
        assert time.monotonic() < deadline, f"fewer than {n} confirmations in {timeout}s"
        time.sleep(0.01)


def tear_tails(data_dir: Path, n: int, rng: random.Random) -> list[str]:
    """Leave what a crash in the middle of a write leaves, at the end of the ``n`` newest ledger
    files (the ones that were open): a short record, a record with a wrong CRC32C, zeros, or
    half a header; sometimes also a torn offset-index sidecar. Returns what was done, per file.

    Never a complete valid record: that would be a real (unconfirmed) message.
    """
    directory = data_dir / "ledgers"
    logs = sorted(directory.glob("*.log"), key=lambda p: int(p.stem))[-n:]
    done = []
    for path in logs:
        kind = rng.choice(["short", "bad-crc", "zeros", "half-header"])
        body = rng.randbytes(rng.randrange(1, 300))
        if kind == "short":
            tail = struct.pack("<II", len(body) + rng.randrange(1, 1000), 0) + body
        elif kind == "bad-crc":
            tail = struct.pack("<II", len(body), (zlib.crc32(body) ^ 0x5A5A5A5A) or 1) + body
        elif kind == "zeros":
            tail = bytes(rng.randrange(1, 4096))
        else:
            tail = rng.randbytes(rng.randrange(1, 8))
        with open(path, "ab") as f:
            f.write(tail)
        idx = path.with_suffix(".idx")
        if idx.exists() and rng.random() < 0.5:
            with open(idx, "ab") as f:
                f.write(struct.pack("<Q", path.stat().st_size - len(tail))[: rng.choice([3, 8])])
            kind += "+idx"
        done.append(f"{path.name}:{kind}")
    return done


def crash_under_load(
    broker: BrokerProcess,
    out: Path,
    spec: LoadSpec,
    rng: random.Random,
    *,
    max_delay: float = 1.0,
    tear: int = 0,
) -> int:
    """Run the load, SIGKILL the broker at a random moment, kill the worker, optionally tear the
    tails of the ``tear`` newest ledger files, restart the broker on the same ports and data.
    Returns the number of confirmations recorded."""
    worker = start_load(broker, out, spec)
    try:
        wait_for_confirmations(out, 1, worker, timeout=20)
        time.sleep(rng.uniform(0.0, max_delay))
        broker.kill()
    finally:
        # Killed right after the broker, so that it never resends to the restarted one.
        if worker.poll() is None:
            worker.send_signal(signal.SIGKILL)
        worker.wait(10)
    if tear:
        print("torn:", ", ".join(tear_tails(broker.data_dir, tear, rng)))
    port, web_port = broker.port, broker.web_port
    broker.start(same_ports=True)
    assert (broker.port, broker.web_port) == (port, web_port)
    return count_lines(out)


def load_confirmed(path: Path) -> list[Confirmed]:
    """Every complete line of a confirmation log."""
    out = []
    for line in path.read_bytes().split(b"\n"):
        if not line:
            continue
        try:
            d = json.loads(line)
        except ValueError:  # a torn last line of a killed worker
            continue
        ledger, entry, batch = d["id"]
        out.append(
            Confirmed(
                d["topic"], d["producer"], d["seq"], (ledger, entry, batch), d["len"], d["crc"]
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class Read:
    """One message as a reader sees it."""

    id: MsgId
    data: bytes


def read_topic(client: pulsar.Client, topic: str, timeout: float = 60.0) -> list[Read]:
    """Every message of ``topic`` from the earliest, in delivery order."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=5000)
    out: list[Read] = []
    deadline = time.monotonic() + timeout
    try:
        while reader.has_message_available():
            assert time.monotonic() < deadline, f"reading {topic} took over {timeout}s"
            msg = reader.read_next(timeout_millis=10_000)
            mid = msg.message_id()
            out.append(Read((mid.ledger_id(), mid.entry_id(), mid.batch_index()), msg.data()))
    finally:
        reader.close()
    return out


@functools.lru_cache(maxsize=1 << 17)
def expected_payload(producer_name: str, seq: int, seed: int, max_size: int) -> tuple[int, int]:
    """(length, CRC32) of the payload the worker sends as message ``seq`` of ``producer_name``
    (cached: the repeated-crash audit checks the same messages round after round)."""
    data = payload_of(producer_name, seq, seed, max_size)
    return len(data), zlib.crc32(data)


def parse_head(data: bytes) -> tuple[str, int]:
    """(producer name, seq) from a payload made by :func:`payload_of`."""
    name, seq, _ = data.split(b":", 2)
    return name.decode(), int(seq)


def audit(
    client: pulsar.Client,
    topics: list[str],
    confirmed: list[Confirmed],
    spec_seed: int,
    max_size: int,
) -> dict[str, list[Read]]:
    """Check every topic against the confirmations; returns what was read.

    - message ids strictly increase in read order (same order as stored, no duplicates);
    - every confirmed message is there under the id it was confirmed with, with its payload;
    - every message read is an intact message of a known producer (a torn tail never surfaces);
    - each producer's stored messages are a prefix 0..k-1 of what it sent: a crash loses only a
      suffix of unconfirmed messages, never one in the middle.
    """
    by_topic: dict[str, list[Confirmed]] = defaultdict(list)
    for c in confirmed:
        by_topic[c.topic].append(c)
    result = {}
    for topic in topics:
        got = read_topic(client, topic)
        ids = [r.id for r in got]
        bad_order = [(a, b) for a, b in itertools.pairwise(ids) if not a < b]
        assert not bad_order, f"{topic}: ids out of order or repeated: {bad_order[:5]}"
        index = {r.id: r.data for r in got}
        missing = [c for c in by_topic[topic] if c.id not in index]
        assert not missing, (
            f"{topic}: {len(missing)} of {len(by_topic[topic])} confirmed messages lost, "
            f"e.g. {missing[:3]}; read {len(got)}, last ids {ids[-3:]}"
        )
        for c in by_topic[topic]:
            data = index[c.id]
            assert parse_head(data) == (c.producer, c.seq), (topic, c, data[:40])
            assert (len(data), zlib.crc32(data)) == (c.length, c.crc), (topic, c)
        seqs: dict[str, list[int]] = defaultdict(list)
        for r in got:
            name, seq = parse_head(r.data)
            assert len(r.data) == expected_payload(name, seq, spec_seed, max_size)[0] and (
                zlib.crc32(r.data) == expected_payload(name, seq, spec_seed, max_size)[1]
            ), f"{topic}: corrupt message {r.id} ({name}, {seq})"
            seqs[name].append(seq)
        for name, s in seqs.items():
            assert s == list(range(len(s))), (
                f"{topic}/{name}: stored seqs are not a prefix: {s[:20]}"
            )
        result[topic] = got
    return result


def cursor_state(broker: BrokerProcess, topic: str, sub: str) -> dict[str, Any]:
    """markDeletePosition and individuallyDeletedMessages of a subscription's cursor."""
    status, stats = broker.admin("GET", "/admin/v2/" + topic.replace("://", "/") + "/internalStats")
    assert status == 200, stats
    c = stats["cursors"][sub]
    return {k: c[k] for k in ("markDeletePosition", "individuallyDeletedMessages")}
