"""Producer, consumer and subscription limits through the official client: broker.conf,
namespace and topic policies (topic > namespace > broker), refused with Pulsar's errors."""

from __future__ import annotations

import pulsar
import pytest

from tests.broker_process import BrokerProcess
from tests.integration.admin_support import new_namespace, ok, tpath
from tests.integration.conftest import make_client

pytestmark = pytest.mark.integration


def test_producer_limit_topic_over_namespace(broker: BrokerProcess) -> None:
    ns = new_namespace(broker)
    topic = f"persistent://{ns}/t"
    ok(broker, "PUT", tpath(topic))
    ok(broker, "POST", f"/admin/v2/namespaces/{ns}/maxProducersPerTopic", 1)
    assert ok(broker, "GET", f"/admin/v2/namespaces/{ns}/maxProducersPerTopic") == 1
    client = make_client(broker.service_url)
    try:
        first = client.create_producer(topic)
        with pytest.raises(pulsar.ProducerBusy):
            client.create_producer(topic)
        # The topic's own policy wins over the namespace's.
        ok(broker, "POST", tpath(topic, "maxProducers"), 2)
        assert ok(broker, "GET", tpath(topic, "maxProducers")) == 2
        second = client.create_producer(topic)
        with pytest.raises(pulsar.ProducerBusy):
            client.create_producer(topic)
        ok(broker, "DELETE", tpath(topic, "maxProducers"))
        assert ok(broker, "GET", tpath(topic, "maxProducers")) is None
        assert ok(broker, "GET", tpath(topic, "maxProducers") + "?applied=true") == 1
        second.close()
        first.close()
        client.create_producer(topic).close()  # room again once one left
        status, body = broker.admin("POST", tpath(topic, "maxProducers"), -1)
        assert status == 412 and "maxProducersPerTopic" in body["reason"]
    finally:
        client.close()


def test_consumer_and_subscription_limits(broker: BrokerProcess) -> None:
    ns = new_namespace(broker)
    topic = f"persistent://{ns}/t"
    ok(broker, "PUT", tpath(topic))
    ok(broker, "POST", f"/admin/v2/namespaces/{ns}/maxConsumersPerSubscription", 1)
    ok(broker, "POST", tpath(topic, "maxConsumers"), 2)
    ok(broker, "POST", tpath(topic, "maxSubscriptionsPerTopic"), 2)
    shared = pulsar.ConsumerType.Shared
    client = make_client(broker.service_url)
    try:
        client.subscribe(topic, "a", consumer_type=shared)
        with pytest.raises(pulsar.ConsumerBusy):
            client.subscribe(topic, "a", consumer_type=shared)
        client.subscribe(topic, "b", consumer_type=shared)
        # Two subscriptions already: a third is not allowed.
        with pytest.raises(pulsar.NotAllowedError):
            client.subscribe(topic, "c", consumer_type=shared)
        # Lift the subscription limits: the topic's consumer limit (2) still refuses a third.
        ok(broker, "DELETE", tpath(topic, "maxSubscriptionsPerTopic"))
        ok(broker, "DELETE", f"/admin/v2/namespaces/{ns}/maxConsumersPerSubscription")
        with pytest.raises(pulsar.ConsumerBusy):
            client.subscribe(topic, "c", consumer_type=shared)
        ok(broker, "POST", tpath(topic, "maxConsumers"), 0)  # 0: unlimited
        client.subscribe(topic, "c", consumer_type=shared)
        client.subscribe(topic, "a", consumer_type=shared)
    finally:
        client.close()


def test_broker_conf_limits_and_namespace_body(fresh_broker: BrokerProcess) -> None:
    fresh_broker.conf["maxProducersPerTopic"] = 1
    fresh_broker.conf["maxNumPartitionsPerPartitionedTopic"] = 3
    b = fresh_broker.start()
    partitioned = tpath("persistent://public/default/p")
    refused = {"reason": "Number of partitions should be less than or equal to 3"}
    assert b.admin("PUT", partitioned + "/partitions", 4) == (406, refused)
    ok(b, "PUT", partitioned + "/partitions", 3)
    assert b.admin("POST", partitioned + "/partitions", 4) == (406, refused)
    topic = "persistent://public/default/limited"
    client = make_client(b.service_url)
    try:
        client.create_producer(topic)
        with pytest.raises(pulsar.ProducerBusy):
            client.create_producer(topic)
        # A namespace created with the limit in its Policies body.
        ok(b, "PUT", "/admin/v2/namespaces/public/roomy", {"max_producers_per_topic": 3})
        view = ok(b, "GET", "/admin/v2/namespaces/public/roomy")
        assert view["max_producers_per_topic"] == 3
        other = "persistent://public/roomy/t"
        for _ in range(3):
            client.create_producer(other)
        with pytest.raises(pulsar.ProducerBusy):
            client.create_producer(other)
    finally:
        client.close()


def test_topics_per_namespace(broker: BrokerProcess) -> None:
    ns = new_namespace(broker)
    path = f"/admin/v2/namespaces/{ns}/maxTopicsPerNamespace"
    ok(broker, "POST", path, 3)
    assert ok(broker, "GET", path) == 3
    ok(broker, "PUT", tpath(f"persistent://{ns}/a"))
    ok(broker, "PUT", tpath(f"persistent://{ns}/p", "partitions"), 2)  # counts two
    refused = {"reason": "Exceed maximum number of topics in namespace."}
    assert broker.admin("PUT", tpath(f"persistent://{ns}/b")) == (412, refused)
    client = make_client(broker.service_url)
    try:
        # Auto-creation through the client is refused too; the existing partitions still work.
        with pytest.raises(pulsar.NotAllowedError):
            client.create_producer(f"persistent://{ns}/c")
        client.create_producer(f"persistent://{ns}/p").send(b"x")
    finally:
        client.close()
    ok(broker, "DELETE", path)
    assert ok(broker, "GET", path) is None
    ok(broker, "PUT", tpath(f"persistent://{ns}/b"))
