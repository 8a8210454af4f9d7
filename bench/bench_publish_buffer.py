"""Broker memory under a slow disk, with and without ``maxMessagePublishBufferSizeInMB``.

The slow disk is real: an ext4 file system on a loop device written at ``--write-mbps`` MB/s at
most (a cgroup-v1 ``blkio.throttle.write_bps_device`` limit on the root cgroup). ``--producers`` clients (one connection each) publish
``--message-kb`` KB messages asynchronously, each with up to 1000 in flight (the client's
default ``maxPendingMessages``), for ``--seconds``; the broker's RSS is sampled every 100 ms.
Each configuration runs on a fresh broker and data directory.

Needs root (losetup, mount, cgroups). Everything is undone afterwards.

    .venv/bin/python bench/bench_publish_buffer.py [--write-mbps 4] [--producers 8]
        [--message-kb 64] [--seconds 20] [--limits 0,64,8]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pulsar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.broker_process import BrokerProcess, quiet_logger  # noqa: E402

# The root blkio cgroup: its limit binds every writer to the device, the kernel's writeback
# threads included (a child cgroup's limit binds only the writes its processes issue, and the
# flusher would write most of the dirty data unthrottled). The loop device is the bench's own.
THROTTLE = Path("/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device")


@contextlib.contextmanager
def slow_disk(size_mb: int, write_mbps: float) -> Iterator[tuple[Path, Callable[[], None]]]:
    """An ext4 mount on a loop device, its writes throttled to ``write_mbps``."""
    tmp = Path(tempfile.mkdtemp(prefix="keyshared-slowdisk-"))
    image, mnt = tmp / "disk.img", tmp / "mnt"
    mnt.mkdir()
    subprocess.run(["truncate", "-s", f"{size_mb}M", str(image)], check=True)
    loop = subprocess.run(
        ["losetup", "-f", "--show", str(image)], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        subprocess.run(["mkfs.ext4", "-q", loop], check=True)
        subprocess.run(["mount", loop, str(mnt)], check=True)
        try:
            dev = subprocess.run(
                ["lsblk", "-no", "MAJ:MIN", loop], check=True, capture_output=True, text=True
            ).stdout.strip()
            THROTTLE.write_text(f"{dev} {int(write_mbps * 1024 * 1024)}")

            def unthrottle() -> None:
                # Before stopping anything: hundreds of MB left dirty would take minutes to
                # write at the throttled rate, and a process cannot exit meanwhile.
                THROTTLE.write_text(f"{dev} 0")

            try:
                yield mnt, unthrottle
            finally:
                unthrottle()
        finally:
            subprocess.run(["umount", str(mnt)], check=False)
    finally:
        subprocess.run(["losetup", "-d", loop], check=False)
        image.unlink(missing_ok=True)
        mnt.rmdir()
        tmp.rmdir()


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def metric(broker: BrokerProcess, name: str) -> float:
    import re
    import urllib.request

    with urllib.request.urlopen(broker.web_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    m = re.search(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else float("nan")


def run(limit_mb: int, args: argparse.Namespace) -> dict[str, Any]:
    with slow_disk(args.disk_mb, args.write_mbps) as (mnt, unthrottle):
        broker = BrokerProcess(
            data_dir=mnt / "data", conf={"maxMessagePublishBufferSizeInMB": limit_mb}
        )
        try:
            broker.start()
            assert broker.proc is not None
            pid = broker.proc.pid
            idle_rss = rss_bytes(pid)
            stop = threading.Event()
            confirmed = [0] * args.producers
            payload = os.urandom(args.message_kb * 1024)

            def publish(i: int) -> None:
                client = pulsar.Client(broker.service_url, logger=quiet_logger())
                try:
                    producer = client.create_producer(
                        f"persistent://public/default/slow-{i}",
                        batching_enabled=False,
                        block_if_queue_full=False,
                        send_timeout_millis=0,
                    )

                    def done(res: Any, _: Any) -> None:
                        if res == pulsar.Result.Ok:
                            confirmed[i] += 1

                    # Up to maxPendingMessages (1000) in flight; a full queue fails the send at
                    # once (ProducerQueueIsFull), so this thread can always stop.
                    while not stop.is_set():
                        producer.send_async(payload, done)
                        time.sleep(0.0002)
                finally:
                    client.close()

            threads = [
                threading.Thread(target=publish, args=(i,), daemon=True)
                for i in range(args.producers)
            ]
            for t in threads:
                t.start()
            peak = 0
            end = time.monotonic() + args.seconds
            while time.monotonic() < end:
                peak = max(peak, rss_bytes(pid))
                time.sleep(0.1)
            buffer_peak = metric(broker, "pulsar_broker_publish_buffer_max_usage")
            pauses = metric(broker, "keyshared_publish_buffer_pauses_total")
            stored = sum(confirmed)
            unthrottle()
            stop.set()
            for t in threads:
                t.join(30)
        finally:
            broker.close()
    return {
        "maxMessagePublishBufferSizeInMB": limit_mb,
        "idle_rss_mb": round(idle_rss / 2**20, 1),
        "peak_rss_mb": round(peak / 2**20, 1),
        "publish_buffer_peak_mb": round(buffer_peak / 2**20, 1),
        "buffer_pauses": pauses,
        "confirmed_msgs": stored,
        "confirmed_mb_per_s": round(stored * args.message_kb / 1024 / args.seconds, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write-mbps", type=float, default=4.0)
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--message-kb", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--disk-mb", type=int, default=1024)
    parser.add_argument("--limits", default="0,64,8", help="limits in MB to compare (0 = off)")
    parser.add_argument("--out", default=str(ROOT / "bench/results/publish-buffer.json"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root: losetup, mount and a blkio cgroup")
    results = []
    for limit in (int(x) for x in args.limits.split(",")):
        r = run(limit, args)
        print(json.dumps(r), flush=True)
        results.append(r)
    Path(args.out).write_text(json.dumps({"args": vars(args), "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
