"""Producer access modes and the topic epoch, on the registry alone (no broker)."""

from __future__ import annotations

import pytest

from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.producer_access import AccessMode, ProducerAccess
from keyshared.broker.topic import Producer
from keyshared.broker.topic_common import ProducerRegistry
from tests.unit.test_topic_common import ClosingTransport


def producer(
    name: str, t: ClosingTransport, mode: AccessMode, epoch: int | None = None
) -> Producer:
    return Producer(
        producer_id=hash(name) & 0xFFFF,
        producer_name=name,
        topic=None,  # type: ignore[arg-type]
        transport=t,
        access_mode=mode,
        topic_epoch=epoch,
    )


def refused(reg: ProducerRegistry, p: Producer) -> BrokerError:
    with pytest.raises(BrokerError) as exc:
        reg.add(p)
    return exc.value


def test_waiting_producers_take_the_topic_in_turn_with_a_new_epoch() -> None:
    t = ClosingTransport()
    saved: list[int] = []
    reg = ProducerRegistry(ProducerAccess(None, saved.append))
    told: list[tuple[str, int | None, BrokerError | None]] = []
    holder = producer("holder", t, AccessMode.Exclusive)
    assert reg.add(holder).topic_epoch == 0
    w1, w2 = (producer(n, t, AccessMode.WaitForExclusive) for n in ("w1", "w2"))
    for w in (w1, w2):
        name = w.producer_name
        adm = reg.add(w, lambda e, err, name=name: told.append((name, e, err)))
        assert adm.queued
    assert reg.access.waiting_count == 2 and list(reg) == ["holder"]
    err = refused(reg, producer("shared", t, AccessMode.Shared))
    assert err.code is ServerError.ProducerBusy
    assert err.message == "Topic has an existing exclusive producer: holder"
    reg.remove(holder)
    assert told == [("w1", 1, None)] and list(reg) == ["w1"] and w1.topic_epoch == 1
    reg.remove(w2)  # stops waiting: nobody is told, nobody promoted later
    reg.remove(w1)
    assert told == [("w1", 1, None)] and not reg and reg.access.waiting_count == 0
    assert saved == [0, 1]


def test_fencing_closes_the_holder_fails_the_waiting_and_a_stale_epoch_is_fenced() -> None:
    t = ClosingTransport()
    reg = ProducerRegistry()
    told: list[BrokerError | None] = []
    reg.add(producer("a", t, AccessMode.Exclusive))
    reg.add(producer("w", t, AccessMode.WaitForExclusive), lambda e, err: told.append(err))
    fencer = producer("a", t, AccessMode.ExclusiveWithFencing)  # same name: fenced out too
    assert reg.add(fencer).topic_epoch == 1
    assert t.closed == ["a"] and dict(reg) == {"a": fencer}
    assert len(told) == 1 and told[0] is not None and told[0].message == "Fenced out"
    reg.remove(fencer)
    stale = refused(reg, producer("old", t, AccessMode.ExclusiveWithFencing, epoch=0))
    assert stale.code is ServerError.ProducerFenced
    assert stale.message == "Topic epoch has already moved. Current epoch: 1, Producer epoch: 0"
    # A reconnecting holder presenting the current epoch keeps it.
    assert reg.add(producer("again", t, AccessMode.Exclusive, epoch=1)).topic_epoch == 1


def test_exclusive_beside_shared_and_shared_keep_no_epoch() -> None:
    t = ClosingTransport()
    reg = ProducerRegistry()
    shared = producer("s", t, AccessMode.Shared)
    assert reg.add(shared).topic_epoch is None
    err = refused(reg, producer("x", t, AccessMode.Exclusive))
    assert (err.code, err.message) == (
        ServerError.ProducerFenced,
        "Topic has existing shared producers",
    )
    queued = producer("w", t, AccessMode.WaitForExclusive)
    assert reg.add(queued).queued
    reg.remove(shared)  # the topic is free: the waiting one takes it
    assert list(reg) == ["w"] and queued.topic_epoch == 0
