"""Load test: many idle connections, many slow topics, a few fast clients, and two misbehaving
clients; does the broker stay up, bounded and fair, and lose nothing it confirmed?

One run is, on a fresh broker:

- ``--connections`` idle connections (raw asyncio sockets: CONNECT, then only PONGs);
- ``--topics`` topics, each with one producer and one Shared consumer publishing one message
  every ``--slow-interval`` seconds, multiplexed ``--topics-per-connection`` to a connection
  (raw protocol, acked as received);
- ``--fast`` producers with the official client, ``--fast-rate`` messages per second each, each
  with its consumer: their throughput and end-to-end p99 latency are what is compared;
- with ``--misbehave`` (the second run of the default pair): a consumer that never acks
  (``maxUnackedMessagesPerConsumer`` must block it) and a producer that floods a topic as fast
  as it can (the publish buffer and pending-send limits, and rate limits or backlog quotas when
  switched on with ``--conf``/``--flood-policy``, must hold it back).

The raw clients run in one subprocess, the misbehaving ones in another, the fast ones here. The
broker's RSS is sampled from /proc throughout, and after the idle connections and after the
topics are set up, which gives the RSS per connection and per topic. Afterwards every message a
producer had confirmed is checked: received by its consumer (fast and slow topics) or in the
subscription's backlog (the never-acking consumer's and the flood's audit subscription).

``--minutes N`` is the soak mode: one run with the misbehaving clients for N minutes, sampling
RSS, open fds and asyncio tasks every ``--sample-seconds``, reporting their growth after the
first quarter (warm-up). Results go to bench/results/load*.json.

    nice -n 10 .venv/bin/python bench/bench_load.py --connections 1000 --topics 1000
    nice -n 10 .venv/bin/python bench/bench_load.py --minutes 30 --connections 1000 --topics 1000
    ... --conf maxUnackedMessagesPerConsumer=5000 --conf backlogQuotaDefaultLimitBytes=...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import resource
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from keyshared.protocol import FrameDecoder, commands, pb  # noqa: E402
from tests.broker_process import BrokerProcess, quiet_logger  # noqa: E402

T = pb.BaseCommand
NS = "persistent://public/default"


def raise_fd_limit() -> int:
    """The fd limit raised for this process and the broker it starts: to 65536 where allowed
    (raising the hard limit takes CAP_SYS_RESOURCE, which root in a container may not have:
    here it does not), else the soft limit up to the hard one; returns it."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(hard, 65536)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
        return want
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of ``values`` (0 when empty)."""
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


# --- the raw-protocol background load (a subprocess) ------------------------------------------


class RawConn(asyncio.Protocol):
    """One raw connection: CONNECT, answer PINGs, and serve its topics' producers and
    consumers (none for an idle connection)."""

    def __init__(self, load: RawLoad) -> None:
        self.load = load
        self.decoder = FrameDecoder(1 << 24)
        self.transport: asyncio.Transport | None = None
        self.connected = asyncio.get_running_loop().create_future()
        self.waiting: dict[int, asyncio.Future[pb.BaseCommand]] = {}
        self.request_id = 0
        # producer id -> topic index; consumer id -> topic index
        self.consumers: dict[int, int] = {}
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.write(commands.connect())  # type: ignore[union-attr]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.load.lost += 1
        if not self.connected.done():
            self.connected.set_exception(ConnectionError("closed before CONNECTED"))

    def request(self, make: Any) -> asyncio.Future[pb.BaseCommand]:
        self.request_id += 1
        fut: asyncio.Future[pb.BaseCommand] = asyncio.get_running_loop().create_future()
        self.waiting[self.request_id] = fut
        assert self.transport is not None
        self.transport.write(make(self.request_id))
        return fut

    def data_received(self, data: bytes) -> None:
        self.decoder.feed(data)
        load = self.load
        while (frame := self.decoder.next_frame()) is not None:
            cmd = frame.command
            t = cmd.type
            if t == T.PING:
                self.transport.write(commands.pong())  # type: ignore[union-attr]
                load.pings += 1
            elif t == T.CONNECTED:
                self.connected.set_result(None)
            elif t == T.SEND_RECEIPT:
                r = cmd.send_receipt
                load.confirmed(r.producer_id, r.sequence_id, r.message_id)
            elif t == T.MESSAGE:
                m = cmd.message
                load.received(self.consumers[m.consumer_id], m.message_id, frame.payload or b"")
                self.transport.write(  # type: ignore[union-attr]
                    commands.ack(consumer_id=m.consumer_id, message_ids=[m.message_id])
                )
            elif t in (T.SUCCESS, T.PRODUCER_SUCCESS, T.ERROR):
                rid = (
                    cmd.success.request_id
                    if t == T.SUCCESS
                    else cmd.producer_success.request_id
                    if t == T.PRODUCER_SUCCESS
                    else cmd.error.request_id
                )
                fut = self.waiting.pop(rid, None)
                if fut is not None and not fut.done():
                    fut.set_result(cmd)
            elif t == T.SEND_ERROR:
                load.send_errors += 1


class RawLoad:
    """The idle connections and the slow topics, with what was confirmed and received."""

    def __init__(self, args: argparse.Namespace, port: int) -> None:
        self.args = args
        self.port = port
        self.lost = 0
        self.pings = 0
        self.send_errors = 0
        self.idle: list[RawConn] = []
        self.topic_conns: list[RawConn] = []
        # per topic: confirmed (ledger, entry) ids, received ids, latencies
        n = args.topics
        self.conf_ids: list[set[tuple[int, int]]] = [set() for _ in range(n)]
        self.recv_ids: list[set[tuple[int, int]]] = [set() for _ in range(n)]
        self.latencies: list[float] = []
        self.sent = 0
        self.seq = [0] * n
        self.producer_topic: dict[tuple[int, int], int] = {}

    def confirmed(self, producer_id: int, seq: int, mid: pb.MessageIdData) -> None:
        self.conf_ids[producer_id].add((mid.ledgerId, mid.entryId))

    def received(self, topic: int, mid: pb.MessageIdData, payload: bytes) -> None:
        self.recv_ids[topic].add((mid.ledgerId, mid.entryId))
        if len(payload) >= 8:
            self.latencies.append(time.time() - struct.unpack(">d", payload[-8:])[0])

    async def open(self, host: str) -> RawConn:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(lambda: RawConn(self), host, self.port)
        await asyncio.wait_for(conn.connected, 60)
        return conn

    async def open_idle(self) -> None:
        sem = asyncio.Semaphore(200)
        # Several loopback source addresses keep clear of the ephemeral port range.

        async def one(i: int) -> None:
            async with sem:
                self.idle.append(await self.open("127.0.0.1"))

        await asyncio.gather(*(one(i) for i in range(self.args.connections)))

    async def open_topics(self) -> None:
        per = self.args.topics_per_connection
        sem = asyncio.Semaphore(64)

        async def topic(conn: RawConn, i: int) -> None:
            async with sem:
                name = f"{NS}/slow-{i}"
                ok = await conn.request(
                    lambda rid: commands.subscribe(
                        topic=name,
                        subscription="slow",
                        sub_type=pb.CommandSubscribe.Shared,
                        consumer_id=i,
                        request_id=rid,
                        initial_position=pb.CommandSubscribe.Earliest,
                    )
                )
                assert ok.type == T.SUCCESS, ok
                conn.consumers[i] = i
                conn.transport.write(commands.flow(consumer_id=i, permits=1000))  # type: ignore[union-attr]
                ok = await conn.request(
                    lambda rid: commands.producer(
                        topic=name, producer_id=i, request_id=rid, producer_name=f"slow-{i}"
                    )
                )
                assert ok.type == T.PRODUCER_SUCCESS, ok

        jobs = []
        for c in range(0, self.args.topics, per):
            conn = await self.open("127.0.0.1")
            self.topic_conns.append(conn)
            jobs += [topic(conn, i) for i in range(c, min(c + per, self.args.topics))]
        await asyncio.gather(*jobs)

    async def publish_slowly(self, stop: asyncio.Event) -> None:
        """Each topic once every ``--slow-interval`` s, spread evenly over the interval."""
        n = self.args.topics
        per = self.args.topics_per_connection
        step = self.args.slow_interval / max(n, 1)
        i = 0
        start = time.monotonic()
        k = 0
        while not stop.is_set():
            conn = self.topic_conns[i // per]
            self.seq[i] += 1
            payload = b"s" * 92 + struct.pack(">d", time.time())
            conn.transport.write(  # type: ignore[union-attr]
                commands.send(
                    producer_id=i,
                    sequence_id=self.seq[i],
                    metadata=pb.MessageMetadata(
                        producer_name=f"slow-{i}",
                        sequence_id=self.seq[i],
                        publish_time=int(time.time() * 1000),
                    ),
                    payload=payload,
                )
            )
            self.sent += 1
            i = (i + 1) % n
            k += 1
            delay = start + k * step - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            elif k % 100 == 0:
                await asyncio.sleep(0)

    def audit(self) -> dict[str, Any]:
        confirmed = sum(len(s) for s in self.conf_ids)
        missing = sum(len(c - r) for c, r in zip(self.conf_ids, self.recv_ids, strict=True))
        return {
            "sent": self.sent,
            "confirmed": confirmed,
            "received": sum(len(s) for s in self.recv_ids),
            "confirmed_not_received": missing,
            "send_errors": self.send_errors,
            "connections_lost": self.lost,
            "pings_answered": self.pings,
            "latency_p50_ms": round(percentile(self.latencies, 0.5) * 1000, 2),
            "latency_p99_ms": round(percentile(self.latencies, 0.99) * 1000, 2),
        }


async def run_raw_load(args: argparse.Namespace) -> None:
    """The background-load subprocess: reports phases on stdout, stops at 'stop' on stdin."""
    raise_fd_limit()
    load = RawLoad(args, args.port)
    t0 = time.monotonic()
    await load.open_idle()
    print(json.dumps({"phase": "idle", "seconds": round(time.monotonic() - t0, 1)}), flush=True)
    await asyncio.sleep(2)
    t0 = time.monotonic()
    if args.topics:
        await load.open_topics()
    print(json.dumps({"phase": "topics", "seconds": round(time.monotonic() - t0, 1)}), flush=True)
    stop = asyncio.Event()
    pub = asyncio.create_task(load.publish_slowly(stop)) if args.topics else None
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.readline)
    stop.set()
    if pub is not None:
        await pub
    # Drain: wait until every confirmed message has been received (or 30 s).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if (
            all(c <= r for c, r in zip(load.conf_ids, load.recv_ids, strict=True))
            and sum(len(c) for c in load.conf_ids) >= load.sent - load.send_errors
        ):
            break
        await asyncio.sleep(0.2)
    print(json.dumps({"phase": "done", "audit": load.audit()}), flush=True)
    for c in load.idle + load.topic_conns:
        if c.transport is not None:
            c.transport.close()


# --- the misbehaving clients (a subprocess) ---------------------------------------------------


def run_misbehave(args: argparse.Namespace) -> None:
    """A consumer that never acks and a producer that floods; counts on SIGTERM."""
    import pulsar

    url = f"pulsar://127.0.0.1:{args.port}"
    client = pulsar.Client(url, logger=quiet_logger(), operation_timeout_seconds=30)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    counts = {"flood_sent": 0, "flood_confirmed": 0, "flood_failed": 0}
    counts |= {"noack_confirmed": 0, "noack_received": 0}
    lock = threading.Lock()

    # The audit subscriptions exist before anything is published.
    client.subscribe(f"{NS}/flood", "audit").close()
    noack = client.subscribe(
        f"{NS}/noack", "noack", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=1000
    )

    def cb(key: str) -> Any:
        def done(res: Any, _mid: Any) -> None:
            with lock:
                if res == pulsar.Result.Ok:
                    counts[key + "_confirmed"] += 1
                elif key == "flood":
                    counts["flood_failed"] += 1

        return done

    def flood() -> None:
        p = client.create_producer(
            f"{NS}/flood",
            batching_enabled=False,
            block_if_queue_full=True,
            max_pending_messages=5000,
            send_timeout_millis=0,
        )
        body = b"f" * args.flood_size
        on_done = cb("flood")
        step = 1 / args.flood_rate if args.flood_rate > 0 else 0.0
        start, k = time.monotonic(), 0
        while not stop.is_set():
            p.send_async(body, on_done)
            counts["flood_sent"] += 1
            k += 1
            if step and (delay := start + k * step - time.monotonic()) > 0:
                time.sleep(delay)
        p.flush()

    def noack_producer() -> None:
        p = client.create_producer(f"{NS}/noack", batching_enabled=False, send_timeout_millis=0)
        on_done = cb("noack")
        while not stop.is_set():
            p.send_async(b"n" * 100, on_done)
            time.sleep(1 / args.noack_rate)
        p.flush()

    def noack_consumer() -> None:
        while not stop.is_set():
            with contextlib.suppress(pulsar.Timeout):
                noack.receive(timeout_millis=200)
                counts["noack_received"] += 1

    threads = [threading.Thread(target=f) for f in (flood, noack_producer, noack_consumer)]
    for t in threads:
        t.start()
    while not stop.is_set():
        time.sleep(0.1)
    for t in threads:
        t.join(60)
    print(json.dumps(counts), flush=True)
    client.close()


# --- the fast, well-behaved clients (this process) --------------------------------------------


class FastClients:
    """``--fast`` producers at ``--fast-rate`` msg/s with a consumer each (official client)."""

    def __init__(self, args: argparse.Namespace, url: str, tag: str) -> None:
        import pulsar

        self.pulsar = pulsar
        self.args = args
        self.client = pulsar.Client(url, logger=quiet_logger(), operation_timeout_seconds=30)
        self.topics = [f"{NS}/fast-{tag}-{i}" for i in range(args.fast)]
        self.consumers = [
            self.client.subscribe(t, "fast", consumer_type=pulsar.ConsumerType.Shared)
            for t in self.topics
        ]
        self.producers = [
            self.client.create_producer(t, batching_enabled=False, send_timeout_millis=0)
            for t in self.topics
        ]
        self.lock = threading.Lock()
        self.confirmed: list[set[str]] = [set() for _ in self.topics]
        self.received: list[set[str]] = [set() for _ in self.topics]
        self.latencies: list[float] = []
        self.measuring = False
        self.measured = 0
        self.stop = threading.Event()
        # Set once every producer has stopped and its sends are answered: only then may a
        # consumer that has everything confirmed so far call itself drained.
        self.producers_done = threading.Event()
        self.failed = 0

    def _produce(self, i: int) -> None:
        p = self.producers[i]
        pad = b"x" * max(0, self.args.fast_size - 8)
        step = 1 / self.args.fast_rate
        start = time.monotonic()
        k = 0
        conf = self.confirmed[i]

        def done(res: Any, mid: Any) -> None:
            with self.lock:
                if res == self.pulsar.Result.Ok:
                    conf.add(str(mid))
                else:
                    self.failed += 1

        while not self.stop.is_set():
            p.send_async(pad + struct.pack(">d", time.time()), done)
            k += 1
            delay = start + k * step - time.monotonic()
            if delay > 0:
                time.sleep(delay)

    def _consume(self, i: int) -> None:
        c = self.consumers[i]
        got = self.received[i]
        while not (self.producers_done.is_set() and self._drained(i)):
            try:
                msg = c.receive(timeout_millis=200)
            except self.pulsar.Timeout:
                if self.producers_done.is_set() and time.monotonic() > self.drain_deadline:
                    return
                continue
            now = time.time()
            c.acknowledge(msg)
            with self.lock:
                got.add(str(msg.message_id()))
                if self.measuring:
                    self.measured += 1
                    self.latencies.append(now - struct.unpack(">d", msg.data()[-8:])[0])

    def _drained(self, i: int) -> bool:
        with self.lock:
            return self.confirmed[i] <= self.received[i]

    drain_deadline = float("inf")

    def run(self, warmup: float, seconds: float) -> dict[str, Any]:
        threads = [
            threading.Thread(target=self._produce, args=(i,)) for i in range(len(self.topics))
        ]
        threads += [
            threading.Thread(target=self._consume, args=(i,)) for i in range(len(self.topics))
        ]
        for t in threads:
            t.start()
        time.sleep(warmup)
        with self.lock:
            self.measuring = True
        t0 = time.monotonic()
        time.sleep(seconds)
        with self.lock:
            self.measuring = False
            elapsed = time.monotonic() - t0
            measured, lat = self.measured, list(self.latencies)
        self.drain_deadline = time.monotonic() + 30
        self.stop.set()
        n = len(self.topics)
        for t in threads[:n]:
            t.join(60)
        for p in self.producers:
            p.flush()
        self.producers_done.set()
        for t in threads[n:]:
            t.join(60)
        confirmed = sum(len(s) for s in self.confirmed)
        missing = sum(len(c - r) for c, r in zip(self.confirmed, self.received, strict=True))
        self.client.close()
        return {
            "throughput_msg_s": round(measured / elapsed, 1),
            "target_msg_s": self.args.fast * self.args.fast_rate,
            "latency_p50_ms": round(percentile(lat, 0.5) * 1000, 2),
            "latency_p99_ms": round(percentile(lat, 0.99) * 1000, 2),
            "latency_max_ms": round(max(lat, default=0) * 1000, 2),
            "confirmed": confirmed,
            "confirmed_not_received": missing,
            "send_failed": self.failed,
        }


# --- the broker, sampled ----------------------------------------------------------------------


def proc_rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def proc_fds(pid: int) -> int:
    """Open file descriptors of ``pid``."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def metrics(broker: BrokerProcess, *names: str) -> dict[str, float]:
    """Broker-level samples of /metrics by name."""
    try:
        with urllib.request.urlopen(broker.web_url + "/metrics", timeout=120) as resp:
            text = resp.read().decode()
    except OSError as exc:  # an overloaded broker: say so instead of losing the run
        return {"metrics_error": str(exc)}  # type: ignore[dict-item]
    out: dict[str, float] = {}
    for name in names:
        m = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE)
        if m:
            out[name] = float(m.group(1))
    return out


class Sampler:
    """The broker's RSS and fds every ``interval`` seconds (tasks every ``tasks_every``)."""

    def __init__(self, broker: BrokerProcess, interval: float, tasks_every: float) -> None:
        assert broker.proc is not None
        self.broker = broker
        self.pid = broker.proc.pid
        self.interval = interval
        self.tasks_every = tasks_every
        self.samples: list[dict[str, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.t0 = time.monotonic()
        self.thread.start()

    def _run(self) -> None:
        last_tasks = -1e9
        while not self.stop.wait(self.interval):
            try:
                s = {
                    "t": round(time.monotonic() - self.t0, 1),
                    "rss_mb": round(proc_rss_mb(self.pid), 1),
                    "fds": proc_fds(self.pid),
                }
                if self.tasks_every > 0 and time.monotonic() - last_tasks >= self.tasks_every:
                    last_tasks = time.monotonic()
                    m = metrics(self.broker, "keyshared_asyncio_tasks")
                    s["tasks"] = m.get("keyshared_asyncio_tasks", -1)
                self.samples.append(s)
            except (OSError, ValueError):
                return

    def peak_rss(self) -> float:
        return max((s["rss_mb"] for s in self.samples), default=0.0)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(180)


def subscription_stats(broker: BrokerProcess, topic: str, sub: str) -> dict[str, Any]:
    status, stats = broker.admin("GET", f"/admin/v2/persistent/public/default/{topic}/stats")
    if status != 200:
        return {"error": status}
    return dict(stats["subscriptions"].get(sub, {}))


def flood_policy(broker: BrokerProcess, spec: str) -> dict[str, Any]:
    """Apply ``path=json`` topic policies to the flood topic (e.g. publishRate={...}); answer
    what the broker said, so a policy not built yet shows as its 404/405."""
    path, _, body = spec.partition("=")
    status, answer = broker.admin(
        "POST", f"/admin/v2/persistent/public/default/flood/{path}", json.loads(body)
    )
    return {"policy": path, "status": status, "answer": answer}


def one_run(args: argparse.Namespace, *, misbehave: bool, seconds: float) -> dict[str, Any]:
    conf = {"keepAliveIntervalSeconds": 30, **dict(c.split("=", 1) for c in args.conf)}
    broker = BrokerProcess(conf=conf)
    broker.start(timeout=60)
    assert broker.proc is not None
    pid = broker.proc.pid
    result: dict[str, Any] = {
        "misbehaving": misbehave,
        "conf": conf,
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }
    sampler: Sampler | None = None
    load: subprocess.Popen[str] | None = None
    bad: subprocess.Popen[str] | None = None
    try:
        time.sleep(1)
        rss0 = proc_rss_mb(pid)
        load = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--role",
                "load",
                "--port",
                str(broker.port),
                "--connections",
                str(args.connections),
                "--topics",
                str(args.topics),
                "--topics-per-connection",
                str(args.topics_per_connection),
                "--slow-interval",
                str(args.slow_interval),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert load.stdout is not None and load.stdin is not None
        idle = json.loads(load.stdout.readline())
        time.sleep(1)
        rss_idle = proc_rss_mb(pid)
        topics = json.loads(load.stdout.readline())
        time.sleep(2)
        rss_topics = proc_rss_mb(pid)
        result["setup"] = {
            "rss_empty_mb": round(rss0, 1),
            "rss_after_connections_mb": round(rss_idle, 1),
            "rss_after_topics_mb": round(rss_topics, 1),
            "kb_per_idle_connection": round((rss_idle - rss0) * 1024 / max(args.connections, 1), 1),
            "kb_per_topic": round((rss_topics - rss_idle) * 1024 / max(args.topics, 1), 1),
            "connections_open_seconds": idle["seconds"],
            "topics_setup_seconds": topics["seconds"],
            "fds": proc_fds(pid),
        }
        print("setup", json.dumps(result["setup"]), flush=True)
        sampler = Sampler(broker, args.sample_seconds, args.tasks_every)
        if misbehave:
            bad = subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--role",
                    "misbehave",
                    "--port",
                    str(broker.port),
                    "--flood-size",
                    str(args.flood_size),
                    "--noack-rate",
                    str(args.noack_rate),
                    "--flood-rate",
                    str(args.flood_rate),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            time.sleep(3)
            result["flood_policies"] = [flood_policy(broker, p) for p in args.flood_policy]
        fast = FastClients(args, broker.service_url, "m" if misbehave else "b")
        result["fast"] = fast.run(args.warmup, seconds)
        print("fast", json.dumps(result["fast"]), flush=True)
        if bad is not None:
            noack_stats = subscription_stats(broker, "noack", "noack")
            consumers = noack_stats.get("consumers") or [{}]
            result["throttling"] = metrics(
                broker,
                "pulsar_broker_throttled_connections",
                "pulsar_broker_throttled_connections_global_limit",
                "keyshared_publish_connection_pauses_total",
                "keyshared_publish_buffer_pauses_total",
                "pulsar_broker_publish_buffer_max_usage",
            )
            bad.send_signal(signal.SIGTERM)
            out, _ = bad.communicate(timeout=120)
            counts = json.loads(out.strip().splitlines()[-1])
            time.sleep(1)
            flood_sub = subscription_stats(broker, "flood", "audit")
            noack_sub = subscription_stats(broker, "noack", "noack")
            result["misbehaving_clients"] = {
                **counts,
                "flood_rate_msg_s": round(counts["flood_confirmed"] / seconds, 1),
                "noack_unacked": consumers[0].get("unackedMessages"),
                "noack_blockedConsumerOnUnackedMsgs": consumers[0].get(
                    "blockedConsumerOnUnackedMsgs"
                ),
                "flood_backlog": flood_sub.get("msgBacklog"),
                "noack_backlog": noack_sub.get("msgBacklog"),
                # Nothing confirmed lost: every confirmed message is in the backlog.
                "flood_confirmed_not_stored": max(
                    0, counts["flood_confirmed"] - (flood_sub.get("msgBacklog") or 0)
                ),
                "noack_confirmed_not_stored": max(
                    0, counts["noack_confirmed"] - (noack_sub.get("msgBacklog") or 0)
                ),
            }
            print("misbehaving", json.dumps(result["misbehaving_clients"]), flush=True)
        # The broker as the load left it, before the raw clients disconnect.
        result["broker"] = {
            "alive": broker.proc.poll() is None,
            "peak_rss_mb": sampler.peak_rss(),
            "final_rss_mb": round(proc_rss_mb(pid), 1),
            "fds": proc_fds(pid),
            **metrics(
                broker,
                "pulsar_active_connections",
                "keyshared_asyncio_tasks",
                "keyshared_keepalive_timeouts_total",
            ),
        }
        result["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        load.stdin.write("stop\n")
        load.stdin.flush()
        done = json.loads(load.stdout.readline())
        result["slow_topics"] = done["audit"]
        print("slow", json.dumps(result["slow_topics"]), flush=True)
        sampler.close()
        result["samples"] = sampler.samples
        return result
    finally:
        if sampler is not None:
            sampler.close()
        for p in (bad, load):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        broker.close()


def growth(samples: list[dict[str, float]], key: str) -> dict[str, float]:
    """First and last value after the first quarter (warm-up), and the least-squares slope
    per hour over that span."""
    pts = [(s["t"], s[key]) for s in samples if key in s and s[key] >= 0]
    pts = pts[len(pts) // 4 :]
    if len(pts) < 2:
        return {}
    n = len(pts)
    mt = sum(t for t, _ in pts) / n
    mv = sum(v for _, v in pts) / n
    den = sum((t - mt) ** 2 for t, _ in pts) or 1
    slope = sum((t - mt) * (v - mv) for t, v in pts) / den
    return {
        "after_warmup": pts[0][1],
        "last": pts[-1][1],
        "max": max(v for _, v in pts),
        "slope_per_hour": round(slope * 3600, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--role", default="main", choices=("main", "load", "misbehave"))
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--topics-per-connection", type=int, default=250)
    ap.add_argument(
        "--slow-interval", type=float, default=10.0, help="seconds between a slow topic's messages"
    )
    ap.add_argument("--fast", type=int, default=4)
    ap.add_argument("--fast-rate", type=float, default=200.0)
    ap.add_argument("--fast-size", type=int, default=1024)
    ap.add_argument("--flood-size", type=int, default=1024)
    ap.add_argument(
        "--flood-rate", type=float, default=0.0, help="msg/s of the flood (0: all it can)"
    )
    ap.add_argument("--noack-rate", type=float, default=500.0)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--minutes", type=float, default=0.0, help="soak mode: one run this long")
    ap.add_argument("--sample-seconds", type=float, default=1.0)
    ap.add_argument(
        "--tasks-every",
        type=float,
        default=-1,
        help="seconds between /metrics reads for the task count (default: only at the end, "
        "60 in soak mode); a read builds every topic's stats on the broker's loop, about 1 ms "
        "per topic, which the fast clients' latency would show",
    )
    ap.add_argument(
        "--conf",
        action="append",
        default=["maxUnackedMessagesPerConsumer=5000"],
        help="broker.conf key=value (repeatable)",
    )
    ap.add_argument(
        "--flood-policy",
        action="append",
        default=[],
        help='topic policy for the flood topic: path=json, e.g. publishRate={"publishThrottlingRateInMsg":1000}',
    )
    ap.add_argument("--output", default="")
    args = ap.parse_args()
    if args.role == "load":
        try:
            import uvloop

            uvloop.run(run_raw_load(args))
        except ImportError:
            asyncio.run(run_raw_load(args))
        return
    if args.role == "misbehave":
        run_misbehave(args)
        return
    fd_limit = raise_fd_limit()
    report: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "fd_limit": fd_limit,
        "cpus": os.cpu_count(),
        "connections": args.connections,
        "topics": args.topics,
        "fast": {"producers": args.fast, "rate_each": args.fast_rate, "size": args.fast_size},
    }
    if args.tasks_every < 0:
        args.tasks_every = 60.0 if args.minutes else 0.0
    if args.minutes:
        soak = one_run(args, misbehave=True, seconds=args.minutes * 60)
        report["soak"] = soak
        report["growth"] = {k: growth(soak["samples"], k) for k in ("rss_mb", "fds", "tasks")}
        print("growth", json.dumps(report["growth"]), flush=True)
        name = args.output or "load-soak.json"
    else:
        base = one_run(args, misbehave=False, seconds=args.seconds)
        bad = one_run(args, misbehave=True, seconds=args.seconds)
        for r in (base, bad):
            r["samples"] = r["samples"][:: max(1, len(r["samples"]) // 120)]
        report["baseline"], report["misbehaving"] = base, bad
        b, m = base["fast"], bad["fast"]
        report["comparison"] = {
            "throughput_ratio": round(m["throughput_msg_s"] / max(b["throughput_msg_s"], 1e-9), 3),
            "p99_ratio": round(m["latency_p99_ms"] / max(b["latency_p99_ms"], 1e-9), 3),
        }
        print("comparison", json.dumps(report["comparison"]), flush=True)
        name = args.output or "load.json"
    out = ROOT / "bench" / "results" / name
    out.write_text(json.dumps(report, indent=2) + "\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
