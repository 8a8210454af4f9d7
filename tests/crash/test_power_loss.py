"""Power cuts: the broker's data directory on lazyfs (tests/fault), which keeps what was never
synced in a volatile layer and loses it, or lets a random part of it reach the disk, at a cut.
Its model is strict POSIX: file data is durable once the file is synced, and every directory
entry change (create, mkdir, rename, unlink, rmdir) only once its directory is synced.

Each round runs Key_Shared consumers that ack, producers with deduplication on (key-based
batches and single messages) and a compaction, then SIGKILLs the broker and cuts the power at the
same moment (all unsynced data and entries lost; every unsynced entry and write kept but the last
write of each file, torn; or a random subset of the unsynced pages and entries),
and starts the broker again on what reached the "disk". At the end: every message whose send was
confirmed is there with the id it was confirmed with, each key in publish order, no message
whose ack reached the disk before a cut is delivered again after it, and the broker started
every time. ``POWER_CUTS`` sets the number of cuts (20 in ``make test``), ``POWER_SEED``
replays the random choices (the cut's moment still depends on timing).
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pulsar
import pytest

from tests.broker_process import BrokerProcess, quiet_logger
from tests.crash.key_shared_load import PersistedAcks, read_persisted_acks
from tests.fault import Control, fuse_available, mounted
from tests.ordering import MsgPos

pytestmark = [pytest.mark.crash, pytest.mark.xdist_group("power")]

WHY_NOT = fuse_available()
CUTS = int(os.environ.get("POWER_CUTS", "20"))
KEYS = [f"k{i}" for i in range(6)]
MODES = ("all", "torn", "pages")
# Keep consumed ledgers: the audit reads the whole topic from the start.
KEEP = {"defaultRetentionTimeInMinutes": -1, "defaultRetentionSizeInMB": -1}


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[Control]:
    if WHY_NOT:
        pytest.skip(f"a FUSE mount cannot be made here: {WHY_NOT}")
    with mounted(tmp_path / "backing", tmp_path / "mnt") as m:
        yield m


@pytest.fixture
def power_seed() -> int:
    seed = int(os.environ.get("POWER_SEED", random.randrange(1 << 32)))
    print(f"POWER_SEED={seed}")
    return seed


@dataclass
class Ledgerbook:
    """What the clients were told: confirmed (topic, payload) -> message id."""

    confirmed: dict[tuple[str, bytes], tuple[int, int, int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def callback(self, topic: str, payload: bytes) -> object:
        def done(res: pulsar.Result, msg_id: pulsar.MessageId) -> None:
            if res == pulsar.Result.Ok:
                with self.lock:
                    ident = (msg_id.ledger_id(), msg_id.entry_id(), msg_id.batch_index())
                    self.confirmed[(topic, payload)] = ident

        return done


def run_round(
    broker: BrokerProcess,
    book: Ledgerbook,
    topic: str,
    rnd: int,
    rng: random.Random,
    persisted: PersistedAcks | None,
    redelivered: list[str],
) -> None:
    """Load the broker until the cut: produce (batched or not), consume and ack. A delivery of
    a message whose ack the last cut left on the disk (``persisted``) goes to ``redelivered``."""
    client = pulsar.Client(broker.service_url, logger=quiet_logger(), operation_timeout_seconds=5)
    stop = threading.Event()
    try:
        batched = rng.random() < 0.5
        producer = client.create_producer(
            topic,
            producer_name=f"p-{rnd}",
            batching_enabled=batched,
            batching_type=pulsar.BatchingType.KeyBased,
            batching_max_publish_delay_ms=2,
            send_timeout_millis=0,
        )
        consumer = client.subscribe(
            topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared, receiver_queue_size=200
        )

        def consume() -> None:
            while not stop.is_set():
                try:
                    msg = consumer.receive(100)
                except pulsar.Timeout:
                    continue
                except pulsar.PulsarException:
                    return
                pos = MsgPos.of(msg.message_id())
                if persisted is not None and persisted.is_acked(pos):
                    redelivered.append(f"round {rnd}: {pos} ({persisted.describe()})")
                if rng.random() < 0.9:
                    try:
                        consumer.acknowledge(msg)
                    except pulsar.PulsarException:  # closed by the cut
                        return

        reader = threading.Thread(target=consume, daemon=True)
        reader.start()
        deadline = time.monotonic() + rng.uniform(0.3, 1.5)
        i = 0
        while time.monotonic() < deadline:
            key = KEYS[i % len(KEYS)]
            payload = f"{rnd}:{key}:{i}".encode()
            producer.send_async(payload, book.callback(topic, payload), partition_key=key)
            i += 1
            if i % 50 == 0:
                time.sleep(0.005)
    finally:
        # The cut: the broker dies with sends, acks and syncs in flight.
        broker.kill()
        stop.set()
        # Closing may report the dead connection (NotConnected): the broker is gone, on purpose.
        with contextlib.suppress(pulsar.PulsarException):
            client.close()


def audit(broker: BrokerProcess, book: Ledgerbook, topic: str) -> int:
    """Read the topic from the start: every confirmed message, with its id, keys in order."""
    client = pulsar.Client(broker.service_url, logger=quiet_logger())
    try:
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        stored: dict[bytes, tuple[int, int, int]] = {}
        last_index: dict[tuple[str, str], int] = {}
        while reader.has_message_available():
            msg = reader.read_next(10_000)
            mid = msg.message_id()
            payload = msg.data()
            assert payload not in stored, f"{payload!r} stored twice"
            stored[payload] = (mid.ledger_id(), mid.entry_id(), mid.batch_index())
            rnd, key, idx = (part.decode() for part in payload.split(b":", 3)[:3])
            # Within one round (one producer) a key's messages are stored in publish order.
            prev = last_index.get((rnd, key), -1)
            assert int(idx) > prev, f"{payload!r} stored after index {prev} of its key"
            last_index[(rnd, key)] = int(idx)
        missing = [p for (t, p) in book.confirmed if t == topic and p not in stored]
        assert not missing, f"{len(missing)} confirmed messages lost, e.g. {missing[:5]}"
        wrong = [
            (p, ident, stored[p])
            for (t, p), ident in book.confirmed.items()
            if t == topic and stored[p] != ident
        ]
        assert not wrong, f"confirmed with one id, stored with another: {wrong[:5]}"
        return len(stored)
    finally:
        client.close()


def test_every_name_in_a_fresh_data_directory_is_synced_before_a_confirmation(
    mount: Control,
) -> None:
    """Under strict POSIX a file whose directory was never synced is gone after a cut, whatever
    was synced of its data: the data directory, ``ledgers/``, the metadata database and every
    new segment (one every 10 entries here) must have their names synced before a send is
    confirmed. Deterministic: nothing unsynced may survive ``cut all``."""
    topic = f"persistent://public/default/fresh-{uuid.uuid4().hex[:8]}"
    book = Ledgerbook()
    broker = BrokerProcess(
        data_dir=mount.mountpoint / "deep" / "data",
        conf={"managedLedgerMaxEntriesPerLedger": 10, **KEEP},
    )
    try:
        broker.start(timeout=60)
        client = pulsar.Client(broker.service_url, logger=quiet_logger())
        producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=0)
        for i in range(50):
            payload = f"fresh:k:{i}".encode()
            producer.send_async(payload, book.callback(topic, payload))
        producer.flush()
        client.close()
        assert len(book.confirmed) == 50
        broker.kill()
        mount.cut("all", 0)
        broker.start(timeout=60)
        assert audit(broker, book, topic) == 50
    finally:
        broker.close()


# A round is a broker start, up to 1.5 s of load and a cut: ~4 s, more on a loaded machine.
@pytest.mark.timeout(60 + 12 * CUTS)
def test_power_cuts_under_key_shared_load_lose_no_confirmed_message(
    mount: Control, power_seed: int
) -> None:
    rng = random.Random(power_seed)
    topic = f"persistent://public/default/power-{uuid.uuid4().hex[:8]}"
    book = Ledgerbook()
    broker = BrokerProcess(
        data_dir=mount.mountpoint / "data",
        conf={
            "brokerDeduplicationEnabled": "true",
            # Small ledgers: cuts land in ledger roll-overs (new files and their names) too.
            "managedLedgerMaxEntriesPerLedger": 300,
            **KEEP,
        },
    )
    modes: dict[str, int] = dict.fromkeys(MODES, 0)
    dropped: dict[str, int] = {}
    persisted: PersistedAcks | None = None
    redelivered: list[str] = []
    try:
        for rnd in range(CUTS):
            started = time.monotonic()
            broker.start(timeout=60)
            up = time.monotonic() - started
            if rnd % 5 == 4:
                # Compaction rewrites the topic's compacted ledger while the load runs.
                broker.admin("PUT", f"/admin/v2/persistent/{topic[13:]}/compaction")
            run_round(broker, book, topic, rnd, rng, persisted, redelivered)
            mode = rng.choice(MODES)
            modes[mode] += 1
            counts = mount.cut(mode, rng.randrange(1 << 32))
            for what, count in counts.items():
                dropped[what] = dropped.get(what, 0) + count
            # On a failure (a timeout on a loaded machine too) this says how far it got.
            print(f"round {rnd}: broker up in {up:.1f} s, cut {mode} {counts}")
            # What the restarted broker starts from: an ack stored here is never undone.
            persisted = read_persisted_acks(mount.mountpoint / "data", [topic], "ks")[topic]
        broker.start(timeout=60)
        stored = audit(broker, book, topic)
    finally:
        broker.close()
    print(f"{CUTS} cuts {modes}: {len(book.confirmed)} confirmed, {stored} stored and audited")
    print(f"at the cuts: {dropped}")
    print(f"persisted acks at the last cut: {persisted.describe() if persisted else None}")
    assert book.confirmed, "nothing was confirmed: the load did not run"
    # The cuts had something to lose: unsynced pages or directory entries were in flight.
    assert dropped.get("lost_pages", 0) + dropped.get("lost_entries", 0) > 0, dropped
    assert not redelivered, f"acked and persisted, then delivered again: {redelivered[:5]}"
    # The check above had acks to look at: the cursor's persisted state moved.
    assert persisted is not None and persisted.mark_delete.ledger_id > 0, persisted


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_fsync_eio_confirms_nothing_it_covered_and_a_restart_keeps_what_was_synced(
    mount: Control,
) -> None:
    topic = f"persistent://public/default/eio-{uuid.uuid4().hex[:8]}"
    book = Ledgerbook()
    broker = BrokerProcess(data_dir=mount.mountpoint / "data", conf=KEEP)
    try:
        broker.start(timeout=60)
        client = pulsar.Client(broker.service_url, logger=quiet_logger())
        producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=0)
        for i in range(20):
            payload = f"before:k:{i}".encode()
            producer.send_async(payload, book.callback(topic, payload))
        producer.flush()
        assert len(book.confirmed) == 20
        mount.fail_fsync("/data/ledgers/*.log")
        during = [f"during:k:{i}".encode() for i in range(20)]
        for payload in during:
            producer.send_async(payload, book.callback(topic, payload))
        time.sleep(3)
        with book.lock:
            confirmed_during = [p for (_, p) in book.confirmed if p.startswith(b"during")]
        # Nothing whose sync failed is confirmed: every ledger's fsync fails meanwhile.
        assert confirmed_during == []
        assert "sync failed" in broker.log()
        # Fail-stop per ledger, with a back-off: no ledger burnt per resend.
        status, internal = broker.admin("GET", f"/admin/v2/persistent/{topic[13:]}/internalStats")
        assert status == 200 and len(internal["ledgers"]) <= 6, internal["ledgers"]
        # The stored messages stay readable meanwhile, on the producer's own connection too.
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        assert reader.read_next(10_000).data() == b"before:k:0"
        mount.fail_fsync(None)
        client.close()
        broker.kill()
        mount.cut("all", 7)
        broker.start(timeout=60, same_ports=True)
        audit(broker, book, topic)
    finally:
        broker.close()


def test_slow_disk_keeps_the_broker_memory_bounded_and_loses_nothing(mount: Control) -> None:
    topic = f"persistent://public/default/slow-{uuid.uuid4().hex[:8]}"
    book = Ledgerbook()
    broker = BrokerProcess(
        data_dir=mount.mountpoint / "data", conf={"maxMessagePublishBufferSizeInMB": 2, **KEEP}
    )
    try:
        broker.start(timeout=60)
        assert broker.proc is not None
        pid = broker.proc.pid
        start_rss = rss_kb(pid)
        mount.latency(200)
        client = pulsar.Client(broker.service_url, logger=quiet_logger())
        producers = [
            client.create_producer(
                topic,
                batching_enabled=False,
                send_timeout_millis=0,
                block_if_queue_full=True,
                max_pending_messages=1000,
            )
            for _ in range(4)
        ]
        chunk = os.urandom(60_000)
        peak = start_rss
        deadline = time.monotonic() + 6
        i = 0
        while time.monotonic() < deadline:
            for n, producer in enumerate(producers):
                payload = b"%d:k%d:%d:" % (n, n, i) + chunk
                producer.send_async(payload, book.callback(topic, payload), partition_key=f"k{n}")
            i += 1
            if i % 20 == 0:
                peak = max(peak, rss_kb(pid))
        sent = 4 * i
        peak = max(peak, rss_kb(pid))
        print(f"slow disk: {sent} sends of 60 kB, broker RSS {start_rss} -> peak {peak} kB")
        mount.latency(0)
        for producer in producers:
            producer.flush()
        client.close()
        # Up to 4 x 1,000 sends of 60 kB (240 MB) in flight at the clients, into a disk taking
        # 200 ms a sync: the broker stopped reading them instead of buffering them (2 MB of
        # publishes in flight, plus its caches and socket buffers). Without the limit the
        # broker's RSS grew by 280 MB in this test.
        assert sent > 400
        assert peak - start_rss < 150_000, f"RSS grew {peak - start_rss} kB"
        assert len(book.confirmed) == sent
        audit(broker, book, topic)
    finally:
        broker.close()
