"""A seeded simulation of the producer path with deduplication on, checked against a model.

The broker side is real: each connection's :class:`~keyshared.server.publish.Publisher` (its
per-producer ``ReceiptQueue`` orders the answers), :meth:`Deduplication.publish
<keyshared.broker.dedup.Deduplication.publish>` (the decision, the wait for an original still
being written, the original's id in a duplicate's receipt), and :meth:`Deduplication.recover`
rebuilding the state from the metadata store's snapshot plus a replay of the entries after it.
Around it: a topic that holds sends while recovery runs (as ``PersistentTopic`` does), a ledger
whose writes complete in order when the schedule says so (or all fail together, or a crash keeps
a prefix of them), and a model of the official C++ client per producer name.

The client model batches by key (one open batch per key; all flushed together when the batch is
full or the schedule flushes, sent in order of their first sequence id), so an entry's ids are
not contiguous and are lower than ids already stored; now and then it skips ids (explicit
sequence ids with gaps). Its pending sends are resent in full, the same bytes, after every
reconnect; a send error makes it reconnect (as the C++ client does for anything but a checksum
error).

A step is one of: run the next loop callback, complete the oldest write, fail every write in
flight, refuse the next appends outright, a producer adds a message or flushes, a connection drops, a producer reconnects, the
broker takes a snapshot, the broker crashes and restarts (a random prefix of the writes in
flight survives; a new ledger is opened; state is recovered from the last snapshot and the log),
the virtual clock advances, the broker's check for idle producer names runs (some seeds expire
names after a few virtual seconds, some keep at most one or two names).
Then every producer reconnects and flushes, and everything must settle.

Checks: a message is never stored twice (unless its producer's name was forgotten since it was
stored: then a resend is new, by design); a name is never forgotten while its producer is
connected; a snapshot names an entry of the log; a receipt arrives for the oldest pending send of its
connection (send order); a confirmed message is stored; a duplicate's receipt names the entry
that holds it, and is ``-1:-1`` only when this broker never wrote nor replayed that entry; at
rest nothing is pending and every message is stored exactly once.

One ``random.Random(seed)`` drives everything and the loop is virtual (:mod:`tests.sim.loop`),
so a seed replays exactly (``SIM_SEED=S`` with ``tests/sim/test_sim_producers.py``).
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from keyshared.broker.dedup import Deduplication
from keyshared.broker.errors import ServerError
from keyshared.broker.topic import Producer
from keyshared.protocol import encode_payload_section, pb
from keyshared.protocol.metadata import encode_batch
from keyshared.server.publish import Publisher
from keyshared.storage.memory import InMemoryLedger
from keyshared.storage.metadata import MetadataStore
from keyshared.storage.position import Position
from tests.sim.loop import SimLoop

TOPIC = "persistent://public/default/sim-producers"
REPLAY_HINT = "SIM_SEED={seed} .venv/bin/python -m pytest tests/sim/test_sim_producers.py -q"
FORGOTTEN = Position(-1, -1)
SETTLE_LIMIT = 5_000


class InjectedWriteError(OSError):
    """A storage write failure the simulation injected on purpose."""


class ProducerSimFailure(AssertionError):
    """A property broke: which, at which step of which seed, and the trace that led there."""

    def __init__(self, seed: int, step: int, message: str, trace: list[str]) -> None:
        self.seed = seed
        self.step = step
        self.message = message
        self.trace = trace
        super().__init__(self.render())

    def render(self, trace_lines: int = 40) -> str:
        """The failure, the replay command, and the end of the trace."""
        tail = self.trace[-trace_lines:]
        lines = [
            f"replay: {REPLAY_HINT.format(seed=self.seed)}",
            f"seed {self.seed}, step {self.step}: {self.message}",
        ]
        if len(self.trace) > len(tail):
            lines.append(f"  ... {len(self.trace) - len(tail)} earlier steps")
        lines.extend("  " + t for t in tail)
        return "\n".join(lines)


def entry_bytes(name: str, seqs: tuple[int, ...], key: str) -> bytes:
    """An entry as the C++ client sends it: one message, or a key-based batch whose metadata
    ``sequence_id`` is its first message's (no ``highest_sequence_id``)."""
    md = pb.MessageMetadata(producer_name=name, sequence_id=seqs[0], publish_time=1)
    if len(seqs) == 1:
        md.partition_key = key
        return encode_payload_section(md, f"{name}:{seqs[0]}".encode())
    md.num_messages_in_batch = len(seqs)
    body = encode_batch(
        (pb.SingleMessageMetadata(sequence_id=s, partition_key=key), f"{name}:{s}".encode())
        for s in seqs
    )
    return encode_payload_section(md, body)


# --- the broker side --------------------------------------------------------------------


class SimLog:
    """The topic's ledger: writes complete in order when told to, or fail together."""

    def __init__(self, loop: SimLoop) -> None:
        self.loop = loop
        self.ledger = InMemoryLedger()
        self.next_pos = Position(1, 0)
        self.writes: deque[tuple[Position, bytes, asyncio.Future[None]]] = deque()
        # Appends to refuse outright (a full disk, a ledger that cannot be created).
        self.refuse = 0

    def append(self, data: bytes) -> tuple[Position, asyncio.Future[None]]:
        """Start a write (ManagedLedger.add_entry's contract)."""
        if self.refuse:
            self.refuse -= 1
            raise InjectedWriteError("injected: append refused")
        pos = self.next_pos
        self.next_pos = Position(pos.ledger_id, pos.entry_id + 1)
        fut: asyncio.Future[None] = self.loop.create_future()
        self.writes.append((pos, data, fut))
        return pos, fut

    def land(self, pos: Position, data: bytes) -> None:
        """Make a write durable at ``pos``."""
        got = self.ledger.add_entry(data)
        assert got == pos, f"write meant for {pos} landed at {got}"

    def roll(self) -> None:
        """A new ledger: after a failed write or a restart."""
        self.next_pos = Position(self.ledger.roll_ledger(), 0)


class SimTopic:
    """The part of PersistentTopic the publish path uses, with deduplication always on."""

    def __init__(self, sim: ProducerSim) -> None:
        self.log = log = sim.log
        params = sim.params
        self.dedup = Deduplication(
            TOPIC,
            cast(Any, log.ledger),
            sim.metadata,
            inactivity_timeout=params.inactivity_timeout,
            max_producers=params.max_producers,
            clock=lambda: sim.now,
        )
        self.held: list[tuple[Producer, bytes, Callable[..., None]]] | None = []
        self.dead = False
        self.ready = asyncio.ensure_future(self._recover())

    async def _recover(self) -> None:
        try:
            await self.dedup.recover()
        finally:
            # A process that died during recovery releases nothing.
            held, self.held = ([], None) if self.dead else (self.held or [], None)
            for producer, data, on_done in held:
                self.publish(producer, 0, 0, data, on_done)

    def publish(
        self,
        producer: Producer,
        sequence_id: int,
        highest_sequence_id: int,
        data: bytes,
        on_done: Callable[..., None],
    ) -> None:
        """PersistentTopic.publish with deduplication on."""
        if self.held is not None:
            self.held.append((producer, data, on_done))
            return
        try:
            self.dedup.publish(producer.producer_name, data, self.log.append, on_done)
        except InjectedWriteError as exc:  # PersistentTopic._refused
            on_done(None, exc)

    def add_producer(self, name: str) -> None:
        """PersistentTopic.add_producer's part in deduplication."""
        self.dedup.producer_added(name)

    def remove_producer(self, name: str) -> list[str]:
        """PersistentTopic.remove_producer's part; returns the names it made the state forget
        (over ``brokerDeduplicationMaxNumberOfProducers``)."""
        if self.dead:
            return []
        before = list(self.dedup.state.producers)
        self.dedup.producer_removed(name)
        return [n for n in before if n not in self.dedup.state.producers]


class Connection:
    """A client connection: what the broker sends goes straight to the client model."""

    def __init__(self, client: Client, epoch: int) -> None:
        self.client = client
        self.epoch = epoch
        self.alive = True
        self.publisher = Publisher(self)

    def send_receipt(
        self, producer: Producer, sequence_id: int, highest_sequence_id: int, position: Position
    ) -> None:
        """SEND_RECEIPT."""
        if self.alive:
            self.client.on_receipt(sequence_id, position)

    def send_error(
        self, producer: Producer, sequence_id: int, code: ServerError, message: str
    ) -> None:
        """SEND_ERROR."""
        if self.alive:
            self.client.on_error(sequence_id, code, message)

    def close_producer(self, producer: Producer) -> None:
        """Not used here."""

    @property
    def address(self) -> str:
        """For stats."""
        return "sim:0"

    @property
    def client_version(self) -> str:
        """For stats."""
        return "sim"


# --- the client model ---------------------------------------------------------------------


@dataclass
class Op:
    """A pending send (the C++ client's OpSendMsg)."""

    seqs: tuple[int, ...]
    data: bytes
    sends: int = 0


@dataclass
class Client:
    """The C++ client's producer: key-based batching, resend everything pending on reconnect."""

    sim: ProducerSim
    name: str
    next_seq: int = 0
    batches: dict[str, list[int]] = field(default_factory=dict)
    pending: deque[Op] = field(default_factory=deque)
    conn: Connection | None = None
    producer: Producer | None = None
    topic: SimTopic | None = None
    epochs: int = 0
    created: list[int] = field(default_factory=list)
    receipts: int = 0

    def add(self, key: str, max_batch: int, skip: int) -> None:
        """A new message for ``key``; the batch goes out when ``max_batch`` are open."""
        self.next_seq += skip
        seq = self.next_seq
        self.next_seq += 1
        self.created.append(seq)
        self.batches.setdefault(key, []).append(seq)
        if sum(len(b) for b in self.batches.values()) >= max_batch:
            self.flush()

    def flush(self) -> None:
        """Close every open batch; send them in order of their first sequence id."""
        batches = sorted(self.batches.items(), key=lambda kv: kv[1][0])
        self.batches = {}
        for key, seqs in batches:
            op = Op(tuple(seqs), entry_bytes(self.name, tuple(seqs), key))
            self.sim.entries[op.data] = (self.name, op.seqs)
            self.pending.append(op)
            self._send(op)

    def _send(self, op: Op) -> None:
        conn, producer = self.conn, self.producer
        if conn is None or producer is None:
            return
        op.sends += 1
        cmd = pb.CommandSend(
            producer_id=producer.producer_id, sequence_id=op.seqs[0], num_messages=len(op.seqs)
        )
        conn.publisher.on_send(producer, cmd, op.data, True)

    def connect(self, topic: SimTopic) -> None:
        """A new connection; everything pending is resent, in order."""
        self.epochs += 1
        conn = Connection(self, self.epochs)
        self.conn = conn
        self.producer = Producer(self.epochs, self.name, cast(Any, topic), conn)
        self.topic = topic
        topic.add_producer(self.name)
        for op in list(self.pending):
            self._send(op)

    def disconnect(self) -> None:
        """The connection drops: answers still owed on it are lost."""
        if self.conn is not None:
            self.conn.alive = False
            if self.producer is not None:
                self.conn.publisher.forget(self.producer.producer_id)
        self.conn = None
        self.producer = None
        topic, self.topic = self.topic, None
        if topic is not None:
            self.sim.forgot(topic.remove_producer(self.name))

    def on_receipt(self, sequence_id: int, position: Position) -> None:
        """A receipt: it must be for the oldest pending send (the client's own check)."""
        if not self.pending or self.pending[0].seqs[0] != sequence_id:
            head = self.pending[0].seqs[0] if self.pending else None
            self.sim.fail(
                f"receipt order: {self.name} got a receipt for {sequence_id}, expecting {head}"
            )
        op = self.pending.popleft()
        self.receipts += 1
        self.sim.confirmed(self.name, op, position)

    def on_error(self, sequence_id: int, code: ServerError, message: str) -> None:
        """A send error: in order too; the client reconnects and resends."""
        if not self.pending or self.pending[0].seqs[0] != sequence_id:
            self.sim.fail(f"receipt order: {self.name} got an error for {sequence_id}")
        self.sim.note(f"{self.name} error {sequence_id} {code.name}: reconnects")
        self.disconnect()


# --- the simulation -----------------------------------------------------------------------


@dataclass(slots=True)
class Params:
    """What a seed fixes before its schedule."""

    steps: int
    names: tuple[str, ...]
    keys: tuple[str, ...]
    max_batch: int
    skip_prob: float
    # brokerDeduplicationProducerInactivityTimeoutMinutes (in seconds of the virtual clock) and
    # brokerDeduplicationMaxNumberOfProducers.
    inactivity_timeout: float
    max_producers: int
    weights: dict[str, float]

    @classmethod
    def draw(cls, rng: random.Random) -> Params:
        """Draw one schedule's settings."""
        return cls(
            steps=rng.randint(60, 250),
            names=tuple(f"p{i}" for i in range(rng.randint(1, 3))),
            keys=tuple(f"k{i}" for i in range(rng.choice((1, 2, 3, 4, 8)))),
            max_batch=rng.choice((1, 2, 4, 6, 10)),
            skip_prob=rng.choice((0.0, 0.0, 0.1)),
            inactivity_timeout=rng.choice((1e9, 1e9, 2.0, 6.0)),
            max_producers=rng.choice((10_000, 10_000, 1, 2)),
            weights={
                "run": 30.0,
                "write_done": 14.0,
                "write_fail": rng.choice((0.0, 0.5, 1.5)),
                "message": rng.choice((12.0, 20.0)),
                "flush": rng.choice((2.0, 5.0)),
                "drop": rng.choice((0.5, 1.5, 3.0)),
                "connect": 4.0,
                "snapshot": rng.choice((0.5, 2.0)),
                "restart": rng.choice((0.3, 1.0, 2.0)),
                "tick": rng.choice((0.0, 3.0)),
                "refuse": rng.choice((0.0, 0.0, 1.0)),
                "purge": rng.choice((0.0, 1.0, 2.0)),
            },
        )


class ProducerSim:
    """One seed's simulation (see the module docstring)."""

    def __init__(self, seed: int, trace: bool = True) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.params = Params.draw(self.rng)
        self.tracing = trace
        self.trace: list[str] = []
        self.step_no = 0
        self.loop = SimLoop()
        self.metadata = MetadataStore(":memory:", durable=False)
        self.log = SimLog(self.loop)
        self.topic: SimTopic | None = None
        self.clients = {n: Client(self, n) for n in self.params.names}
        # Entry bytes -> (producer name, sequence ids), as the model built them.
        self.entries: dict[bytes, tuple[str, tuple[int, ...]]] = {}
        self.stored: dict[tuple[str, int], Position] = {}
        # The virtual clock of producer-name expiry; an event counter orders stores and the
        # forgetting of names (a message stored before its name was forgotten may be stored
        # again: that is what forgetting means).
        self.now = 0.0
        self.events = 0
        self.stored_at: dict[tuple[str, int], int] = {}
        self.forgot_at: dict[str, int] = {}
        self.names_forgotten = 0
        self.where: dict[bytes, Position] = {}
        # Entries this broker incarnation wrote or replayed: a duplicate of one of them must be
        # answered with its id.
        self.known: set[Position] = set()
        self.restarts = 0
        self.resent = 0
        self.forgotten = 0
        self.dropped = 0

    # --- reporting ---------------------------------------------------------------------------
    def note(self, line: str) -> None:
        """Add a line to the trace."""
        if self.tracing:
            self.trace.append(f"{self.step_no} {line}")

    def fail(self, message: str) -> None:
        """A property broke."""
        raise ProducerSimFailure(self.seed, self.step_no, message, self.trace)

    # --- what the model checks -------------------------------------------------------------
    def _landed(self, pos: Position, data: bytes) -> None:
        self.log.land(pos, data)
        name, seqs = self.entries[data]
        self.where[data] = pos
        self.known.add(pos)
        self.events += 1
        for s in seqs:
            first = self.stored.get((name, s))
            if first is not None and self.forgot_at.get(name, -1) < self.stored_at[(name, s)]:
                self.fail(f"{name} message {s} stored twice: at {first} and at {pos}")
            self.stored[(name, s)] = pos
            self.stored_at[(name, s)] = self.events

    def forgot(self, names: list[str]) -> None:
        """The broker forgot these producer names: never one with a producer connected."""
        self.events += 1
        for name in names:
            self.note(f"{name} forgotten")
            self.names_forgotten += 1
            if self.clients[name].conn is not None:
                self.fail(f"{name} forgotten while its producer is connected")
            self.forgot_at[name] = self.events

    def confirmed(self, name: str, op: Op, position: Position) -> None:
        """A receipt for ``op``: its messages are stored, and the receipt says where."""
        self.note(f"{name} receipt {op.seqs} -> {position}")
        for s in op.seqs:
            if (name, s) not in self.stored:
                self.fail(f"{name} message {s} confirmed ({position}) but not stored")
        original = self.where.get(op.data)
        if op.sends > 1:
            self.resent += 1
        if position == FORGOTTEN:
            self.forgotten += 1
            if original is not None and original in self.known:
                self.fail(
                    f"{name} {op.seqs}: duplicate answered -1:-1, but the broker wrote or "
                    f"replayed the original at {original}"
                )
            return
        entry = self.log.ledger.entry_at(position)
        if entry is None or entry.data != op.data:
            self.fail(f"{name} {op.seqs}: receipt names {position}, which does not hold them")

    # --- the broker's life -------------------------------------------------------------------
    def start_broker(self) -> None:
        """A broker (re)starts: a new ledger, state recovered from snapshot + log."""
        if self.topic is not None:
            self.dropped += self.topic.dedup.state.duplicates_dropped
        self.log.roll()
        snap = self.metadata.get_json(f"dedup/{TOPIC}")
        covered = None
        if snap and snap.get("position") is not None:
            covered = Position(*snap["position"])
            if self.log.ledger.entry_at(covered) is None:
                # Recovery would distrust it and replay the whole log.
                self.fail(f"the snapshot covers up to {covered}, which is not in the log")
        self.known = {p for p in self.log.ledger.positions() if covered is None or p > covered}
        self.topic = SimTopic(self)

    def crash(self) -> None:
        """SIGKILL: connections drop, queued callbacks vanish, a prefix of the writes in flight
        had reached the disk."""
        if self.topic is not None:
            self.topic.dead = True  # the dead process writes no snapshot as producers go
        for c in self.clients.values():
            c.disconnect()
        writes = list(self.log.writes)
        self.log.writes.clear()
        keep = self.rng.randint(0, len(writes))
        for pos, data, _ in writes[:keep]:
            self._landed(pos, data)
        self.loop.ready.clear()
        self.loop._timers.clear()
        if self.topic is not None and not self.topic.ready.done():
            # The old process's recovery dies with it (not a task "destroyed while pending").
            self.topic.ready.get_coro().close()
            self.topic.ready._log_destroy_pending = False  # type: ignore[attr-defined]
        self.restarts += 1
        self.note(f"crash: {keep} of {len(writes)} writes in flight survive")
        self.start_broker()

    # --- steps -------------------------------------------------------------------------------
    def _choose(self) -> str:
        w = self.params.weights
        kinds = list(w)
        return self.rng.choices(kinds, [w[k] for k in kinds])[0]

    def step(self, kind: str) -> None:
        """Carry out one step of ``kind`` (a no-op when it does not apply)."""
        rng = self.rng
        if kind == "run":
            self.loop.run_one()
        elif kind == "write_done":
            if self.log.writes:
                pos, data, fut = self.log.writes.popleft()
                self._landed(pos, data)
                self.note(f"write {pos} done {self.entries[data]}")
                fut.set_result(None)
        elif kind == "write_fail":
            if self.log.writes:
                writes = list(self.log.writes)
                self.log.writes.clear()
                self.note(f"{len(writes)} writes fail")
                for _, _, fut in writes:
                    fut.set_exception(InjectedWriteError("injected write failure"))
                    # Retrieved here too: a crash may drop the callbacks that would, and the
                    # loop must not hear of it at some garbage collection later.
                    fut.exception()
                self.log.roll()
        elif kind == "message":
            c = self.clients[rng.choice(self.params.names)]
            key = rng.choice(self.params.keys)
            skip = rng.randint(1, 3) if rng.random() < self.params.skip_prob else 0
            self.note(f"{c.name} message {c.next_seq + skip} key {key}")
            c.add(key, self.params.max_batch, skip)
        elif kind == "flush":
            c = self.clients[rng.choice(self.params.names)]
            self.note(f"{c.name} flush")
            c.flush()
        elif kind == "drop":
            c = self.clients[rng.choice(self.params.names)]
            if c.conn is not None:
                self.note(f"{c.name} connection drops")
                c.disconnect()
        elif kind == "connect":
            c = self.clients[rng.choice(self.params.names)]
            if c.conn is None and self.topic is not None:
                self.note(f"{c.name} reconnects, resends {len(c.pending)}")
                c.connect(self.topic)
        elif kind == "snapshot":
            if self.topic is not None and self.topic.held is None:
                self.note("snapshot")
                self.topic.dedup.snapshot()
        elif kind == "restart":
            self.crash()
        elif kind == "refuse":
            self.log.refuse += rng.randint(1, 3)
            self.note(f"the next {self.log.refuse} appends are refused")
        elif kind == "tick":
            self.now += rng.uniform(0.1, 3.0)
        elif kind == "purge" and self.topic is not None and self.topic.held is None:
            self.note(f"purge check at {self.now:.1f}")
            self.forgot(self.topic.dedup.purge_inactive())

    def check_step(self) -> None:
        """After every step: nothing went wrong unnoticed on the loop."""
        if self.loop.unhandled:
            self.fail(f"unhandled error on the loop: {self.loop.unhandled[0].get('message')}")

    def settle(self) -> None:
        """Everyone reconnects and flushes; run until nothing is left to do."""
        self.note("settle")
        for c in self.clients.values():
            c.flush()
        for _ in range(SETTLE_LIMIT):
            self.step_no += 1
            assert self.topic is not None
            for c in self.clients.values():
                if c.conn is None:
                    self.note(f"{c.name} reconnects, resends {len(c.pending)}")
                    c.connect(self.topic)
            if self.loop.run_one():
                pass
            elif self.log.writes:
                self.step("write_done")
            elif self.loop.has_timer():
                self.loop.fire_next_timer()
            elif all(c.conn is not None for c in self.clients.values()):
                break
            self.check_step()
        else:
            self.fail("did not come to rest")

    def check_end(self) -> None:
        """At rest: nothing pending, every message stored exactly once."""
        for c in self.clients.values():
            if c.pending:
                self.fail(f"{c.name}: {len(c.pending)} sends never answered")
            for s in c.created:
                if (c.name, s) not in self.stored:
                    self.fail(f"{c.name} message {s} never stored")

    def run(self) -> None:
        """The whole schedule, settling, and the final checks."""
        with self.loop.installed():
            try:
                self.start_broker()
                for c in self.clients.values():
                    c.connect(cast(SimTopic, self.topic))
                for _ in range(self.params.steps):
                    self.step_no += 1
                    self.step(self._choose())
                    self.check_step()
                self.settle()
                self.check_end()
                self.dropped += cast(SimTopic, self.topic).dedup.state.duplicates_dropped
            except ProducerSimFailure:
                raise
            except Exception as exc:
                self.fail(f"{type(exc).__name__}: {exc}")
            finally:
                self.metadata.close()


def run_producer_seed(seed: int, *, trace: bool = True) -> ProducerSim:
    """Run one seed; raises :class:`ProducerSimFailure` if a property breaks."""
    sim = ProducerSim(seed, trace)
    sim.run()
    return sim
