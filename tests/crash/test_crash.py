"""SIGKILL the broker mid-load and restart it: nothing confirmed is lost, acks survive.

After every restart: each confirmed message is there with the same id, in the same order; a torn
tail never surfaces as a message; a durable subscription resumes at its persisted position with
its persisted ack holes.
"""

from __future__ import annotations

import contextlib
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pulsar
import pytest

from tests.broker_process import BrokerProcess
from tests.crash.audit import (
    LoadSpec,
    audit,
    crash_under_load,
    cursor_state,
    load_confirmed,
)
from tests.integration.conftest import make_client

pytestmark = [pytest.mark.crash, pytest.mark.timeout(120)]

# Cursor state is saved at most once a second (managedLedgerDefaultMarkDeleteRateLimit=1) and the
# broker flushes changed cursors every second: 2.5 s after the last ack, it is on disk.
PERSIST_WAIT = 2.5


def topics(n: int) -> list[str]:
    """``n`` fresh topic names."""
    tag = uuid.uuid4().hex[:8]
    return [f"persistent://public/default/crash-{tag}-{i}" for i in range(n)]


def spec_for(names: list[str], seed: int, tag: str, max_size: int) -> LoadSpec:
    """Two producers per topic, one batching and one not."""
    producers = [
        (t, f"{tag}-p{i}-{'batch' if b else 'single'}", b)
        for i, t in enumerate(names)
        for b in (True, False)
    ]
    return LoadSpec(producers=producers, seed=seed, max_size=max_size)


def append_after_restart(client: pulsar.Client, topic: str, last: tuple[int, int, int]) -> None:
    """A new producer appends after the recovered tail, under a larger id."""
    producer = client.create_producer(topic, batching_enabled=False)
    mid = producer.send(b"after-restart:0:")
    assert (mid.ledger_id(), mid.entry_id(), mid.batch_index()) > last
    producer.close()


def test_confirmed_messages_survive_sigkill_mid_load(
    crash_broker: BrokerProcess, crash_seed: int, tmp_path: Path
) -> None:
    rng = random.Random(crash_seed)
    names = topics(3)
    spec = spec_for(names, crash_seed, "a", max_size=4096)
    out = tmp_path / "confirmed.jsonl"
    n = crash_under_load(crash_broker, out, spec, rng, max_delay=1.5)
    confirmed = load_confirmed(out)
    assert len(confirmed) == n > 0
    client = make_client(crash_broker.service_url)
    try:
        read = audit(client, names, confirmed, crash_seed, spec.max_size)
        for topic in names:
            last = read[topic][-1].id if read[topic] else (-1, -1, -1)
            append_after_restart(client, topic, last)
    finally:
        client.close()
    print(f"confirmed {len(confirmed)}, stored {sum(len(v) for v in read.values())}")


# 17 rounds, each auditing every round before it: 60-75 s on a quiet 2-core machine, past 120 s
# once in a suite run on three workers.
@pytest.mark.timeout(300)
def test_repeated_sigkill_under_heavy_load_keeps_every_confirmed_message(
    crash_broker: BrokerProcess, crash_seed: int, crash_rounds: int, tmp_path: Path
) -> None:
    """Torn tails: big payloads, many kills, and after each kill the open ledger files get the
    partial write a crash mid-write leaves; each restart passes the audit of all rounds so far."""
    rng = random.Random(crash_seed)
    names = topics(2)
    confirmed = []
    for round_no in range(crash_rounds):
        spec = spec_for(names, crash_seed, f"r{round_no}", max_size=64 * 1024)
        out = tmp_path / f"round-{round_no}.jsonl"
        log_before = crash_broker.log().count("truncating")
        crash_under_load(crash_broker, out, spec, rng, max_delay=0.8, tear=len(names))
        confirmed.extend(load_confirmed(out))
        client = make_client(crash_broker.service_url)
        try:
            audit(client, names, confirmed, crash_seed, spec.max_size)
        finally:
            client.close()
        # Each torn ledger file was cut back when the restarted broker opened it.
        assert crash_broker.log().count("truncating") - log_before >= len(names)
    assert confirmed


def send_all(producer: pulsar.Producer, n: int) -> dict[int, pulsar.MessageId]:
    """Send ``m0``..``m{n-1}`` (keys ``k0``..``k12``) and return their confirmed ids."""
    ids: dict[int, pulsar.MessageId] = {}

    def confirmed(i: int) -> Callable[[pulsar.Result, pulsar.MessageId], None]:
        def done(res: pulsar.Result, mid: pulsar.MessageId) -> None:
            assert res == pulsar.Result.Ok, res
            ids[i] = mid

        return done

    for i in range(n):
        producer.send_async(f"m{i}".encode(), confirmed(i), partition_key=f"k{i % 13}")
    producer.flush()
    assert len(ids) == n
    return ids


def wait_backlog(broker: BrokerProcess, topic: str, sub: str, n: int) -> None:
    """Wait until the subscription's backlog is ``n``: every ack sent so far has arrived."""
    path = "/admin/v2/" + topic.replace("://", "/") + "/stats"
    deadline = time.monotonic() + 10
    while True:
        status, stats = broker.admin("GET", path)
        assert status == 200, stats
        backlog = stats["subscriptions"][sub]["msgBacklog"]
        if backlog == n:
            return
        assert time.monotonic() < deadline, f"backlog {backlog}, expected {n}"
        time.sleep(0.05)


def unacked_pattern(rng: random.Random, n: int) -> set[int]:
    """Which of ``n`` messages stay unacked: a seeded scatter of single holes and runs, never the
    first 10 (so that the mark-delete position moves) and always the last one."""
    holes = {i for i in range(10, n) if rng.random() < 0.15}
    start = rng.randrange(10, n - 20)
    holes.update(range(start, start + rng.randrange(2, 15)))
    holes.add(n - 1)
    return holes


SUB_TYPES = {
    "Shared": pulsar.ConsumerType.Shared,
    "KeyShared": pulsar.ConsumerType.KeyShared,
    "Exclusive": pulsar.ConsumerType.Exclusive,
}
N = 200


@dataclass
class AckCase:
    """One topic with a durable subscription, its messages and which of them get acked when."""

    name: str
    topic: str
    consumer_type: pulsar.ConsumerType
    unacked: set[int]
    late: set[int] = field(default_factory=set)
    """Acked just before the SIGKILL: may or may not have been persisted."""
    ids: dict[int, pulsar.MessageId] = field(default_factory=dict)
    before: dict[str, str] = field(default_factory=dict)

    def subscribe(self, client: pulsar.Client) -> pulsar.Consumer:
        return client.subscribe(
            self.topic,
            "durable",
            consumer_type=self.consumer_type,
            initial_position=pulsar.InitialPosition.Earliest,
            receiver_queue_size=1000,
        )


def drain_all(consumer: pulsar.Consumer, expected: int) -> dict[int, pulsar.MessageId]:
    """Receive until nothing more comes; every message at most once."""
    got: dict[int, pulsar.MessageId] = {}
    while True:
        try:
            msg = consumer.receive(timeout_millis=1000 if len(got) >= expected else 5000)
        except pulsar.Timeout:
            return got
        i = int(msg.data()[1:])
        assert i not in got, f"message {i} delivered twice"
        got[i] = msg.message_id()


def close_after_kill(client: pulsar.Client) -> None:
    """Close a client whose broker was just SIGKILLed: closing its consumers may find the
    connection gone (NotConnected), which is the point of the kill, not a failure."""
    with contextlib.suppress(pulsar.NotConnected, pulsar.AlreadyClosed):
        client.close()


def test_subscriptions_resume_at_persisted_position_with_ack_holes(
    crash_broker: BrokerProcess, crash_seed: int
) -> None:
    """Durable Shared, Key_Shared and Exclusive subscriptions ack with holes; once the acks are
    persisted the broker is SIGKILLed. After the restart each cursor has the same mark-delete
    position and ack holes, and redelivers exactly the unacked messages, under their ids. A
    fourth subscription also acks a batch just before the kill: those may come back (never the
    persisted ones), and nothing unacked is lost."""
    rng = random.Random(crash_seed)
    names = topics(4)
    cases = [
        AckCase(kind, topic, SUB_TYPES[kind], unacked_pattern(rng, N))
        for kind, topic in zip(SUB_TYPES, names, strict=False)
    ]
    late_case = AckCase(
        "Shared+late", names[3], pulsar.ConsumerType.Shared, unacked_pattern(rng, N)
    )
    late_case.late = {i for i in range(N // 2, N) if i not in late_case.unacked}
    cases.append(late_case)
    client = make_client(crash_broker.service_url)
    try:
        held = {}
        for case in cases:
            consumer = case.subscribe(client)
            case.ids = send_all(client.create_producer(case.topic, batching_enabled=False), N)
            for _ in range(N):
                msg = consumer.receive(timeout_millis=5000)
                i = int(msg.data()[1:])
                assert msg.message_id() == case.ids[i]
                if i not in case.unacked and i not in case.late:
                    consumer.acknowledge(msg)
                elif i in case.late:
                    held[i] = msg
            wait_backlog(crash_broker, case.topic, "durable", len(case.unacked) + len(case.late))
            if case is late_case:
                late_consumer = consumer
        # Every ack has arrived; now long enough for all of it to be persisted.
        time.sleep(PERSIST_WAIT)
        for case in cases:
            case.before = cursor_state(crash_broker, case.topic, "durable")
            first_hole = case.ids[min(case.unacked | case.late) - 1]
            assert case.before["markDeletePosition"] == (
                f"{first_hole.ledger_id()}:{first_hole.entry_id()}"
            ), case.name
        for i in sorted(late_case.late):
            late_consumer.acknowledge(held[i])
        time.sleep(rng.uniform(0.0, 0.3))
        # SIGKILL with the consumers still connected, as in a real crash.
        crash_broker.kill()
    finally:
        close_after_kill(client)
    crash_broker.start(same_ports=True)

    client = make_client(crash_broker.service_url)
    try:
        for case in cases:
            if not case.late:
                assert cursor_state(crash_broker, case.topic, "durable") == case.before, case.name
            got = drain_all(case.subscribe(client), len(case.unacked))
            redelivered = set(got)
            assert case.unacked <= redelivered, (case.name, sorted(case.unacked - redelivered))
            assert redelivered <= case.unacked | case.late, (
                case.name,
                "acked and persisted, yet redelivered:",
                sorted(redelivered - case.unacked - case.late),
            )
            if not case.late:
                assert redelivered == case.unacked, case.name
            assert all(got[i] == case.ids[i] for i in got), case.name
            if case.consumer_type == pulsar.ConsumerType.Exclusive:
                assert list(got) == sorted(got), case.name
    finally:
        client.close()


def acked_runs(acked: set[int], start: int, n: int) -> list[list[int]]:
    """Maximal runs of consecutive acked message numbers from ``start`` on."""
    runs: list[list[int]] = []
    for i in range(start, n):
        if i in acked:
            if runs and runs[-1][-1] == i - 1:
                runs[-1].append(i)
            else:
                runs.append([i])
    return runs


MAX_RANGES = 5


@pytest.mark.parametrize(
    "crash_broker", [{"managedLedgerMaxUnackedRangesToPersist": MAX_RANGES}], indirect=True
)
def test_ack_ranges_beyond_the_persist_limit_are_redelivered_after_sigkill(
    crash_broker: BrokerProcess, crash_seed: int
) -> None:
    """Only the first managedLedgerMaxUnackedRangesToPersist ack ranges are saved (PIP-299): after
    a crash the acks beyond them come back as duplicates, and nothing else does or is lost."""
    rng = random.Random(crash_seed)
    case = AckCase("Shared", topics(1)[0], pulsar.ConsumerType.Shared, unacked_pattern(rng, N))
    first_hole = min(case.unacked)
    runs = acked_runs(set(range(N)) - case.unacked, first_hole, N)
    assert len(runs) > MAX_RANGES
    lost_acks = {i for run in runs[MAX_RANGES:] for i in run}
    client = make_client(crash_broker.service_url)
    try:
        consumer = case.subscribe(client)
        case.ids = send_all(client.create_producer(case.topic, batching_enabled=False), N)
        for _ in range(N):
            msg = consumer.receive(timeout_millis=5000)
            if int(msg.data()[1:]) not in case.unacked:
                consumer.acknowledge(msg)
        wait_backlog(crash_broker, case.topic, "durable", len(case.unacked))
        time.sleep(PERSIST_WAIT)
        before = cursor_state(crash_broker, case.topic, "durable")
        crash_broker.kill()
    finally:
        close_after_kill(client)
    crash_broker.start(same_ports=True)
    after = cursor_state(crash_broker, case.topic, "durable")
    assert after["markDeletePosition"] == before["markDeletePosition"]
    kept = before["individuallyDeletedMessages"].strip("[]").split(", ")[:MAX_RANGES]
    assert after["individuallyDeletedMessages"] == "[" + ", ".join(kept) + "]"
    client = make_client(crash_broker.service_url)
    try:
        got = drain_all(case.subscribe(client), len(case.unacked) + len(lost_acks))
        assert set(got) == case.unacked | lost_acks, (
            f"unexpected: {sorted(set(got) - case.unacked - lost_acks)}, "
            f"missing: {sorted((case.unacked | lost_acks) - set(got))}"
        )
        assert all(got[i] == case.ids[i] for i in got)
    finally:
        client.close()
