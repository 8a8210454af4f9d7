"""``keyshared perf consume``."""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

from keyshared.perf.client import Deadline, make_client, send_interval, topic_names
from keyshared.perf.report import Recorder, Reporter, make_summary


def run_consume(pulsar: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Subscribe as asked and receive until told to stop; the summary."""
    client = make_client(pulsar, args)
    topics = topic_names(args)
    sub_type = {
        "Exclusive": pulsar.ConsumerType.Exclusive,
        "Shared": pulsar.ConsumerType.Shared,
        "Failover": pulsar.ConsumerType.Failover,
        "Key_Shared": pulsar.ConsumerType.KeyShared,
    }[args.subscription_type]
    position = (
        pulsar.InitialPosition.Earliest
        if args.subscription_position == "Earliest"
        else pulsar.InitialPosition.Latest
    )
    names = args.subscriptions or (
        [args.subscriber_name]
        if args.num_subscriptions == 1
        else [f"{args.subscriber_name}-{i}" for i in range(args.num_subscriptions)]
    )
    consumers = [
        client.subscribe(
            t,
            name,
            consumer_type=sub_type,
            receiver_queue_size=args.receiver_queue_size,
            initial_position=position,
        )
        for t in topics
        for name in names
        for _ in range(args.num_consumers)
    ]
    recorder = Recorder()
    stop = Deadline(args)
    reporter = Reporter("consume", recorder, send_interval(args))
    per_thread_rate = args.rate / len(consumers) if args.rate > 0 else 0.0
    timeout_error = pulsar.Timeout

    def receive_loop(consumer: Any) -> None:
        started = time.perf_counter()
        mine = 0
        while not stop.done(recorder.messages):
            try:
                msg = consumer.receive(timeout_millis=100)
            except timeout_error:
                continue
            except pulsar.PulsarException:  # closed under us: we are stopping
                break
            latency_ms = max(time.time_ns() // 1_000_000 - msg.publish_timestamp(), 0)
            recorder.ok(latency_ms * 1000, len(msg.data()))
            consumer.acknowledge(msg)
            mine += 1
            if per_thread_rate:
                ahead = started + mine / per_thread_rate - time.perf_counter()
                if ahead > 0:
                    time.sleep(ahead)

    reporter.start()
    start = time.perf_counter()
    stop.install(start)
    threads = [
        threading.Thread(target=receive_loop, args=(c,), name=f"perf-consumer-{i}", daemon=True)
        for i, c in enumerate(consumers)
    ]
    try:
        for th in threads:
            th.start()
        while any(th.is_alive() for th in threads):
            for th in threads:
                th.join(0.1)
            if stop.done(recorder.messages):
                break
        for th in threads:
            th.join(1.0)
    finally:
        elapsed = time.perf_counter() - start
        stop.restore()
        reporter.stop()
        for c in consumers:
            c.close()
        client.close()
    return make_summary(
        "consume",
        args,
        topics,
        reporter,
        recorder,
        elapsed,
        {
            "subscriptionType": args.subscription_type,
            "subscriptions": names,
            "numConsumers": args.num_consumers,
            "subscriptionPosition": args.subscription_position,
            "receiverQueueSize": args.receiver_queue_size,
            "rate": args.rate,
        },
    )
