"""A seeded simulation of one Key_Shared subscription: the real dispatcher, subscription and cursor,
driven through random schedules and checked by an oracle after every step.

The dispatcher is PIP-379's (``key_shared.py``) or, for about one seed in three
(:func:`is_classic`, drawn apart from the schedule's stream so the other seeds keep their
schedules), the classic PIP-282 one (``key_shared_classic.py``,
``subscriptionKeySharedUseClassicPersistentImplementation=true``), under the same schedules and
the same checks (see below for what differs).

One seed fixes everything: the subscription's settings (AUTO_SPLIT with consistent hashing or
range auto-split, allowOutOfOrderDelivery, or STICKY ranges; look-ahead and unacked limits, read
batch sizes, backoff, the PIP-299 pause, ledger size), the keys, and a schedule of steps. A step
is one of: run the next queued callback of the loop (:mod:`tests.sim.loop`), complete or fail a
storage read held in flight (``ControlledReader``), fire the earliest timer, publish entries (a few
hot keys, some batches), a consumer joining (a new name, or a reused one: a reconnect), leaving
gracefully or crashing, acking some of what it holds (in any order, some batch indexes one by
one), nacking, sending FLOW, pausing, its connection's write buffer filling or draining, and a
reset-cursor (seek). Then every consumer stays, flows and acks everything, and the run must come
to rest with everything acked.

What the checks are (``check_delivery`` on every MESSAGE, ``check_step`` after every step,
``check_end`` at rest):

* exclusivity: a key's entries are held unacked by at most one consumer at a time;
* per-consumer order: a consumer gets each key's entries in increasing position order, except a
  redelivery of an entry it had been given before (and so did not ack), or an entry that was
  negatively acknowledged, by any consumer, and not delivered since (Pulsar gives no ordering
  guarantee across a nack: research/pulsar-semantics.md §3);
* per-key order of first deliveries, across consumers (what the key's processing sees);
  (these three do not hold with allowOutOfOrderDelivery, and are not checked then)
* no entry is delivered while a consumer holds it, after it was acked, or to a consumer the
  broker removed; a redelivered batch carries exactly the indexes still unacked;
* the cursor agrees with every ack (whole entries and batch indexes); the broker's pending acks
  of each consumer are exactly what that consumer holds;
* liveness: once consumers stay, every entry is delivered at least once and acked, the cursor's
  mark-delete position reaches the last entry, and nothing stays queued, draining or counted as
  unacked.

Classic seeds get every check above, exclusivity included, and two of their own: a recently
joined consumer never receives an entry beyond its join position, and at rest no consumer is
still recently joined. Classic has no draining hashes and no look-ahead limits, so there is
nothing of those to check (``draining`` is None). Exclusivity and per-consumer order hold for
classic only thanks to what ours does beyond PIP-282 and Pulsar (its module docstring): without
it a restricted consumer gets redeliveries of a key while the consumer the key moved away from
still holds earlier entries of it, and a key moved by a leave goes to a consumer no longer
restricted, likewise; test_sim_oracle checks the simulation notices.

Determinism: all randomness comes from one ``random.Random(seed)``; the loop is virtual; nothing
iterates a set whose order depends on string hashing or object addresses when choosing. The same
seed replays the same schedule in any process (a test checks it under another PYTHONHASHSEED).
The first ``N`` steps of a seed do not depend on its length, so ``steps=`` shrinks a failing
schedule to its shortest failing prefix.
"""

from __future__ import annotations

import os
import random
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, cast

from keyshared.broker.consumer import Consumer, KeySharedMeta, OutboundMessage, SubType
from keyshared.broker.dispatch.key_shared import KeySharedDispatcher
from keyshared.broker.dispatch.key_shared_classic import ClassicKeySharedDispatcher
from keyshared.broker.subscription import AckItem, Subscription
from keyshared.broker.throttle import DispatchThrottle, Rate, SharedDispatchLimiters
from keyshared.config import BrokerConfig
from keyshared.storage import batch_ack
from keyshared.storage.cursor import CursorConfig, ManagedCursor
from keyshared.storage.memory import ControlledReader, InMemoryLedger, MemoryCursorStore
from keyshared.storage.position import EARLIEST, LATEST, Position
from tests.sim import idle
from tests.sim.loop import SimLoop
from tests.sim.world import InjectedReadError, SimTopic, SimTransport, payload, payload_meta

REPLAY_HINT = "SIM_SEED={seed}{steps} .venv/bin/python -m pytest tests/sim -q"
# How much likelier a leave or crash is drawn while a replay read is in flight.
REPLAY_LEAVE_BIAS = float(os.environ.get("SIM_REPLAY_LEAVE_BIAS", "4"))
MAX_CONSUMERS = 5
# The share of seeds that run the classic (PIP-282) dispatcher. Drawn from a stream of its own,
# so every other seed keeps the schedule it had before classic seeds existed.
CLASSIC_SHARE = 1 / 3
CLASSIC_SALT = 0x282_C1A5
# maxUnackedMessagesPerSubscription: small on about one seed in four, drawn from a stream of
# its own for the same reason (those seeds keep their schedules; what the broker does differs).
SUB_UNACKED_SHARE = 1 / 4
SUB_UNACKED_SALT = 0x5_0B_0AC4
SUB_UNACKED_LIMITS = (1, 2, 5, 8, 16, 40)


def is_classic(seed: int) -> bool:
    """Whether ``seed`` runs the classic dispatcher (a function of the seed alone)."""
    return random.Random(seed ^ CLASSIC_SALT).random() < CLASSIC_SHARE


def sub_unacked_limit(seed: int) -> int:
    """The seed's maxUnackedMessagesPerSubscription (0: none), a function of the seed alone."""
    rng = random.Random(seed ^ SUB_UNACKED_SALT)
    return rng.choice(SUB_UNACKED_LIMITS) if rng.random() < SUB_UNACKED_SHARE else 0


# The share of seeds whose subscription has a dispatch rate (broker/throttle.py), also drawn
# from a stream of its own. Throttling only delays reads: every property must hold as without.
RATE_SHARE = 1 / 5
RATE_SALT = 0x4A7E_D15C


def dispatch_rate(seed: int) -> Rate | None:
    """The subscription dispatch rate ``seed`` runs with (a function of the seed alone)."""
    rng = random.Random(seed ^ RATE_SALT)
    if rng.random() >= RATE_SHARE:
        return None
    return Rate(
        msgs=rng.choice((0, 1, 3, 10)),
        bytes=rng.choice((0, 0, 40, 200)) or (0 if rng.random() < 0.5 else 100),
        period=rng.choice((1, 1, 2)),
    )


class SimFailure(AssertionError):
    """A property broke: which, at which step of which seed, and the trace that led there."""

    def __init__(
        self,
        seed: int,
        step: int,
        message: str,
        trace: list[str],
        steps: int,
        steps_override: int | None = None,
    ) -> None:
        self.seed = seed
        self.step = step
        self.message = message
        self.trace = trace
        self.steps = steps
        self.steps_override = steps_override
        super().__init__(self.render())

    @property
    def replay_command(self) -> str:
        """The one-line command that replays this schedule."""
        cut = f" SIM_STEPS={self.steps_override}" if self.steps_override is not None else ""
        return REPLAY_HINT.format(seed=self.seed, steps=cut)

    def render(self, trace_lines: int = 40) -> str:
        """The failure, the replay command, and the end of the trace."""
        tail = self.trace[-trace_lines:]
        skipped = len(self.trace) - len(tail)
        cut = f" --steps {self.steps_override}" if self.steps_override is not None else ""
        lines = [
            f"replay: {self.replay_command}",
            f"seed {self.seed}, step {self.step}: {self.message}",
            f"trace:  .venv/bin/python -m tests.sim --seed {self.seed}{cut} --trace"
            "   (shortest failing prefix: --shrink)",
        ]
        if skipped:
            lines.append(f"  ... {skipped} earlier steps")
        lines.extend("  " + t for t in tail)
        return "\n".join(lines)


@dataclass(slots=True)
class Params:
    """Everything a seed fixes before the schedule starts."""

    steps: int
    # AUTO_SPLIT (the selector splits the hash space, draining keeps order), AUTO_SPLIT_OOO
    # (allowOutOfOrderDelivery: no draining, no order, so the oracle checks neither), or STICKY
    # (each consumer is given one of ``sticky_parts`` equal ranges; a range without consumer
    # waits).
    mode: str
    sticky_parts: int
    keys: tuple[str, ...]
    ordering_keys: frozenset[str]
    batch_prob: float
    max_batch: int
    entries_per_ledger: int | None
    consistent_hashing: bool
    replica_points: int
    unblock_ms: int
    max_unacked: int
    look_ahead_per_consumer: int
    look_ahead_per_subscription: int
    min_read_batch: int
    max_read_batch: int
    backoff_ms: tuple[int, int]
    pause_on_ack_state: bool
    max_ranges_to_persist: int
    weights: dict[str, float]
    # subscriptionKeySharedUseClassicPersistentImplementation: set from the seed by
    # :func:`is_classic`, not drawn from the schedule's stream.
    classic: bool = False
    # maxUnackedMessagesPerSubscription (0: none): set by :func:`sub_unacked_limit`.
    max_unacked_sub: int = 0

    @classmethod
    def draw(cls, rng: random.Random) -> Params:
        """Draw the settings of one schedule."""
        nkeys = rng.choice((1, 2, 4, 6, 8, 12, 16))
        keys = tuple(f"k{i}" for i in range(nkeys))
        return cls(
            steps=rng.randint(30, 80),
            mode=rng.choices(("AUTO_SPLIT", "AUTO_SPLIT_OOO", "STICKY"), (75, 10, 15))[0],
            sticky_parts=rng.choice((1, 2, 4)),
            keys=keys,
            ordering_keys=frozenset(k for k in keys if rng.random() < 0.3),
            batch_prob=rng.choice((0.0, 0.0, 0.2, 0.5)),
            max_batch=rng.randint(2, 5),
            entries_per_ledger=rng.choice((None, None, 3, 7, 20)),
            consistent_hashing=rng.random() < 0.6,
            replica_points=rng.choice((1, 3, 20, 100)),
            unblock_ms=rng.choice((0, 10, 10)),
            max_unacked=rng.choice((0, 0, 0, 3, 6, 20)),
            look_ahead_per_consumer=rng.choice((2000, 2000, 1, 3, 8)),
            look_ahead_per_subscription=rng.choice((20000, 20000, 4, 12)),
            min_read_batch=rng.choice((1, 1, 3)),
            max_read_batch=rng.choice((100, 2, 5, 20)),
            backoff_ms=rng.choice(((1, 10), (1, 10), (0, 0), (5, 50))),
            pause_on_ack_state=rng.random() < 0.25,
            max_ranges_to_persist=rng.choice((1, 2, 4, 10000)),
            weights={
                "run": 30.0,
                "read_done": 12.0,
                "read_fail": rng.choice((0.0, 0.0, 0.5)),
                "timer": 4.0,
                "publish": rng.choice((6.0, 10.0, 16.0)),
                "join": rng.choice((2.0, 4.0)),
                "leave": rng.choice((0.5, 1.5, 3.0)),
                "crash": rng.choice((0.5, 1.5, 3.0)),
                "ack": rng.choice((5.0, 10.0, 20.0)),
                "nack": rng.choice((0.0, 1.0, 3.0)),
                "flow": 6.0,
                "pause": rng.choice((0.0, 1.0, 2.0)),
                "writable": rng.choice((0.0, 0.5, 1.5)),
                "reset": rng.choice((0.0, 0.0, 0.0, 0.3, 1.0)),
            },
        )

    def describe(self) -> str:
        """The parameters, in the same words in every process (sets sorted)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["ordering_keys"] = sorted(self.ordering_keys)
        return " ".join(f"{k}={v}" for k, v in values.items())

    def broker_config(self) -> BrokerConfig:
        """The broker settings these parameters choose."""
        return BrokerConfig(
            subscriptionKeySharedUseConsistentHashing=self.consistent_hashing,
            subscriptionKeySharedConsistentHashingReplicaPoints=self.replica_points,
            keySharedUnblockingIntervalMs=self.unblock_ms,
            maxUnackedMessagesPerConsumer=self.max_unacked,
            maxUnackedMessagesPerSubscription=self.max_unacked_sub,
            keySharedLookAheadMsgInReplayThresholdPerConsumer=self.look_ahead_per_consumer,
            keySharedLookAheadMsgInReplayThresholdPerSubscription=self.look_ahead_per_subscription,
            dispatcherMinReadBatchSize=self.min_read_batch,
            dispatcherMaxReadBatchSize=self.max_read_batch,
            dispatcherRetryBackoffInitialTimeInMs=self.backoff_ms[0],
            dispatcherRetryBackoffMaxTimeInMs=self.backoff_ms[1],
            dispatcherPauseOnAckStatePersistentEnabled=self.pause_on_ack_state,
            managedLedgerMaxUnackedRangesToPersist=self.max_ranges_to_persist,
            subscriptionKeySharedUseClassicPersistentImplementation=self.classic,
        )


@dataclass(slots=True)
class Held:
    """An entry a client holds unacked."""

    key: str
    size: int


@dataclass(eq=False)
class Client:
    """The client side of one consumer session."""

    name: str
    consumer: Consumer
    transport: SimTransport
    queue_size: int
    ack_prob: float
    held: dict[Position, Held] = field(default_factory=dict)
    key_counts: dict[str, int] = field(default_factory=dict)
    max_seen: dict[str, Position] = field(default_factory=dict)
    given: set[Position] = field(default_factory=set)
    paused: bool = False
    closed: bool = False
    sticky_part: int = -1
    # Messages (batch indexes) held unacked, and whether the consumer's unacked limit blocks
    # it: the oracle's own account, compared with the broker's.
    unacked: int = 0
    blocked: bool = False
    # Permits the client granted (FLOW) and entries it was sent: every entry takes at least one
    # permit, so no send may carry more entries than granted less entries already sent.
    granted: int = 0
    entries_sent: int = 0

    def hold(self, pos: Position, held: Held) -> None:
        """Now holding ``pos`` unacked."""
        self.held[pos] = held
        self.key_counts[held.key] = self.key_counts.get(held.key, 0) + 1

    def release(self, pos: Position) -> Held:
        """No longer holding ``pos`` (acked or nacked)."""
        held = self.held.pop(pos)
        n = self.key_counts[held.key] - 1
        if n:
            self.key_counts[held.key] = n
        else:
            del self.key_counts[held.key]
        return held

    def drop_all(self) -> None:
        """The session ended: it holds nothing any more."""
        self.held.clear()
        self.key_counts.clear()

    def __repr__(self) -> str:
        return f"{self.name}#{self.consumer.consumer_id}"


class Violation(Exception):
    """Raised by the oracle; the simulation turns it into a :class:`SimFailure`."""


class Simulation:
    """One seeded schedule over a fresh subscription."""

    def __init__(self, seed: int, steps: int | None = None, *, trace: bool = True) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.params = Params.draw(self.rng)
        self.params.classic = is_classic(seed)
        self.params.max_unacked_sub = sub_unacked_limit(seed)
        self.steps_override = steps
        if steps is not None:
            self.params.steps = steps
        self._trace_on = trace
        self.trace: list[str] = []
        self.step_no = 0
        self.loop = SimLoop()
        self.config = self.params.broker_config()
        # Whether the key guarantees hold (not with allowOutOfOrderDelivery).
        self.keyed = self.params.mode != "AUTO_SPLIT_OOO"
        self.ledger = InMemoryLedger(max_entries_per_ledger=self.params.entries_per_ledger)
        self.reader = ControlledReader(self.ledger, hold=True)
        self.cursor = ManagedCursor(
            "sim-sub",
            self.reader,
            MemoryCursorStore(),
            durable=True,
            initial_position=EARLIEST,
            config=CursorConfig.from_broker_config(self.config),
            clock=self.loop.time,
        )
        self.topic = SimTopic(self.config)
        self.sub = Subscription(
            cast(Any, self.topic),
            "sim-sub",
            self.cursor,
            durable=True,
            config=self.config,
            scheduler=self.loop,
        )
        self.rate = dispatch_rate(seed)
        if self.rate is not None and self.rate.limited:
            sub_rate = self.rate
            self.sub.dispatch_throttle = DispatchThrottle(
                self.loop.time,
                lambda: (sub_rate, Rate()),
                SharedDispatchLimiters(self.loop.time),
                "sim",
            )
        self.clients: list[Client] = []
        self.live: list[Client] = []
        self.by_consumer: dict[int, Client] = {}
        self._next_id = 0
        # The model of the subscription's state, kept by the oracle.
        self.entries: dict[Position, tuple[str, int]] = {}
        self.order: list[Position] = []
        self.acked: set[Position] = set()
        self.partial: dict[Position, int] = {}  # position -> bitset of indexes acked so far
        self.delivered: set[Position] = set()
        self.skipped: set[Position] = set()  # acked by a reset-cursor without a delivery
        self.holder: dict[Position, Client] = {}
        self.nacked: set[Position] = set()  # nacked and not delivered since
        self.first_max: dict[str, Position] = {}
        self.deliveries = 0
        self.redeliveries = 0
        # The oracle's view of maxUnackedMessagesPerSubscription: blocked once the live
        # consumers hold the limit or more after a step, until they hold less than half.
        self.sub_blocked = False
        self.actions: dict[str, Callable[[], None]] = {
            "run": self.act_run,
            "read_done": self.act_read_done,
            "read_fail": self.act_read_fail,
            "timer": self.act_timer,
            "publish": self.act_publish,
            "join": self.act_join,
            "leave": self.act_leave,
            "crash": self.act_crash,
            "ack": self.act_ack,
            "nack": self.act_nack,
            "flow": self.act_flow,
            "pause": self.act_pause,
            "writable": self.act_writable,
            "reset": self.act_reset,
        }
        self._weighted = [n for n in self.actions if self.params.weights[n] > 0]

    # --- tracing and failing -----------------------------------------------------------------
    def note(self, text: str) -> None:
        """One line of the trace."""
        if self._trace_on:
            self.trace.append(f"{self.step_no:4d} t={self.loop.now * 1000:.0f}ms {text}")

    def fail(self, message: str) -> SimFailure:
        """The failure to raise, with everything needed to replay it."""
        return SimFailure(
            self.seed, self.step_no, message, self.trace, self.params.steps, self.steps_override
        )

    @property
    def dispatcher(self) -> KeySharedDispatcher | None:
        """The subscription's dispatcher, once a consumer created it."""
        return cast("KeySharedDispatcher | None", self.sub.dispatcher)

    # --- running -------------------------------------------------------------------------------
    def run(self) -> Simulation:
        """Run the schedule and the final phase; raises :class:`SimFailure`."""
        try:
            with self.loop.installed():
                self.note(f"params {self.params.describe()} dispatch_rate={self.rate}")
                for _ in range(self.params.steps):
                    self.step_no += 1
                    self.step()
                    self.check_step()
                    stall = idle.at_rest(self)
                    if stall is not None:
                        raise Violation(stall)
                self.step_no += 1
                stall = idle.probe(self)
                if stall is not None:
                    raise Violation(stall)
                self.check_step()
                self.finish()
        except SimFailure:
            raise
        except Violation as exc:
            raise self.fail(str(exc)) from None
        except Exception as exc:
            tb = traceback.format_exc(limit=12)
            raise self.fail(f"exception {exc!r}\n{tb}") from exc
        return self

    def enabled(self) -> list[str]:
        """The actions possible now (each is then drawn by its weight)."""
        live = self.live
        reads = bool(self.reader.pending_reads)
        holding = active = False
        for c in live:
            if not c.paused:
                active = True
                if c.held:
                    holding = True
                    break
        ok = {
            "run": bool(self.loop.ready),
            "read_done": reads,
            "read_fail": reads,
            "timer": self.loop.has_timer(),
            "publish": True,
            "join": len(live) < MAX_CONSUMERS
            and (self.params.mode != "STICKY" or len(live) < self.params.sticky_parts),
            "leave": bool(live),
            "crash": bool(live),
            "ack": holding,
            "nack": holding,
            "flow": active,
            "pause": bool(live),
            "writable": bool(live),
            "reset": bool(self.order),
        }
        return [name for name in self._weighted if ok[name]]

    def step(self) -> None:
        """One random step of the schedule: an action drawn by weight among those possible."""
        names = self.enabled()
        w = self.params.weights
        disp = self.dispatcher
        if disp is not None and disp.have_pending_replay_read and REPLAY_LEAVE_BIAS != 1.0:
            # A consumer leaving while a replay read is in flight queues older entries of a
            # hash the read may carry newer ones of (apache/pulsar#12885, #23870): a window
            # that only a leave drawn inside it opens, so such draws are made likelier.
            w = dict(w)
            for name in ("leave", "crash"):
                w[name] *= REPLAY_LEAVE_BIAS
        total = 0.0
        for name in names:
            total += w[name]
        x = self.rng.random() * total
        for name in names:
            x -= w[name]
            if x < 0:
                break
        self.actions[name]()

    # --- actions -------------------------------------------------------------------------------
    def act_run(self) -> None:
        """Run the next one to three queued callbacks."""
        for _ in range(self.rng.randint(1, 3)):
            if not self.loop.ready:
                break
            self.note(f"run {self.loop.ready[0]!r}")
            self.loop.run_one()

    def act_read_done(self) -> None:
        """A storage read held in flight completes (any of them: reads race)."""
        i = self.rng.randrange(len(self.reader.pending_reads))
        read = self.reader.complete(i)
        self.note(f"read done {read.start}+{read.max_entries}{' single' if read.single else ''}")

    def act_read_fail(self) -> None:
        """A storage read fails."""
        i = self.rng.randrange(len(self.reader.pending_reads))
        read = self.reader.fail(i, InjectedReadError("injected"))
        self.note(f"read FAILED {read.start}+{read.max_entries}")

    def act_timer(self) -> None:
        """The clock jumps to the earliest timer, which fires."""
        self.note(f"timer at {(self.loop.next_timer_at() or 0) * 1000:.0f}ms")
        self.loop.fire_next_timer()

    def act_publish(self) -> None:
        """A producer's entries become durable (one to three)."""
        p = self.params
        rng = self.rng
        for _ in range(rng.randint(1, 3)):
            # A few hot keys: the first keys are drawn much more often.
            key = p.keys[min(int(rng.expovariate(1.0) * len(p.keys) / 2.5), len(p.keys) - 1)]
            size = rng.randint(2, p.max_batch) if rng.random() < p.batch_prob else 1
            ordering = key in p.ordering_keys
            pos = self.ledger.add_entry(payload(key, size, ordering))
            # As the topic does on publish: the metadata is parsed once (here once per distinct
            # payload), so dispatch finds it cached.
            self.topic.meta_cache.put(pos, payload_meta(key, size, ordering))
            self.entries[pos] = (key, size)
            self.order.append(pos)
            self.note(f"publish {pos} key={key}{f' batch={size}' if size > 1 else ''}")

    def act_join(self) -> None:
        """A consumer subscribes (a new name, or the name of one that left: a reconnect)."""
        rng = self.rng
        gone = [c.name for c in self.clients if c.closed]
        live_names = {c.name for c in self.live}
        reuse = [n for n in dict.fromkeys(gone) if n not in live_names]
        name = rng.choice(reuse) if reuse and rng.random() < 0.5 else f"c{len(self.clients)}"
        self._next_id += 1
        if self.params.mode == "STICKY":
            part = rng.choice(self.free_sticky_parts())
            meta: KeySharedMeta | None = KeySharedMeta("STICKY", [self.sticky_range(part)])
        else:
            part = -1
            ooo = self.params.mode == "AUTO_SPLIT_OOO"
            meta = (
                KeySharedMeta(allow_out_of_order_delivery=True)
                if ooo
                else KeySharedMeta()
                if rng.random() < 0.7
                else None
            )
        transport = SimTransport(self.on_messages, self.on_broker_close)
        consumer = Consumer(
            consumer_id=self._next_id,
            consumer_name=name,
            subscription=self.sub,
            sub_type=SubType.Key_Shared,
            transport=transport,
            key_shared_meta=meta,
            max_unacked_messages=self.params.max_unacked,
            track_pending_acks=True,
        )
        client = Client(
            name=name,
            consumer=consumer,
            transport=transport,
            queue_size=rng.choice((1, 2, 5, 10, 20)),
            ack_prob=rng.choice((0.2, 0.6, 1.0)),
            sticky_part=part,
        )
        self.note(
            f"join {client} queue={client.queue_size}"
            + (f" range={self.sticky_range(part)}" if part >= 0 else "")
        )
        self.sub.add_consumer(consumer)
        self.clients.append(client)
        self.live.append(client)
        self.by_consumer[id(consumer)] = client
        if rng.random() < 0.7:
            self.flow(client, client.queue_size)

    def sticky_range(self, part: int) -> tuple[int, int]:
        """The hash range of STICKY part ``part``."""
        size = 65536 // self.params.sticky_parts
        return (part * size, (part + 1) * size - 1)

    def free_sticky_parts(self) -> list[int]:
        """STICKY parts no live consumer covers."""
        taken = {c.sticky_part for c in self.live}
        return [i for i in range(self.params.sticky_parts) if i not in taken]

    def pick_live(self, pred: Callable[[Client], bool] | None = None) -> Client | None:
        """A random live client (satisfying ``pred``)."""
        cands = [c for c in self.live if pred is None or pred(c)]
        return self.rng.choice(cands) if cands else None

    def act_leave(self) -> None:
        """A consumer acks some of what it processed, then closes."""
        c = self.pick_live()
        assert c is not None
        if c.held and not c.paused:
            self.ack_some(c, self.rng.randint(0, len(c.held)))
        self.note(f"leave {c} holding {_ps(c.held)}")
        self.remove(c)

    def act_crash(self) -> None:
        """A consumer's connection drops: whatever it holds goes back."""
        c = self.pick_live()
        assert c is not None
        self.note(f"crash {c} holding {_ps(c.held)}")
        self.remove(c)

    def remove(self, c: Client) -> None:
        """The broker removes ``c`` (the client side first: nothing it holds counts any more)."""
        self.drop_client(c)
        self.sub.remove_consumer(c.consumer)

    def drop_client(self, c: Client) -> None:
        """The client model forgets ``c``'s session."""
        for pos in c.held:
            if self.holder.get(pos) is c:
                del self.holder[pos]
        c.drop_all()
        c.closed = True
        if c in self.live:
            self.live.remove(c)
        self.update_unacked_blocks(None)

    def act_ack(self) -> None:
        """A consumer acks some of what it holds, in any order."""
        c = self.pick_live(lambda c: bool(c.held) and not c.paused)
        assert c is not None
        x = self.rng.random()
        if c.blocked and x < c.ack_prob / 2:
            # Blocked on its unacked limit: half the time it acks all but a little more than
            # half the limit, where it must stay blocked (no extra draw: the stream is kept).
            n = max(1, len(c.held) - self.params.max_unacked // 2 - 1)
        else:
            n = len(c.held) if x < c.ack_prob else self.rng.randint(1, len(c.held))
        self.ack_some(c, n)

    def ack_some(self, c: Client, n: int) -> None:
        """``c`` acks ``n`` of its entries (random ones, random order), in one to three ACKs."""
        if n <= 0:
            return
        rng = self.rng
        chosen = rng.sample(sorted(c.held), n)
        while chosen:
            k = rng.randint(1, min(3, len(chosen)))
            batch, chosen = chosen[:k], chosen[k:]
            items = [self.ack_item(c, pos) for pos in batch]
            self.note(
                f"ack {c} "
                + " ".join(
                    f"{i.position}"
                    + (f"[{batch_ack.from_words(i.ack_set):b}]" if i.ack_set else "")
                    for i in items
                )
            )
            self.sub.acknowledge(c.consumer, False, items)
            self.after_ack(c, items)

    def ack_item(self, c: Client, pos: Position) -> AckItem:
        """The ACK id for ``pos``: the whole entry, or (for a batch, sometimes) some indexes."""
        rng = self.rng
        size = c.held[pos].size
        done = self.partial.get(pos, 0)
        if size > 1 and rng.random() < 0.4:
            todo = [i for i in range(size) if not done >> i & 1]
            pick = rng.sample(todo, rng.randint(1, len(todo)))
            new = 0
            for i in pick:
                new |= 1 << i
            # Either every index this client knows acked, or only the new ones (both occur on
            # the wire: Pulsar's ack grouping sends what accumulated since its last flush).
            cleared = new | done if rng.random() < 0.5 else new
            return AckItem(pos, batch_ack.to_words(batch_ack.full(size) & ~cleared) or [0])
        return AckItem(pos)

    def after_ack(self, c: Client, items: Sequence[AckItem]) -> None:
        """Update the model after an ACK and check the cursor agrees."""
        cursor = self.cursor
        for item in items:
            pos = item.position
            held = c.held.get(pos)
            if held is None:
                continue  # the same position twice in one command
            if item.ack_set is not None:
                bits = self.partial.get(pos, 0) | (
                    batch_ack.full(held.size) & ~batch_ack.from_words(item.ack_set)
                )
                if bits != batch_ack.full(held.size):
                    self.partial[pos] = bits
                    if cursor.is_acked(pos):
                        raise Violation(f"{pos}: partly acked ({bits:b}) but the cursor acked it")
                    got = cursor.get_ack_set(pos)
                    want = batch_ack.full(held.size) & ~bits
                    if got is None or batch_ack.from_words(got) != want:
                        raise Violation(f"{pos}: cursor ack set {got}, want unacked {want:b}")
                    continue
            self.partial.pop(pos, None)
            self.acked.add(pos)
            c.release(pos)
            self.holder.pop(pos, None)
            if not cursor.is_acked(pos):
                raise Violation(f"{pos} acked by {c} but the cursor does not have it acked")
        self.update_unacked_blocks(c)

    def act_nack(self) -> None:
        """A consumer negatively acks some (or all) of what it holds."""
        c = self.pick_live(lambda c: bool(c.held) and not c.paused)
        assert c is not None
        rng = self.rng
        positions: list[Position] | None
        if rng.random() < 0.25:
            positions = None
            chosen = sorted(c.held)
        else:
            chosen = rng.sample(sorted(c.held), rng.randint(1, len(c.held)))
            positions = chosen
        self.note(f"nack {c} {'ALL ' if positions is None else ''}{_ps(chosen, keep_order=True)}")
        for pos in chosen:
            c.release(pos)
            self.holder.pop(pos, None)
            self.nacked.add(pos)
        self.update_unacked_blocks(c)
        self.sub.redeliver_unacknowledged(c.consumer, positions)

    def act_flow(self) -> None:
        """A consumer asks for more (never beyond its receiver queue)."""
        c = self.pick_live(lambda c: not c.paused)
        assert c is not None
        self.flow(c, self.rng.randint(1, c.queue_size))

    def flow(self, c: Client, n: int) -> None:
        """FLOW ``n`` from ``c``, as the connection handles it."""
        consumer = c.consumer
        if consumer.available_permits + consumer.permits_while_blocked >= c.queue_size:
            return
        self.note(f"flow {c} +{n}")
        c.granted += n
        if consumer.add_permits(n):
            disp = self.sub.dispatcher
            if disp is not None:
                disp.consumer_flow(consumer, n)

    def act_pause(self) -> None:
        """A consumer stops (or resumes) acking and flowing."""
        c = self.pick_live()
        assert c is not None
        c.paused = not c.paused
        self.note(f"{'pause' if c.paused else 'resume'} {c}")

    def act_writable(self) -> None:
        """A consumer's connection fills its write buffer, or drains it."""
        c = self.pick_live()
        assert c is not None
        self.set_writable(c, not c.transport.writable)

    def set_writable(self, c: Client, writable: bool) -> None:
        """Flip ``c``'s connection, telling the dispatcher when it drains."""
        if c.transport.writable == writable:
            return
        c.transport.writable = writable
        self.note(f"{c} {'writable' if writable else 'NOT writable'}")
        if writable and self.sub.dispatcher is not None:
            self.sub.dispatcher.on_writable()

    def act_reset(self) -> None:
        """Reset-cursor to a published position (or the ends): every consumer is closed."""
        rng = self.rng
        r = rng.random()
        target = EARLIEST if r < 0.15 else LATEST if r < 0.3 else rng.choice(self.order)
        self.note(f"reset-cursor to {target}")
        self.sub.reset_cursor(target)
        if self.live:
            raise Violation(f"reset-cursor left consumers attached: {self.live}")
        mdp = self.cursor.mark_delete_position
        for pos in self.order:
            if pos <= mdp:
                if pos not in self.acked:
                    self.acked.add(pos)
                    if pos not in self.delivered:
                        self.skipped.add(pos)
            else:
                self.acked.discard(pos)
        self.partial.clear()
        self.nacked.clear()
        # A new epoch of the subscription: its first deliveries start afresh.
        self.first_max.clear()
        self.delivered = {p for p in self.delivered if p <= mdp}
        self.note(f"  -> mark-delete {mdp}, read {self.cursor.read_position}")

    # --- what the broker sends -----------------------------------------------------------------
    def on_broker_close(self, consumer: Consumer) -> None:
        """The broker closed a consumer (reset-cursor)."""
        c = self.by_consumer[id(consumer)]
        self.note(f"  broker closes {c}")
        self.drop_client(c)

    def on_messages(self, consumer: Consumer, messages: Sequence[OutboundMessage]) -> None:
        """The oracle's view of every MESSAGE the broker sends."""
        c = self.by_consumer[id(consumer)]
        if c.closed:
            raise Violation(f"entries {[m.entry.position for m in messages]} sent to closed {c}")
        if self._trace_on:
            self.note(f"  -> {c} gets {' '.join(self._describe(m) for m in messages)}")
        room = c.granted - c.entries_sent
        if len(messages) > room:
            raise Violation(
                f"{len(messages)} entries sent to {c} in one send with room for {room} "
                f"(FLOW granted {c.granted}, {c.entries_sent} entries sent before)"
            )
        c.entries_sent += len(messages)
        self.check_unacked_limits(c, messages)
        for m in messages:
            self.check_delivery(c, m)
        limit = self.params.max_unacked
        if limit > 0 and self.held_messages(c) >= limit:
            c.blocked = True

    # --- unacked limits ------------------------------------------------------------------------
    def held_messages(self, c: Client) -> int:
        """Messages ``c`` holds unacked: whole entries less the batch indexes acked one by one."""
        partial = self.partial
        return sum(
            h.size - (partial[p].bit_count() if p in partial else 0) for p, h in c.held.items()
        )

    def check_unacked_limits(self, c: Client, messages: Sequence[OutboundMessage]) -> None:
        """Nothing goes to a consumer, or a subscription, blocked on its unacked limit.

        A consumer is blocked from the send that brings it to maxUnackedMessagesPerConsumer
        until it holds half of it or less; the subscription from the step after which its
        consumers hold maxUnackedMessagesPerSubscription until they hold less than half."""
        if not (c.blocked or self.sub_blocked):
            return
        what = " ".join(str(m.entry.position) for m in messages)
        if c.blocked:
            raise Violation(
                f"unacked limit: {c} got {what} while blocked: it holds "
                f"{self.held_messages(c)} of maxUnackedMessagesPerConsumer="
                f"{self.params.max_unacked} and is unblocked at {self.params.max_unacked // 2}"
            )
        if self.sub_blocked:
            raise Violation(
                f"unacked limit: {c} got {what} while the subscription is blocked: its consumers "
                f"hold {sum(self.held_messages(x) for x in self.live)} of "
                f"maxUnackedMessagesPerSubscription={self.params.max_unacked_sub}"
            )

    def update_unacked_blocks(self, c: Client | None) -> None:
        """After messages left ``c`` (or a consumer): what they unblock."""
        limit = self.params.max_unacked
        if c is not None and c.blocked and self.held_messages(c) <= limit // 2:
            c.blocked = False
        sub_limit = self.params.max_unacked_sub
        if self.sub_blocked:
            total = sum(self.held_messages(x) for x in self.live)
            if total < sub_limit // 2 or total == 0:
                self.sub_blocked = False

    def _describe(self, m: OutboundMessage) -> str:
        pos = m.entry.position
        key = self.entries.get(pos, ("?", 0))[0]
        return f"{pos}/{key}" + ("*" if pos in self.nacked else "")

    def check_delivery(self, c: Client, m: OutboundMessage) -> None:
        """Every property a single delivery must keep."""
        pos = m.entry.position
        known = self.entries.get(pos)
        if known is None:
            raise Violation(f"{c} got {pos}, which was never published")
        key, size = known
        if pos in self.acked or self.cursor.is_acked(pos):
            raise Violation(f"{c} got {pos}, which is acked")
        owner = self.holder.get(pos)
        if owner is not None:
            raise Violation(f"{c} got {pos}, which {owner} holds unacked")
        if self.keyed:
            self.check_key_order(c, pos, key)
        if pos not in self.delivered:
            self.delivered.add(pos)
        else:
            self.redeliveries += 1
        self.nacked.discard(pos)
        done = self.partial.get(pos, 0)
        if size > 1:
            want = batch_ack.full(size) & ~done
            got = batch_ack.full(size) if m.ack_set is None else batch_ack.from_words(m.ack_set)
            if got != want:
                raise Violation(f"{pos} sent with unacked indexes {got:b}, want {want:b}")
        elif m.ack_set is not None:
            raise Violation(f"{pos} is not a batch but was sent with ack set {m.ack_set}")
        self.deliveries += 1
        c.given.add(pos)
        c.hold(pos, Held(key, size))
        self.holder[pos] = c

    def check_key_order(self, c: Client, pos: Position, key: str) -> None:
        """Exclusivity and per-key order of one delivery (before it is recorded)."""
        if self.params.classic:
            self.check_classic_restriction(c, pos)
        for other in self.live:
            if other is not c and other.key_counts.get(key):
                mine = sorted(p for p, h in other.held.items() if h.key == key)
                raise Violation(
                    f"exclusivity: {c} got {pos} of key {key} while {other} holds {mine} unacked"
                )
        last = c.max_seen.get(key)
        if last is not None and pos < last:
            if pos not in self.nacked and pos not in c.given:
                raise Violation(
                    f"order: {c} got {pos} of key {key} after {last}; {pos} is neither a "
                    "redelivery of what it had nor nacked"
                )
        else:
            c.max_seen[key] = pos
        if pos not in self.delivered:
            first = self.first_max.get(key)
            if first is not None and pos < first:
                raise Violation(
                    f"order: first delivery of {pos} of key {key} after {first} was delivered"
                )
            self.first_max[key] = pos

    def check_classic_restriction(self, c: Client, pos: Position) -> None:
        """Classic: a recently joined consumer gets nothing beyond its join position."""
        joined = cast("ClassicKeySharedDispatcher", self.sub.dispatcher).recently_joined
        limit = joined.get(c.consumer) if joined else None
        if limit is not None and pos > limit:
            raise Violation(
                f"classic: recently joined {c} got {pos} beyond its join position {limit}"
            )

    # --- after every step ----------------------------------------------------------------------
    def check_step(self) -> None:
        """Cheap whole-state checks."""
        owners: dict[str, Client] = {}
        for c in self.live:
            for key in c.key_counts if self.keyed else ():
                other = owners.get(key)
                if other is not None:
                    raise Violation(f"exclusivity: key {key} held by {other} and {c}")
                owners[key] = c
            pending = c.consumer.pending_acks
            assert pending is not None
            if pending.keys() != c.held.keys():
                raise Violation(
                    f"{c}: broker pending acks {sorted(pending)} but the client holds "
                    f"{sorted(c.held)}"
                )
            held = self.held_messages(c)
            if c.consumer.unacked_messages != held:
                raise Violation(
                    f"{c}: the broker counts {c.consumer.unacked_messages} unacked messages "
                    f"but the client holds {held}"
                )
        sub_limit = self.params.max_unacked_sub
        if sub_limit > 0 and not self.sub_blocked:
            self.sub_blocked = sum(self.held_messages(x) for x in self.live) >= sub_limit
        for exc in self.topic.read_errors:
            if not isinstance(exc, InjectedReadError):
                raise Violation(f"read failed with {exc!r}")

    # --- the end: everyone stays until everything is acked -------------------------------------
    def finish(self, limit: int = 20_000) -> None:
        """Stop churn; every consumer flows and acks; everything must get delivered and acked."""
        self.note("--- final phase: consumers stay, flow and ack everything ---")
        for c in list(self.live):
            c.paused = False
            self.set_writable(c, True)
        if not self.live:
            self.act_join()
        while self.params.mode == "STICKY" and self.free_sticky_parts():
            self.act_join()  # a hash range nobody covers is never delivered: cover them all
        loop = self.loop
        reader = self.reader
        for _ in range(limit):
            if loop.run_one():
                continue
            if reader.pending_reads:
                reader.complete(0)
                continue
            holders = [c for c in self.live if c.held]
            if holders:
                for c in holders:
                    self.ack_all(c)
                continue
            flowed = False
            for c in self.live:
                consumer = c.consumer
                if consumer.available_permits + consumer.permits_while_blocked < c.queue_size:
                    self.flow(c, c.queue_size)
                    flowed = True
            if flowed:
                continue
            if self.all_acked():
                break
            if loop.fire_next_timer():
                continue
            if self.config.dispatcherPauseOnAckStatePersistentEnabled:
                # PIP-299 stops normal reads while the ack holes exceed what can be persisted.
                # If every consumer left meanwhile, the entries in the holes are in no replay
                # queue any more and only a normal read could bring them back: delivery stays
                # stopped until an operator steps in (as in Pulsar). Do what they would.
                self.note("admin: dispatcherPauseOnAckStatePersistentEnabled=false")
                self.config.dispatcherPauseOnAckStatePersistentEnabled = False
                if self.sub.dispatcher is not None:
                    self.sub.dispatcher.read_more()
                continue
            raise self.fail("stuck: nothing left to run and not everything acked\n" + self.state())
        else:
            raise self.fail(f"not done after {limit} final steps\n" + self.state())
        # At rest: whatever is still queued or due must not deliver anything.
        for _ in range(200):
            if loop.run_one():
                continue
            if reader.pending_reads:
                reader.complete(0)
                continue
            if not loop.fire_next_timer():
                break
        self.check_end()

    def ack_all(self, c: Client) -> None:
        """``c`` acks everything it holds, whole entries, in position order."""
        items = [AckItem(pos) for pos in sorted(c.held)]
        self.note(f"ack {c} all {_ps(c.held)}")
        self.sub.acknowledge(c.consumer, False, items)
        self.after_ack(c, items)

    def all_acked(self) -> bool:
        """Whether the cursor acked every published entry."""
        lac = self.ledger.last_add_confirmed
        return lac.entry_id < 0 or self.cursor.mark_delete_position >= lac

    def check_end(self) -> None:
        """Liveness and clean state at rest."""
        self.check_step()
        if not self.all_acked():
            raise self.fail("not everything acked at rest\n" + self.state())
        missing = [p for p in self.order if p not in self.delivered and p not in self.skipped]
        if missing:
            raise self.fail(f"never delivered: {missing[:20]}")
        unacked = [p for p in self.order if p not in self.acked]
        if unacked:
            raise self.fail(f"the cursor acked these but no client did: {unacked[:20]}")
        disp = self.dispatcher
        if disp is not None:
            if len(disp.replay):
                raise self.fail(
                    f"replay queue not empty at rest: {list(disp.replay.iter_positions())}"
                )
            if disp.draining is not None and len(disp.draining):
                raise self.fail(f"hashes still draining at rest: {dict(disp.draining.items())}")
            disp.update_unacked_block()
            if disp.unacked_limit.blocked:
                raise self.fail("nothing is held but the subscription is blocked on unacked")
            if isinstance(disp, ClassicKeySharedDispatcher) and disp.recently_joined:
                # Everything is acked, every join position too: nobody may stay restricted.
                raise self.fail(f"classic: still recently joined at rest: {disp.recently_joined}")
        for c in self.live:
            if c.consumer.unacked_messages:
                raise self.fail(
                    f"{c} holds nothing but the broker counts "
                    f"{c.consumer.unacked_messages} unacked messages"
                )
            if c.consumer.blocked_on_unacked:
                raise self.fail(f"{c} holds nothing but is blocked on unacked messages")

    def state(self) -> str:
        """What the broker looks like, for a failure report."""
        disp = self.dispatcher
        lines = [
            f"cursor {self.cursor!r} lac={self.ledger.last_add_confirmed}",
            f"pending reads {self.reader.pending_reads} timers={self.loop.pending_timers()}",
        ]
        if disp is not None:
            lines.append(
                f"replay {list(disp.replay.iter_positions())[:30]} "
                f"pending_read={disp.have_pending_read} "
                f"pending_replay={disp.have_pending_replay_read}"
            )
            if disp.draining is not None:
                lines.append(f"draining {dict(disp.draining.items())}")
        for c in self.live:
            con = c.consumer
            lines.append(
                f"{c}: permits={con.available_permits} unacked={con.unacked_messages} "
                f"blocked={con.blocked_on_unacked} held={sorted(c.held)} "
                f"pending={sorted(con.pending_acks or {})}"
            )
        return "\n".join(lines)


def run_seed(seed: int, steps: int | None = None, *, trace: bool = True) -> Simulation:
    """Run one seed; raises :class:`SimFailure` if a property breaks."""
    return Simulation(seed, steps, trace=trace).run()


def shrink(seed: int) -> SimFailure | None:
    """The shortest failing prefix of a failing seed's schedule (None if the seed passes)."""
    try:
        run_seed(seed)
    except SimFailure as failure:
        best = failure
    else:
        return None
    lo, hi = 0, best.steps
    # A prefix that fails keeps failing with more steps only usually, so scan down linearly
    # from a bisection's answer to be sure it is minimal among the prefixes tried.
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        try:
            run_seed(seed, mid)
        except SimFailure as failure:
            best, hi = failure, mid
        else:
            lo = mid
    return best


def _ps(positions: Any, *, keep_order: bool = False) -> str:
    """Positions as ``[1:2 1:3]`` (sorted unless ``keep_order``)."""
    ps = list(positions) if keep_order else sorted(positions)
    return "[" + " ".join(str(p) for p in ps) + "]"
