"""Paused consumers and reconnects: rows 23-25 of research §8, checked with tests/ordering.py.

Java's ``startPaused(true)`` (no permits until ``resume()``) has no Python equivalent; a
zero-queue consumer (``receiver_queue_size=0``) is the nearest: it asks for one message per
``receive()``, so it has no permits while nobody calls it.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import pulsar
import pytest

from tests.integration.key_shared.helpers import KeySharedEnv, Worker
from tests.ordering import ConsumptionRecorder, check

pytestmark = pytest.mark.timeout(60)

PAUSE = 0.1


def publisher(env: KeySharedEnv, recorder: ConsumptionRecorder) -> Callable[[list[str], int], None]:
    """``send(keys, first_value)``: publish one message per key, registered as expected."""
    producer = env.producer()
    failures: list[pulsar.Result] = []

    def send(keys: list[str], first: int) -> None:
        for i, key in enumerate(keys):

            def done(res: pulsar.Result, mid: pulsar.MessageId, key: str = key) -> None:
                if res == pulsar.Result.Ok:
                    recorder.expect(key, mid)
                else:
                    failures.append(res)

            producer.send_async(str(first + i).encode(), done, partition_key=key)
        producer.flush()
        assert not failures, failures

    return send


def keys_of(env: KeySharedEnv, name: str, candidates: list[str]) -> list[str]:
    ranges = env.ranges()
    return [k for k in candidates if env.owner(k, ranges=ranges) == name]


def wait_consumed(recorder: ConsumptionRecorder, workers: list[Worker], limit: float) -> None:
    """Until every expected message is acked, or no worker received anything for 2 s."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and recorder.missing():
        now = time.monotonic()
        if all(now - w.last_receive > 2.0 for w in workers):
            break
        time.sleep(0.05)


def close_all(workers: list[Worker]) -> None:
    for w in workers:
        w.close()
    for w in workers:
        w.check_errors()


# --- row 23 ------------------------------------------------------------------------------------
def test_row23_replay_queue_stays_under_the_look_ahead_limit(
    make_env: Callable[..., KeySharedEnv],
) -> None:
    """PIP-379 only (Pulsar skips it for classic, which has no look-ahead limit)."""
    limit = 20
    env = make_env("pip379", {"keySharedLookAheadMsgInReplayThresholdPerSubscription": limit})
    rec = ConsumptionRecorder()
    send = publisher(env, rec)
    env.consumer().close()  # create the subscription
    c1 = env.consumer("c1", queue=0)  # paused
    c2 = env.consumer("c2", queue=500)
    c3 = env.consumer("c3", queue=0)  # paused
    rng = random.Random(23)
    candidates = [str(i) for i in range(1000)]
    keys_c2 = keys_of(env, "c2", candidates)
    seen_max = [0]
    stop = threading.Event()

    def monitor() -> None:
        while not stop.is_set():
            seen_max[0] = max(seen_max[0], int(env.sub_stats()["msgInReplay"]))
            time.sleep(0.01)

    mon = threading.Thread(target=monitor, daemon=True)
    mon.start()
    workers: list[Worker] = []
    try:
        send([rng.choice(keys_c2) for _ in range(1000)], 0)
        time.sleep(2 * PAUSE)
        workers += [
            Worker(c1, "c1", rec, blocking=True).start(),
            Worker(c3, "c3", rec, blocking=True).start(),
        ]
        time.sleep(PAUSE)
        send([rng.choice(candidates) for _ in range(1000)], 1000)
        workers.append(Worker(c2, "c2", rec).start())
        wait_consumed(rec, workers, 20)
    finally:
        stop.set()
        mon.join(5)
        close_all(workers)
    assert seen_max[0] <= limit, f"msgInReplay reached {seen_max[0]} > {limit}"
    check(rec)


# --- row 24 ------------------------------------------------------------------------------------
def test_row24_order_kept_through_rolling_reconnects(env379: KeySharedEnv) -> None:
    """PIP-379 only (Pulsar skips it for classic, where it fails)."""
    env = env379
    rec = ConsumptionRecorder()
    send = publisher(env, rec)
    env.consumer().close()
    c1 = env.consumer("c1", queue=0)
    c2 = env.consumer("c2", queue=500)
    c3 = env.consumer("c3", queue=0)
    rng = random.Random(24)
    candidates = [str(i) for i in range(1000)]
    keys_c2 = keys_of(env, "c2", candidates)
    send([rng.choice(keys_c2) for _ in range(1000)], 0)
    time.sleep(2 * PAUSE)
    c2.close()  # its 500 prefetched messages go back
    time.sleep(PAUSE)
    # "resume" c1 and c3 with a queue of 10: they take 10 each and hold them.
    h1 = Worker(c1, "c1", rec, blocking=True, hold=lambda _m: True, limit=10).start()
    h3 = Worker(c3, "c3", rec, blocking=True, hold=lambda _m: True, limit=10).start()
    time.sleep(PAUSE)
    c2 = env.consumer("c2", queue=10)
    h1.close()
    time.sleep(PAUSE)
    c1 = env.consumer("c1", queue=10)
    h3.close()
    time.sleep(PAUSE)
    c3 = env.consumer("c3", queue=10)
    send([rng.choice(candidates) for _ in range(1000)], 1000)
    workers = [Worker(c, n, rec).start() for c, n in ((c1, "c1'"), (c2, "c2'"), (c3, "c3'"))]
    try:
        wait_consumed(rec, workers, 20)
    finally:
        close_all(workers)
    check(rec)


# --- row 25 ------------------------------------------------------------------------------------
ROW25_CONF = {
    "managedLedgerCacheSizeMB": 0,
    "dispatcherRetryBackoffInitialTimeInMs": 0,
    "dispatcherRetryBackoffMaxTimeInMs": 0,
    "keySharedUnblockingIntervalMs": 0,
    "brokerDeduplicationEnabled": True,
}


def test_row25_order_kept_when_one_consumer_reconnects(
    make_env: Callable[..., KeySharedEnv], impl: str
) -> None:
    """KeySharedSubscriptionDisabledBrokerCacheTest: c2 leaves, its keys go to c1 and c3 and
    are held unacked there; c2 comes back paused, more messages of its keys arrive, the held
    ones are released and c2 resumes. Listeners ack 25-50 ms after receiving."""
    env = make_env(impl, ROW25_CONF)
    rec = ConsumptionRecorder()
    send = publisher(env, rec)
    env.consumer().close()
    rng = random.Random(25)
    keys_c2: set[str] = set()
    holding = [True]

    def hold(msg: pulsar.Message) -> bool:
        return holding[0] and msg.partition_key() in keys_c2

    def ack_delay() -> float:
        return rng.uniform(0.025, 0.050)

    def worker(name: str, label: str, **kw: object) -> Worker:
        client = env.new_client()
        queue = 0 if kw.get("blocking") else 1000
        c = env.consumer(name, client=client, queue=queue)
        return Worker(c, label, rec, ack_after=ack_delay, hold=hold, **kw)  # type: ignore[arg-type]

    w1 = worker("c1", "c1").start()
    w2 = worker("c2", "c2").start()
    w3 = worker("c3", "c3").start()
    ranges = env.ranges()
    keys_c2.update(k for k in map(str, range(100)) if env.owner(k, ranges=ranges) == "c2")
    assert keys_c2
    w2.close()
    time.sleep(PAUSE)
    send([str(rng.randrange(100)) for _ in range(1000)], 0)
    w2b = worker("c2", "c2'", blocking=True)  # reconnected, paused: not receiving yet
    time.sleep(2 * PAUSE)
    send([rng.choice(sorted(keys_c2)) for _ in range(100)], 1000)
    time.sleep(2 * PAUSE)
    holding[0] = False
    w1.release_held(process=True)
    w3.release_held(process=True)
    w2b.start()  # resume c2
    workers = [w1, w2b, w3]
    try:
        wait_consumed(rec, workers, 20)
        time.sleep(0.1)  # the last delayed acks
    finally:
        close_all(workers)
    check(rec)
