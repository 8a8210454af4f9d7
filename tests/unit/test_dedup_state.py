"""Deduplication decisions against a model: producers, key-based batches, reconnects, restarts.

A RuleBasedStateMachine drives the broker's pure publish path (``DedupState`` for the decision,
``ReceiptQueue`` for the answers' order) with a model of the official C++ client: key-based
batching (one batch per key, flushed together, sent in order of their first sequence id),
explicit sequence ids with gaps, chunked messages, a pending queue resent in full after every
reconnect, and the client's receipt check (a receipt for a later send than the oldest pending
one is a protocol error). The "ledger" completes writes in order, can fail all writes in flight,
and a restart keeps a random prefix of them; deduplication state is then rebuilt from the last
snapshot (through JSON) plus a replay of the real entry bytes after it, as recovery does.

After every step: no message is stored twice, every confirmed message is stored, a duplicate's
receipt names an entry that holds the message, and no receipt ever arrives early. At the end
everything pending is settled (reconnect, complete all writes) and every message not given up
is stored exactly once. A failing run prints a blob that replays it exactly.
"""

from __future__ import annotations

import json
import zlib
from collections import deque
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from keyshared.broker.dedup import DUPLICATE, NEW, DedupState
from keyshared.broker.sequence_ids import SendIds, SequenceRanges, send_ids
from keyshared.protocol import encode_payload_section, pb
from keyshared.protocol.metadata import encode_batch
from keyshared.server.publish import Answer, ReceiptQueue
from keyshared.storage.position import Position

KEYS = ["a", "b", "c"]
NAMES = ["p0", "p1"]


# --- entries as the official client builds them -----------------------------------------


def batch_entry(
    name: str, seqs: list[int], keys: list[str], *, compress: bool = False, encrypted: bool = False
) -> bytes:
    """A batch entry: metadata sequence_id = the first message's, as the C++ client >= 4.1."""
    md = pb.MessageMetadata(
        producer_name=name, sequence_id=seqs[0], publish_time=1, num_messages_in_batch=len(seqs)
    )
    body = encode_batch(
        (pb.SingleMessageMetadata(sequence_id=s, partition_key=k), f"{name}-{s}".encode())
        for s, k in zip(seqs, keys, strict=True)
    )
    if compress:
        md.compression = pb.ZLIB
        md.uncompressed_size = len(body)
        body = zlib.compress(body)
    if encrypted:
        md.encryption_keys.add(key="k", value=b"v")
    return encode_payload_section(md, body)


def single_entry(name: str, seq: int) -> bytes:
    md = pb.MessageMetadata(producer_name=name, sequence_id=seq, publish_time=1)
    return encode_payload_section(md, f"{name}-{seq}".encode())


def chunk_entry(name: str, seq: int, chunk_id: int, num_chunks: int) -> bytes:
    md = pb.MessageMetadata(
        producer_name=name,
        sequence_id=seq,
        publish_time=1,
        uuid=f"{name}-{seq}",
        chunk_id=chunk_id,
        num_chunks_from_msg=num_chunks,
        total_chunk_msg_size=num_chunks,
    )
    return encode_payload_section(md, b"x")


# --- the model ----------------------------------------------------------------------------


@dataclass
class Op:
    """A client's pending send (its OpSendMsg)."""

    first: int
    count: int
    seqs: tuple[int, ...]
    data: bytes
    chunk: tuple[int, int] | None = None


@dataclass
class Client:
    name: str
    next_seq: int = 0
    batches: dict[str, list[int]] = field(default_factory=dict)
    pending: deque[Op] = field(default_factory=deque)
    conn: int = 0
    connected: bool = True
    queue: ReceiptQueue = field(default_factory=ReceiptQueue)
    confirmed: set[int] = field(default_factory=set)
    assigned: set[int] = field(default_factory=set)
    given_up: set[int] = field(default_factory=set)
    chunks_done: dict[int, set[int]] = field(default_factory=dict)


@dataclass
class Write:
    token: int
    name: str
    send: SendIds
    data: bytes
    seqs: tuple[int, ...]


class DedupMachine(RuleBasedStateMachine):
    """Broker publish path (pure parts) + client model + ordered ledger."""

    MAX_RANGES = 1 << 20

    def __init__(self) -> None:
        super().__init__()
        self.state: DedupState[int] = DedupState(self.MAX_RANGES)
        self.clients = {n: Client(n) for n in NAMES}
        self.ledger: list[tuple[str, tuple[int, ...], bytes]] = []
        self.in_flight: deque[Write] = deque()
        self.waiters: dict[int, list[tuple[set[int], object]]] = {}
        self.done_tokens: dict[int, bool] = {}
        self.next_token = 0
        self.snapshot: tuple[str, int] | None = None
        self.stored: dict[tuple[str, int], int] = {}
        self.stored_chunks: dict[tuple[str, int, int], int] = {}
        self.num_chunks: dict[tuple[str, int], int] = {}
        self.may_duplicate: set[tuple[str, int]] = set()
        self.problems: list[str] = []

    # --- broker side -----------------------------------------------------------------------
    def broker_receive(self, client: Client, op: Op) -> None:
        conn = client.conn
        queue = client.queue
        slot = queue.reserve(op.first, op.first)
        send = send_ids(op.data)

        def emit(answer: Answer) -> None:
            if client.connected and client.conn == conn:
                self.client_answer(client, answer)

        decision = self.state.check(client.name, send)
        if decision.kind == NEW:
            # An entry holding a message below the floor (past the bound) is stored whole:
            # its other messages may be stored twice too, never lost.
            if any(self.state.is_persisted(client.name, i) is None for i in send.ids):
                self.may_duplicate.update((client.name, i) for i in op.seqs)
            token = self.next_token
            self.next_token += 1
            self.state.pushed(client.name, send, token)
            self.in_flight.append(Write(token, client.name, send, op.data, op.seqs))
            self.waiters[token] = [
                ({token}, lambda ok, pos: self._answer(queue, slot, emit, ok, pos))
            ]
            return
        if decision.kind == DUPLICATE:
            slot.position = decision.position or Position(-1, -1)
            queue.resolve(slot, emit)
            return
        tokens = set(decision.waits)
        assert tokens

        def after(ok: bool, _: Position | None) -> None:
            pos = self.state.original(client.name, send) if ok else None
            self._answer(queue, slot, emit, ok, pos or (Position(-1, -1) if ok else None))

        for t in tokens:
            self.waiters.setdefault(t, []).append((tokens, after))

    @staticmethod
    def _answer(
        queue: ReceiptQueue, slot: Answer, emit: object, ok: bool, pos: Position | None
    ) -> None:
        if ok:
            slot.position = pos
        else:
            slot.message = "Store failed"
        queue.resolve(slot, emit)  # type: ignore[arg-type]

    def end_write(self, w: Write, ok: bool) -> None:
        self.done_tokens[w.token] = ok
        if ok:
            pos = Position(1, len(self.ledger))
            self.ledger.append((w.name, w.seqs, w.data))
            if w.send.chunk is None:
                for i in w.seqs:
                    self.stored[(w.name, i)] = self.stored.get((w.name, i), 0) + 1
            else:
                key = (w.name, w.send.first, w.send.chunk[0])
                self.stored_chunks[key] = self.stored_chunks.get(key, 0) + 1
            self.state.persisted(w.name, w.send, pos, w.token)
        else:
            pos = None
            self.state.failed(w.name, w.send, w.token)
        for tokens, cb in self.waiters.pop(w.token, []):
            if all(t in self.done_tokens for t in tokens):
                all_ok = all(self.done_tokens[t] for t in tokens)
                cb(all_ok, pos)  # type: ignore[operator]

    # --- client side -----------------------------------------------------------------------
    def client_answer(self, client: Client, answer: Answer) -> None:
        if answer.position is None:
            client.connected = False  # any non-checksum send error: reconnect and resend
            return
        if not client.pending:
            # Legitimate only for a send the client gave up on (the client ignores it).
            if not client.given_up:
                self.problems.append(f"{client.name}: receipt {answer.sequence_id}, none pending")
            return
        op = client.pending[0]
        if answer.sequence_id > op.first + op.count - 1:
            self.problems.append(
                f"{client.name}: Got ack for msg {answer.sequence_id} expecting last: "
                f"{op.first + op.count - 1}"
            )
            client.connected = False
            return
        if answer.sequence_id < op.first:
            if not client.given_up:
                self.problems.append(f"{client.name}: stale receipt {answer.sequence_id}")
            return
        pos = answer.position
        if pos != Position(-1, -1):
            name, seqs, _ = self.ledger[pos.entry_id]
            if name != client.name or op.first not in seqs:
                self.problems.append(f"{client.name}: receipt for {op.first} names entry {pos}")
        client.pending.popleft()
        if op.chunk is None:
            client.confirmed.update(op.seqs)
        else:
            done = client.chunks_done.setdefault(op.first, set())
            done.add(op.chunk[0])
            if len(done) == op.chunk[1]:
                client.confirmed.add(op.first)

    def send_op(self, client: Client, op: Op) -> None:
        client.pending.append(op)
        if client.connected:
            self.broker_receive(client, op)

    def reconnect_client(self, client: Client) -> None:
        client.conn += 1
        client.connected = True
        client.queue = ReceiptQueue()
        for op in list(client.pending):
            self.broker_receive(client, op)

    def flush_client(self, client: Client, compress: bool, encrypted: bool) -> None:
        ops = []
        for key, seqs in client.batches.items():
            if not seqs:
                continue
            if len(seqs) == 1:
                data = single_entry(client.name, seqs[0])
            else:
                keys = [key] * len(seqs)
                data = batch_entry(client.name, seqs, keys, compress=compress, encrypted=encrypted)
            ops.append(Op(seqs[0], len(seqs), tuple(seqs), data))
        client.batches = {}
        for op in sorted(ops, key=lambda o: o.first):
            self.send_op(client, op)

    # --- rules -----------------------------------------------------------------------------
    @rule(
        name=st.sampled_from(NAMES),
        key=st.sampled_from(KEYS),
        n=st.integers(1, 4),
        gap=st.sampled_from([0, 0, 0, 1, 5]),
    )
    def add_messages(self, name: str, key: str, n: int, gap: int) -> None:
        client = self.clients[name]
        for _ in range(n):
            seq = client.next_seq + gap
            client.next_seq = seq + 1
            client.assigned.add(seq)
            client.batches.setdefault(key, []).append(seq)

    @rule(name=st.sampled_from(NAMES), compress=st.booleans(), encrypted=st.booleans())
    def flush(self, name: str, compress: bool, encrypted: bool) -> None:
        self.flush_client(self.clients[name], compress, encrypted)

    @rule(name=st.sampled_from(NAMES), num_chunks=st.integers(2, 3))
    def send_chunked(self, name: str, num_chunks: int) -> None:
        client = self.clients[name]
        self.flush_client(client, False, False)
        seq = client.next_seq
        client.next_seq += 1
        client.assigned.add(seq)
        self.num_chunks[(name, seq)] = num_chunks
        for c in range(num_chunks):
            data = chunk_entry(name, seq, c, num_chunks)
            self.send_op(client, Op(seq, 1, (seq,), data, (c, num_chunks)))

    @rule(n=st.integers(1, 5))
    def complete_writes(self, n: int) -> None:
        for _ in range(min(n, len(self.in_flight))):
            self.end_write(self.in_flight.popleft(), True)

    @precondition(lambda self: bool(self.in_flight))
    @rule()
    def fail_writes(self) -> None:
        while self.in_flight:
            self.end_write(self.in_flight.popleft(), False)

    @rule(name=st.sampled_from(NAMES))
    def reconnect(self, name: str) -> None:
        self.reconnect_client(self.clients[name])

    @rule(name=st.sampled_from(NAMES))
    def give_up(self, name: str) -> None:
        """The client times its pending sends out (they may or may not be stored)."""
        client = self.clients[name]
        for op in client.pending:
            if op.chunk is None:
                client.given_up.update(op.seqs)
            else:
                client.given_up.add(op.first)
        client.pending.clear()

    @rule()
    def take_snapshot(self) -> None:
        # Writes complete in order here, so every ledger entry has been recorded.
        self.snapshot = (json.dumps(self.state.to_json()), len(self.ledger))

    @rule(keep=st.integers(0, 5))
    def restart(self, keep: int) -> None:
        """SIGKILL: a prefix of the writes in flight reached the disk, answers are lost."""
        survivors = [self.in_flight.popleft() for _ in range(min(keep, len(self.in_flight)))]
        self.in_flight.clear()
        self.waiters.clear()
        for c in self.clients.values():
            c.connected = False
        for w in survivors:
            self.end_write(w, True)
        self.state = DedupState(self.MAX_RANGES)
        start = 0
        if self.snapshot is not None:
            blob, start = self.snapshot
            self.state.load_json(json.loads(blob))
        for index in range(start, len(self.ledger)):
            name, _, data = self.ledger[index]
            self.state.persisted(name, send_ids(data), Position(1, index))
        for c in self.clients.values():
            self.reconnect_client(c)

    # --- invariants ------------------------------------------------------------------------
    @invariant()
    def no_protocol_errors(self) -> None:
        assert not self.problems, self.problems

    def copies(self, name: str, seq: int) -> int:
        """How many times the message is stored (a chunked one: its least stored chunk)."""
        n = self.num_chunks.get((name, seq))
        if n is None:
            return self.stored.get((name, seq), 0)
        return min(self.stored_chunks.get((name, seq, c), 0) for c in range(n))

    @invariant()
    def nothing_stored_twice(self) -> None:
        for key, count in [*self.stored.items(), *self.stored_chunks.items()]:
            if count > 1:
                assert key[:2] in self.may_duplicate, f"{key} stored {count} times"

    @invariant()
    def confirmed_are_stored(self) -> None:
        for c in self.clients.values():
            for seq in c.confirmed:
                assert self.copies(c.name, seq) >= 1, (c.name, seq)

    def teardown(self) -> None:
        # Settle: reconnect, flush and complete writes until nothing is pending.
        for _ in range(20):
            if (
                not any(c.pending or c.batches for c in self.clients.values())
                and not self.in_flight
            ):
                break
            for c in self.clients.values():
                self.flush_client(c, False, False)
                if not c.connected:
                    self.reconnect_client(c)
            while self.in_flight:
                self.end_write(self.in_flight.popleft(), True)
        assert not self.problems, self.problems
        for c in self.clients.values():
            assert not c.pending, (c.name, c.pending)
            # Every message is confirmed, or was given up by its client (stored or not).
            assert c.assigned == c.confirmed | c.given_up
            for seq in c.confirmed:
                assert self.copies(c.name, seq) >= 1, (c.name, seq)
        self.nothing_stored_twice()


class BoundedDedupMachine(DedupMachine):
    """The same with two ranges per producer: past the bound, ids below the floor are stored
    again if resent (a duplicate allowed only there), and still nothing is lost."""

    MAX_RANGES = 2


MACHINE_SETTINGS = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)

TestDedupMachine = DedupMachine.TestCase
TestDedupMachine.settings = MACHINE_SETTINGS
TestBoundedDedupMachine = BoundedDedupMachine.TestCase
TestBoundedDedupMachine.settings = MACHINE_SETTINGS


# --- pieces -------------------------------------------------------------------------------


@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 6)), max_size=30))
def test_sequence_ranges_match_a_set(runs: list[tuple[int, int]]) -> None:
    ranges = SequenceRanges()
    model: set[int] = set()
    for first, length in runs:
        ranges.add_run(first, first + length)
        model.update(range(first, first + length + 1))
        b = ranges.bounds
        assert all(b[k] < b[k + 1] for k in range(len(b) - 1))
    for i in range(-2, 70):
        assert (i in ranges) == (i in model), i
    # Coalesced: no two ranges touch.
    assert all(ranges.bounds[k] < ranges.bounds[k + 1] for k in range(1, len(ranges.bounds) - 1, 2))


def test_key_based_batch_ids_are_read_from_the_batch() -> None:
    data = batch_entry("p", [3, 19, 35], ["k", "k", "k"])
    ids = send_ids(data)
    assert ids.first == 3 and ids.ids == (3, 19, 35) and ids.complete
    compressed = send_ids(batch_entry("p", [4, 20], ["k", "k"], compress=True))
    assert compressed.ids == (4, 20)


def test_encrypted_batch_tracks_only_what_the_metadata_says() -> None:
    ids = send_ids(batch_entry("p", [3, 19, 35], ["k"] * 3, encrypted=True))
    assert ids.ids == (3,) and not ids.complete


def test_unreadable_batch_body_tracks_only_the_ends_the_metadata_names() -> None:
    md = pb.MessageMetadata(
        producer_name="p", sequence_id=10, publish_time=1, num_messages_in_batch=3
    )
    md.highest_sequence_id = 12
    ids = send_ids(encode_payload_section(md, b"not a batch body"))
    assert ids.ids == (10, 12) and not ids.complete
    # A hostile message count costs nothing.
    md.num_messages_in_batch = 1 << 30
    assert send_ids(encode_payload_section(md, b"\0" * 64)).ids == (10, 12)


def test_interleaved_key_batches_are_not_duplicates() -> None:
    """apache/pulsar#15413: key b's batch (1, 2) goes out after key a's (0, 3), all its ids
    below the highest one already pushed; it is new, and a resend of either is a duplicate."""
    state: DedupState[int] = DedupState()
    first = send_ids(batch_entry("p", [0, 3], ["a"] * 2))
    second = send_ids(batch_entry("p", [1, 2], ["b"] * 2))
    assert state.check("p", first).kind == NEW
    state.pushed("p", first, 1)
    assert state.check("p", second).kind == NEW
    state.pushed("p", second, 2)
    resent = state.check("p", first)
    assert resent.kind == "wait" and resent.waits == (1,)
    state.persisted("p", first, Position(1, 0), 1)
    state.persisted("p", second, Position(1, 1), 2)
    again = state.check("p", second)
    assert again.kind == DUPLICATE and again.position == Position(1, 1)
    assert state.last_sequence_id("p") == 3
    assert len(state.producers["p"].persisted) == 1


def test_past_the_bound_an_old_id_is_stored_not_dropped() -> None:
    state: DedupState[int] = DedupState(max_ranges=2)
    for i, seq in enumerate([0, 10, 20, 30]):
        send = SendIds(seq, (seq,))
        state.persisted("p", send, Position(1, i))
    assert len(state.producers["p"].persisted) == 2
    assert state.check("p", SendIds(0, (0,))).kind == NEW
    assert state.check("p", SendIds(30, (30,))).kind == DUPLICATE
    assert state.duplicates_maybe_stored == 1


def test_version_1_snapshot_is_read_conservatively() -> None:
    state: DedupState[int] = DedupState()
    state.load_json({"p": 9})
    assert state.last_sequence_id("p") == 9
    assert state.check("p", SendIds(5, (5,))).kind == NEW
    assert state.check("p", SendIds(10, (10,))).kind == NEW


@pytest.mark.parametrize("n", [1, 100, 10_000])
def test_state_size_of_a_contiguous_producer_stays_one_range(n: int) -> None:
    state: DedupState[int] = DedupState()
    for i in range(0, n, 16):
        # Key-based batches flushed out of id order within each window of 16.
        for k in (1, 0):
            ids = tuple(range(i + k, min(i + 16, n), 2))
            if ids:
                state.persisted("p", SendIds(ids[0], ids), Position(1, i + k))
    assert len(state.producers["p"].persisted) == 1
    assert len(json.dumps(state.to_json())) < 100
