"""What both topic kinds share: the producer registry and the topic's enabled types."""

from __future__ import annotations

import pytest

from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.topic import Producer
from keyshared.broker.topic_common import ProducerRegistry, producer_stats


class ClosingTransport:
    address = "/127.0.0.1:1"
    client_version = "test"

    def __init__(self) -> None:
        self.closed: list[str] = []

    def close_producer(self, producer: Producer) -> None:
        self.closed.append(producer.producer_name)


def producer(name: str, t: ClosingTransport, pid: int = 1) -> Producer:
    return Producer(producer_id=pid, producer_name=name, topic=None, transport=t)  # type: ignore[arg-type]


def test_a_live_name_is_busy_a_closed_one_is_taken_over() -> None:
    t = ClosingTransport()
    reg = ProducerRegistry()
    first = producer("p", t)
    reg.add(first)
    with pytest.raises(BrokerError) as exc:
        reg.add(producer("p", t, 2))
    assert exc.value.code is ServerError.ProducerBusy
    first.closed = True
    second = producer("p", t, 2)
    reg.add(second)
    assert dict(reg) == {"p": second}
    reg.remove(first)  # the name went to ``second``: it stays
    assert list(reg.values()) == [second] and first.closed


def test_close_all_tells_each_client_and_empties_the_registry() -> None:
    t = ClosingTransport()
    reg = ProducerRegistry()
    a, b = producer("a", t), producer("b", t, 2)
    reg.add(a)
    reg.add(b)
    reg.close_all()
    assert t.closed == ["a", "b"] and not reg and a.closed and b.closed


def test_producer_stats_field_order() -> None:
    st = producer_stats(producer("p", ClosingTransport()))
    assert list(st)[:4] == ["accessMode", "msgRateIn", "msgThroughputIn", "averageMsgSize"]
    assert st["producerName"] == "p" and st["averageMsgSize"] == 0.0
