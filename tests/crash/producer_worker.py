"""A child process that produces as fast as it can and records every confirmed message.

Run as ``python -m tests.crash.producer_worker URL OUT SPEC_JSON``. Each confirmed message is
appended to OUT as one JSON line, written and flushed from the send callback, so that whatever the
producer was told before the broker was killed is on disk however the worker itself dies.

The payload of a message is a function of (producer name, sequence number, seed), so the auditor
can recompute and compare it without the worker writing it out.
"""

from __future__ import annotations

import json
import logging
import random
import sys
import threading
import zlib
from typing import Any

import pulsar


def payload_of(producer_name: str, seq: int, seed: int, max_size: int) -> bytes:
    """The deterministic payload of message ``seq`` of ``producer_name``."""
    rng = random.Random(f"{seed}:{producer_name}:{seq}")
    head = f"{producer_name}:{seq}:".encode()
    size = rng.choice((0, 10, 100, 1000, rng.randrange(max_size + 1)))
    return head + rng.randbytes(size)


def record(
    topic: str, producer_name: str, seq: int, mid: pulsar.MessageId, payload: bytes
) -> dict[str, Any]:
    """One line of the confirmation log."""
    return {
        "topic": topic,
        "producer": producer_name,
        "seq": seq,
        "id": [mid.ledger_id(), mid.entry_id(), mid.batch_index()],
        "len": len(payload),
        "crc": zlib.crc32(payload),
    }


class Recorder:
    """Appends confirmation lines to a file, one write and flush per line, from any thread."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
        self._lock = threading.Lock()

    def write(self, line: dict[str, Any]) -> None:
        """Append one line and push it to the OS."""
        text = json.dumps(line, separators=(",", ":")) + "\n"
        with self._lock:
            self._file.write(text)
            self._file.flush()


def produce(
    client: pulsar.Client,
    recorder: Recorder,
    topic: str,
    producer_name: str,
    batching: bool,
    seed: int,
    max_size: int,
    limit: int,
) -> None:
    """Send ``limit`` messages asynchronously, recording each confirmed one."""
    producer = client.create_producer(
        topic,
        producer_name=producer_name,
        batching_enabled=batching,
        batching_max_publish_delay_ms=2,
        batching_max_messages=50,
        max_pending_messages=500,
        block_if_queue_full=True,
        send_timeout_millis=0,
    )

    def callback(seq: int, payload: bytes) -> Any:
        def done(res: pulsar.Result, mid: pulsar.MessageId) -> None:
            if res == pulsar.Result.Ok:
                recorder.write(record(topic, producer_name, seq, mid, payload))

        return done

    for seq in range(limit):
        payload = payload_of(producer_name, seq, seed, max_size)
        try:
            producer.send_async(payload, callback(seq, payload))
        except Exception:  # the broker is gone; the parent kills us anyway
            return
    producer.flush()


def main(argv: list[str]) -> None:
    """Start one thread per producer of the spec and wait for them."""
    url, out, spec_text = argv
    spec = json.loads(spec_text)
    logger = logging.getLogger("pulsar-worker")
    logger.setLevel(logging.ERROR)
    client = pulsar.Client(url, logger=logger, operation_timeout_seconds=10)
    recorder = Recorder(out)
    threads = [
        threading.Thread(
            target=produce,
            args=(
                client,
                recorder,
                p["topic"],
                p["name"],
                p["batching"],
                spec["seed"],
                spec["max_size"],
                spec["limit"],
            ),
            daemon=True,
        )
        for p in spec["producers"]
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client.close()


if __name__ == "__main__":
    main(sys.argv[1:])
