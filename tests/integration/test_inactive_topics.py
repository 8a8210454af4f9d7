"""Inactive topics deleted as Pulsar does, in each mode, under broker.conf, namespace and topic
policies; through the official client and the admin REST API.

The broker looks every second (``brokerDeleteInactiveTopicsFrequencySeconds=1``) and, with no
``brokerDeleteInactiveTopicsMaxInactiveDurationSeconds``, deletes after a second of inactivity.
"""

from __future__ import annotations

import time
import uuid

import pulsar
import pytest

from tests.broker_process import BrokerProcess
from tests.integration.admin_support import new_namespace, ok, tpath, wait_for
from tests.integration.conftest import make_client

pytestmark = pytest.mark.integration


def listed(b: BrokerProcess, topic: str) -> bool:
    ns = topic[len("persistent://") :].rsplit("/", 1)[0]
    return topic in ok(b, "GET", f"/admin/v2/namespaces/{ns}/topics")


def test_inactive_topics_deleted_by_mode(fresh_broker: BrokerProcess) -> None:
    fresh_broker.conf["brokerDeleteInactiveTopicsFrequencySeconds"] = 1
    fresh_broker.conf["backlogQuotaCheckEnabled"] = "false"
    b = fresh_broker.start()
    tag = uuid.uuid4().hex[:6]
    # The broker's mode: delete_when_no_subscriptions.
    no_subs = f"persistent://public/default/gone-{tag}"
    with_sub = f"persistent://public/default/subscribed-{tag}"
    kept_by_topic_policy = f"persistent://public/default/kept-{tag}"
    # A namespace in delete_when_subscriptions_caught_up mode.
    ns = new_namespace(b)
    ok(
        b,
        "POST",
        f"/admin/v2/namespaces/{ns}/inactiveTopicPolicies",
        {
            "inactiveTopicDeleteMode": "delete_when_subscriptions_caught_up",
            "maxInactiveDurationSeconds": 1,
            "deleteWhileInactive": True,
        },
    )
    caught_up = f"persistent://{ns}/caught-up"
    behind = f"persistent://{ns}/behind"
    client = make_client(b.service_url)
    try:
        client.create_producer(no_subs).send(b"x")
        client.subscribe(with_sub, "s").close()  # the durable subscription stays
        ok(b, "PUT", tpath(kept_by_topic_policy))
        ok(
            b,
            "POST",
            tpath(kept_by_topic_policy, "inactiveTopicPolicies"),
            {"deleteWhileInactive": False, "maxInactiveDurationSeconds": 1},
        )
        for topic, ack in ((caught_up, True), (behind, False)):
            consumer = client.subscribe(topic, "s")
            client.create_producer(topic).send(b"x")
            if ack:
                consumer.acknowledge(consumer.receive(5000))
        # Closing the client leaves each topic unused; a producer still connected holds one.
        client.close()
        client = make_client(b.service_url)
        held = f"persistent://public/default/held-{tag}"
        holder = client.create_producer(held)
        assert wait_for(lambda: not listed(b, no_subs) and not listed(b, caught_up), 20)
        time.sleep(2.5)  # more than two more passes: the others are kept by their rules
        for topic in (with_sub, kept_by_topic_policy, behind, held):
            assert listed(b, topic), topic
        assert "deleted successfully due to inactivity" in b.log()
        # A deleted topic is gone with its data: used again, it starts empty.
        reader = client.create_reader(no_subs, pulsar.MessageId.earliest)
        assert not reader.has_message_available()
        holder.close()
    finally:
        client.close()
