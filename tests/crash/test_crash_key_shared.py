"""SIGKILL the broker while Key_Shared consumers consume and ack with holes (issue 6, point 10).

Load: a topic and a two-partition topic; on each, one producer with key-based batching and one
without publish over six hot keys for the whole test, their send timeout off, so that the
official client resends what was pending once it has reconnected. One durable Key_Shared
subscription per topic partition (three cursors), consumed by two or three consumers of
different speeds that ack most messages at once and hold some unacked for up to 3 s (holes,
acked later); some close and subscribe again under the same name now and then. On the plain
topic the consumers ack batch indexes one by one (``batch_index_ack_enabled``), so partially
acked batches are persisted too; on the partitioned topic (consumed partition by partition: a
multi-topic consumer keeps its own receiver queue across a reconnect) they ack whole entries.
Each consumer feeds a :class:`tests.ordering.ConsumptionRecorder`. The test runs once per
Key_Shared dispatcher. (On the classic one this test found a key split between a consumer that
subscribed again and one that took its replays meanwhile, even with no crash at all; the classic
dispatcher now holds a moved hash back until its old holder's entries are acked or handed back.)

Crash rounds (``CRASH_KS_ROUNDS``, default 4, per dispatcher: 8 kills here, 28 in ``make test``
with test_crash.py's 20): after a seeded random while (0.4-2 s), the broker is SIGKILLed with
everything running. Then the consumer loops pause (until then they may still take messages out
of the client's queue and ack them, as applications do), whatever they held unacked is
forgotten (released in the recorder, as for a closed consumer: the broker redelivers it), and
the broker is restarted on the same ports and data directory; once every consumer has
reconnected (the client clears its receiver queue when it subscribes again) the loops go on.
``CRASH_SEED`` replays the choices (delays, holds, rejoins, kill moments), not thread timing.

What was persisted: read from the data directory while the broker is down, with SQLite read
only: the cursor snapshots under ``cursors/<topic>/<subscription>`` (mark-delete position, ack
ranges, batch bitsets), decoded with the broker's own codec. That is exactly what the restarted
broker starts from (``ManagedCursor._restore``), and nothing can move it between the kill and
the read. The admin internalStats after the restart are not a sound source: the clients
reconnect and ack at once, so a read may already include new acks, and they do not show batch
bitsets. They serve as a per-round cross-check only: the restarted cursor's mark-delete
position is never before the persisted one.

Audits at the end:

* nothing lost: every confirmed message was delivered and acked, and every subscription's
  backlog drains to zero;
* per key: no two consumers hold it at once, first deliveries come in id order, per consumer
  and across consumers (redeliveries apart): :func:`tests.ordering.check`, duplicates allowed;
* redeliveries only of messages whose ack was not persisted
  (:func:`tests.crash.key_shared_load.audit_crashes`): a message (batch index) persisted as
  acked at a kill is never delivered after that restart; persisted acks were made by a
  consumer before the kill and never go back; a message is never delivered again while held,
  nor after its ack reached the same broker lifetime.

``test_key_shared_audit.py`` shows these rules flag fabricated violations; a broker whose
cursor restore drops the persisted ack ranges, or skips the first unacked entry, fails here.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections.abc import Callable

import pytest

from tests.broker_process import BrokerProcess
from tests.crash.key_shared_load import (
    ConsumerSpec,
    Crash,
    CrashWorker,
    KeyedProducer,
    audit_crashes,
    read_persisted_acks,
)
from tests.integration.conftest import make_client
from tests.integration.key_shared.helpers import parse_position
from tests.ordering import ConsumptionRecorder, check

pytestmark = [pytest.mark.crash, pytest.mark.timeout(120)]

SUB = "ks-crash"
KEYS = [f"hot-{i}" for i in range(6)]
PARTITIONS = 2
RATE = 120.0
"""Messages a second per producer (four producers)."""

CONSUMERS = {
    "plain": [
        ConsumerSpec("fast", delay=0.0005, hold_p=0.06, hold_s=(0.1, 0.8), rejoin_p=0.002),
        ConsumerSpec("slow", delay=0.004, hold_p=0.12, hold_s=(0.3, 3.0), queue=20),
        ConsumerSpec("mid", delay=0.001, hold_p=0.08, hold_s=(0.1, 2.0), rejoin_p=0.004),
    ],
    "part": [
        ConsumerSpec("fast", delay=0.0005, hold_p=0.08, hold_s=(0.1, 1.0), rejoin_p=0.003),
        ConsumerSpec("slow", delay=0.003, hold_p=0.12, hold_s=(0.2, 3.0), queue=20),
    ],
}


CLASSIC = {"subscriptionKeySharedUseClassicPersistentImplementation": "true"}


def ks_rounds() -> int:
    """Kill/restart rounds of this test (CRASH_KS_ROUNDS, default 4)."""
    return int(os.environ.get("CRASH_KS_ROUNDS", "4"))


def admin_path(topic: str) -> str:
    return "/admin/v2/" + topic.replace("://", "/")


def wait_for(
    pred: Callable[[], bool], timeout: float, what: str, why: Callable[[], str] = str
) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what} {why()}"
        time.sleep(0.05)


def backlog(broker: BrokerProcess, topic: str) -> int:
    status, stats = broker.admin("GET", admin_path(topic) + "/stats")
    assert status == 200, stats
    return int(stats["subscriptions"][SUB]["msgBacklog"])


def missing_report(recorder: ConsumptionRecorder, workers: list[CrashWorker]) -> str:
    """The expected messages not acked yet, with their deliveries, and the workers' state."""
    missing = recorder.missing()
    by_pos: dict[tuple[str, object], list[str]] = {}
    for d in recorder.deliveries():
        by_pos.setdefault((d.topic, d.pos), []).append(str(d))
    lines = [f"{len(missing)} missing:"]
    lines += [f"  {p} on {t}: {by_pos.get((t, p), 'never delivered')}" for t, p in missing[:10]]
    lines += [
        f"  {w.label} on {w.topic[-20:]}: received {w.received}, acked {w.acked}, "
        f"held {len(w.held)}, connected {w.consumer.is_connected()}"
        for w in workers
    ]
    return "\n".join(lines)


def wait_consumed(recorder: ConsumptionRecorder, workers: list[CrashWorker]) -> None:
    """Until every confirmed message is acked; fails after 5 s without a receive (a message
    lost for good) or 40 s in all."""
    deadline = time.monotonic() + 40
    while recorder.missing():
        now = time.monotonic()
        stalled = all(now - w.last_receive > 5 for w in workers)
        assert now < deadline and not stalled, "confirmed messages never acked: " + missing_report(
            recorder, workers
        )
        time.sleep(0.1)


def crash(
    broker: BrokerProcess,
    workers: list[CrashWorker],
    recorder: ConsumptionRecorder,
    rejoin_lock: threading.Lock,
    topics: list[str],
) -> Crash:
    """SIGKILL with everything running; record what was persisted; restart; resume."""
    with rejoin_lock:  # no consumer is between close and subscribe
        killed_at = recorder.now()
        broker.kill()
        for w in workers:
            w.pause()
        released = recorder.now()
        for w in workers:
            w.drop_held(released)
        acks = read_persisted_acks(broker.data_dir, topics, SUB)
        restart_at = recorder.now()
        broker.start(same_ports=True)
        wait_for(
            lambda: all(w.consumer.is_connected() for w in workers), 30, "consumers to reconnect"
        )
        # The client clears its receiver queue right after it turns connected.
        time.sleep(0.2)
        for topic in topics:
            status, stats = broker.admin("GET", admin_path(topic) + "/internalStats")
            assert status == 200, stats
            mdp = parse_position(stats["cursors"][SUB]["markDeletePosition"])
            assert mdp >= tuple(acks[topic].mark_delete), (topic, mdp, acks[topic].describe())
        for w in workers:
            w.resume()
    print(
        f"killed@{killed_at:.4f} released@{released:.4f} restart@{restart_at:.4f} "
        f"resumed@{recorder.now():.4f}"
    )
    return Crash(killed_at, restart_at, acks)


@pytest.mark.parametrize(
    "crash_broker",
    [
        pytest.param({}, id="pip379"),
        pytest.param(
            CLASSIC,
            id="classic",
            marks=pytest.mark.classic,
        ),
    ],
    indirect=True,
)
def test_key_shared_consumers_acking_with_holes_survive_sigkills(
    crash_broker: BrokerProcess, crash_seed: int
) -> None:
    rng = random.Random(crash_seed)
    tag = uuid.uuid4().hex[:8]
    plain = f"persistent://public/default/ks-crash-{tag}"
    part = f"persistent://public/default/ks-crash-part-{tag}"
    status, body = crash_broker.admin("PUT", admin_path(part) + "/partitions", PARTITIONS)
    assert status in (200, 204), body
    # Each topic partition: its kind and the short name its consumers' labels start with.
    cursors = {plain: ("plain", "a")}
    cursors.update({f"{part}-partition-{i}": ("part", f"b{i}") for i in range(PARTITIONS)})
    recorder = ConsumptionRecorder()
    rejoin_lock = threading.Lock()
    rounds = ks_rounds()
    started = time.monotonic()

    client = make_client(crash_broker.service_url)
    workers: list[CrashWorker] = []
    producers: list[KeyedProducer] = []
    crashes: list[Crash] = []
    try:
        for topic, (kind, short) in cursors.items():
            for spec in CONSUMERS[kind]:
                label = f"{short}/{spec.name}"
                workers.append(
                    CrashWorker(
                        client,
                        topic,
                        SUB,
                        spec,
                        recorder,
                        random.Random(f"{crash_seed}:{label}"),
                        rejoin_lock,
                        batch_index_ack=kind == "plain",
                        label=label,
                    )
                )
        for topic, short in ((plain, "a"), (part, "b")):
            for batched in (True, False):
                name = f"{short}-{'batch' if batched else 'single'}"
                producers.append(
                    KeyedProducer(
                        client,
                        topic,
                        name,
                        batched=batched,
                        keys=KEYS,
                        rng=random.Random(f"{crash_seed}:{name}"),
                        recorder=recorder,
                        rate=RATE,
                    )
                )
        for w in workers:
            w.start()
        for p in producers:
            p.start()

        for _ in range(rounds):
            time.sleep(rng.uniform(0.4, 2.0))
            crashes.append(crash(crash_broker, workers, recorder, rejoin_lock, list(cursors)))
            print(
                f"kill {len(crashes)}: expected so far {recorder.expected_count}; persisted "
                + ", ".join(
                    f"{t.rsplit('/', 1)[-1]}: {a.describe()}" for t, a in crashes[-1].acks.items()
                )
            )
        time.sleep(rng.uniform(0.3, 1.0))

        for p in producers:
            p.stop()
        for w in workers:
            w.finish()
        wait_consumed(recorder, workers)
        wait_for(
            lambda: all(backlog(crash_broker, t) == 0 for t in cursors), 15, "backlogs to drain"
        )
    finally:
        for w in workers:
            w.close()
        client.close()
    for w in workers:
        w.check_errors()

    elapsed = time.monotonic() - started
    print("rejoins:", " ".join(r for w in workers for r in w.rejoin_log))
    deliveries = recorder.deliveries()
    report = check(recorder, duplicates_after_ack=True)
    entry_ack_topics = [t for t, (kind, _) in cursors.items() if kind == "part"]
    crash_report = audit_crashes(deliveries, recorder.expected(), crashes, entry_ack_topics)
    ack_errors = [e for w in workers for e in w.ack_errors]
    print(
        f"kills {len(crashes)}, confirmed {recorder.expected_count}, deliveries "
        f"{report.deliveries}, redeliveries {crash_report.redeliveries} "
        f"({crash_report.after_lost_ack} after an unpersisted ack), persisted acked "
        f"per kill {crash_report.persisted_acked}, rejoins {sum(w.rejoins for w in workers)}, "
        f"ack errors {len(ack_errors)}, {elapsed:.1f}s"
    )
    problems = crash_report.problems
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:20])
    assert len(crashes) == rounds
    # The kills did catch persisted acks, holes among them (else the audits proved little).
    assert sum(crash_report.persisted_acked) > 0, crash_report.persisted_acked
    assert any(len(a.ranges) for c in crashes for a in c.acks.values())
