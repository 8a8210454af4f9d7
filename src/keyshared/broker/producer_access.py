"""Producer access modes (PIP-68) and the topic epoch, as Pulsar's AbstractTopic keeps them.

* ``Shared``: any number of producers; refused (ProducerBusy) while an exclusive producer holds
  the topic or one waits for it.
* ``Exclusive``: the only producer; refused (ProducerFenced) while any other producer is there.
* ``ExclusiveWithFencing``: takes the topic, closing every other producer and failing the
  waiting ones.
* ``WaitForExclusive``: queued while other producers are there (the client gets
  PRODUCER_SUCCESS with ``producer_ready=false``) and admitted when the topic is free.

Beyond Pulsar (which promotes a waiting producer only when an exclusive one leaves): a
WaitForExclusive producer queued behind Shared producers takes the topic when the last of them
leaves, rather than waiting forever.

Every exclusive admission moves the topic epoch on (or sets it to the epoch the producer
presents when it reconnects); a producer presenting an epoch older than the topic's is fenced:
another exclusive producer held the topic in between.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from keyshared.broker.errors import BrokerError, ServerError

if TYPE_CHECKING:
    from keyshared.broker.topic import Producer


class AccessMode(enum.IntEnum):
    """``ProducerAccessMode`` with the wire values of PulsarApi.proto."""

    Shared = 0
    Exclusive = 1
    WaitForExclusive = 2
    ExclusiveWithFencing = 3


def access_mode_of(value: int) -> AccessMode:
    """The access mode a PRODUCER command names; NotAllowed for a value Pulsar does not know."""
    try:
        return AccessMode(value)
    except ValueError:
        raise BrokerError(
            ServerError.NotAllowedError, f"Invalid producer access mode: {value}"
        ) from None


# Called once for a queued producer: with the topic epoch when it is admitted, or with the
# error that ended its wait (fenced out by an ExclusiveWithFencing producer, topic closed).
WaitCallback = Callable[[int | None, BrokerError | None], None]


@dataclass(frozen=True, slots=True)
class Admission:
    """The answer to a new producer: admitted with ``topic_epoch``, or ``queued``."""

    topic_epoch: int | None
    queued: bool = False


@dataclass(slots=True)
class _Waiting:
    producer: Producer
    done: WaitCallback


class ProducerAccess:
    """One topic's exclusive-producer state: who holds it, who waits, and the topic epoch."""

    __slots__ = ("_exclusive", "_save_epoch", "_waiting", "topic_epoch")

    def __init__(
        self, topic_epoch: int | None = None, save_epoch: Callable[[int], None] | None = None
    ) -> None:
        self.topic_epoch = topic_epoch
        self._save_epoch = save_epoch
        self._exclusive: Producer | None = None
        self._waiting: deque[_Waiting] = deque()

    @property
    def exclusive_producer_name(self) -> str | None:
        """The name of the producer holding the topic exclusively, if one does."""
        return self._exclusive.producer_name if self._exclusive is not None else None

    @property
    def waiting_count(self) -> int:
        """How many producers wait for exclusive access (``waitingPublishers``)."""
        return len(self._waiting)

    def is_waiting(self, producer: Producer) -> bool:
        """Whether ``producer`` is queued for exclusive access."""
        return any(w.producer is producer for w in self._waiting)

    def admit(
        self,
        producer: Producer,
        others: Iterable[Producer],
        fence: Callable[[Producer], None],
        done: WaitCallback,
    ) -> Admission:
        """Admit ``producer`` beside the live producers ``others``, queue it, or refuse it
        (BrokerError). ``fence`` closes a producer an ExclusiveWithFencing one pushes out;
        ``done`` is kept for a queued producer."""
        live = [p for p in others if not p.closed]
        mode = producer.access_mode
        held = self._exclusive is not None or bool(self._waiting)
        if mode is AccessMode.Shared:
            if held:
                raise BrokerError(
                    ServerError.ProducerBusy,
                    f"Topic has an existing exclusive producer: {self._holder_name()}",
                )
            return Admission(self.topic_epoch)
        if mode is AccessMode.Exclusive:
            if held:
                raise BrokerError(
                    ServerError.ProducerFenced,
                    f"Topic has an existing exclusive producer: {self._holder_name()}",
                )
            if live:
                raise BrokerError(ServerError.ProducerFenced, "Topic has existing shared producers")
            return Admission(self._take(producer))
        if mode is AccessMode.ExclusiveWithFencing:
            # Beyond Pulsar, which fences the others first: a stale producer reconnecting must
            # not push out the one that fenced it.
            self._check_epoch(producer)
            waiting = list(self._waiting)
            self._waiting.clear()
            for w in waiting:
                w.done(None, BrokerError(ServerError.ProducerFenced, "Fenced out"))
            for p in live:
                fence(p)
            self._exclusive = None
            return Admission(self._take(producer))
        if mode is AccessMode.WaitForExclusive:
            if self._exclusive is not None or live or self._waiting:
                self._waiting.append(_Waiting(producer, done))
                return Admission(self.topic_epoch, queued=True)
            return Admission(self._take(producer))
        raise BrokerError(ServerError.NotAllowedError, f"Invalid producer access mode: {mode}")

    def release(self, producer: Producer, remaining: Iterable[Producer]) -> Producer | None:
        """``producer`` left (or stopped waiting). When no live producer remains, the first
        waiting one takes the topic: it is returned (its ``done`` already called) for the
        caller to register."""
        for w in self._waiting:
            if w.producer is producer:
                self._waiting.remove(w)
                return None
        if self._exclusive is producer:
            self._exclusive = None
        if any(not p.closed for p in remaining) or self._exclusive is not None:
            return None
        while self._waiting:
            w = self._waiting.popleft()
            if w.producer.closed:
                continue
            try:
                epoch = self._take(w.producer)
            except BrokerError as exc:
                w.done(None, exc)
                continue
            w.done(epoch, None)
            return w.producer
        return None

    def take_waiting(self) -> list[Producer]:
        """The topic closes: the queued producers stop waiting (the caller closes them)."""
        waiting = [w.producer for w in self._waiting]
        self._waiting.clear()
        return waiting

    def _holder_name(self) -> str | None:
        if self._exclusive is not None:
            return self._exclusive.producer_name
        return self._waiting[0].producer.producer_name if self._waiting else None

    def _check_epoch(self, producer: Producer) -> None:
        presented = producer.topic_epoch
        current = self.topic_epoch if self.topic_epoch is not None else -1
        if presented is not None and presented < current:
            raise BrokerError(
                ServerError.ProducerFenced,
                f"Topic epoch has already moved. Current epoch: {current}, "
                f"Producer epoch: {presented}",
            )

    def _take(self, producer: Producer) -> int:
        """``producer`` holds the topic: the epoch moves on, or to the one it presents."""
        self._check_epoch(producer)
        if producer.topic_epoch is not None:
            epoch = producer.topic_epoch
        else:
            epoch = (self.topic_epoch if self.topic_epoch is not None else -1) + 1
        self.topic_epoch = epoch
        producer.topic_epoch = epoch
        self._exclusive = producer
        if self._save_epoch is not None:
            self._save_epoch(epoch)
        return epoch
