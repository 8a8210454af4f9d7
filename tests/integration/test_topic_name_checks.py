"""Topic names checked as Pulsar checks them: a partition suffix at or past a partitioned
topic's partition count is refused (NotAllowed, Pulsar's text), never auto-created; error
texts name the subscription type actually held."""

from __future__ import annotations

import pulsar
import pytest
import requests

from keyshared.protocol import commands, pb
from tests.broker_process import BrokerProcess
from tests.raw_client import RawClient

T = pb.BaseCommand


def _partitioned(broker: BrokerProcess, topic: str, n: int) -> str:
    path = topic.replace("persistent://", "persistent/")
    r = requests.put(f"{broker.web_url}/admin/v2/{path}/partitions", json=n, timeout=10)
    assert r.status_code == 204, r.text
    return path


def test_partition_past_the_count_is_refused_everywhere(
    broker: BrokerProcess, client: pulsar.Client, topic: str
) -> None:
    path = _partitioned(broker, topic, 4)
    stray = f"{topic}-partition-7"
    message = f"Illegal topic partition name {stray} with max allowed 4 partitions"
    with RawClient.to(broker.service_url) as raw:
        raw.handshake()
        raw.send(commands.lookup(topic=stray, request_id=raw.request_id()))
        lookup = raw.expect(T.LOOKUP_RESPONSE).lookupTopicResponse
        assert lookup.response == pb.CommandLookupTopicResponse.Failed
        assert (lookup.error, lookup.message) == (pb.NotAllowedError, message)
        raw.send(commands.producer(topic=stray, producer_id=1, request_id=raw.request_id()))
        err = raw.expect(T.ERROR).error
        assert (err.error, err.message) == (pb.NotAllowedError, message)
        raw.send(
            commands.subscribe(
                topic=stray,
                subscription="s",
                sub_type=pb.CommandSubscribe.Exclusive,
                consumer_id=2,
                request_id=raw.request_id(),
            )
        )
        err = raw.expect(T.ERROR).error
        assert (err.error, err.message) == (pb.NotAllowedError, message)
    with pytest.raises(pulsar.NotAllowedError):
        client.create_producer(stray)
    with pytest.raises(pulsar.NotAllowedError):
        client.subscribe(stray, "s")
    r = requests.put(f"{broker.web_url}/admin/v2/{path}-partition-7", timeout=10)
    assert r.status_code == 409 and message in r.text
    # Never created: the namespace lists only the four real partitions.
    listed = requests.get(f"{broker.web_url}/admin/v2/persistent/public/default", timeout=10).json()
    assert stray not in listed
    # The last real partition works.
    client.create_producer(f"{topic}-partition-3").send(b"ok")


def test_held_exclusive_subscription_is_named_in_the_error(
    broker: BrokerProcess, client: pulsar.Client, topic: str
) -> None:
    client.subscribe(topic, "held", consumer_type=pulsar.ConsumerType.Exclusive)
    with RawClient.to(broker.service_url) as raw:
        raw.handshake()
        raw.send(
            commands.subscribe(
                topic=topic,
                subscription="held",
                sub_type=pb.CommandSubscribe.Shared,
                consumer_id=1,
                request_id=raw.request_id(),
            )
        )
        err = raw.expect(T.ERROR).error
        assert err.error == pb.ConsumerBusy
        assert (
            err.message == "Subscription held is of type Exclusive, cannot attach a Shared consumer"
        )


def test_non_persistent_partition_past_the_count_is_refused(
    broker: BrokerProcess, client: pulsar.Client, topic: str
) -> None:
    np_topic = topic.replace("persistent://", "non-persistent://")
    path = np_topic.replace("non-persistent://", "non-persistent/")
    r = requests.put(f"{broker.web_url}/admin/v2/{path}/partitions", json=2, timeout=10)
    assert r.status_code == 204, r.text
    with pytest.raises(pulsar.NotAllowedError):
        client.create_producer(f"{np_topic}-partition-2")
    client.create_producer(f"{np_topic}-partition-1").close()
