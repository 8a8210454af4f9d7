"""The producer side of a connection: SEND frames to the topic, answers back in send order.

The official client matches each SEND_RECEIPT against the oldest send it still waits for: a
receipt for a later send ("Got ack for msg 50 expecting last: 35") makes it drop the connection
and resend everything pending, and a receipt for an earlier one is ignored. A broker that
answered some sends at once (a duplicate, a checksum error) while earlier ones were still being
written would trip that. So every send of a producer takes a slot in its :class:`ReceiptQueue`
when it arrives, and answers leave in slot order, each as soon as it and all before it are
known. Storage completes appends in order, so this only ever holds back early answers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.topic import Producer, ProducerTransport
from keyshared.protocol import ProtocolError, pb
from keyshared.storage.position import Position


@dataclass(slots=True)
class Answer:
    """The answer to one send: a receipt (``position``) or an error (``code``)."""

    sequence_id: int
    highest_sequence_id: int
    position: Position | None = None
    code: ServerError | None = None
    message: str = ""
    ready: bool = False


class ReceiptQueue:
    """One producer's answers, released in the order its sends arrived (pure, synchronous)."""

    __slots__ = ("_slots",)

    def __init__(self) -> None:
        self._slots: deque[Answer] = deque()

    def __len__(self) -> int:
        return len(self._slots)

    def reserve(self, sequence_id: int, highest_sequence_id: int) -> Answer:
        """A slot for a send that just arrived."""
        return self.add(Answer(sequence_id, highest_sequence_id))

    def add(self, slot: Answer) -> Answer:
        """Queue ``slot`` (an :class:`Answer` or a subclass) for a send that just arrived."""
        self._slots.append(slot)
        return slot

    def resolve(self, slot: Answer, emit: Callable[[Answer], None]) -> None:
        """``slot`` is answered: ``emit`` every answer now at the head, in order.

        Every answer passes here, the one place they are ordered: the producer simulation's
        oracle tests plant their ordering bugs in this method (a shortcut around it, tried
        for speed, hid them)."""
        slot.ready = True
        slots = self._slots
        while slots and slots[0].ready:
            emit(slots.popleft())


class _Producing:
    """One producer's receipt queue, and how answers reach its client."""

    __slots__ = ("emit", "producer", "queue")

    def __init__(self, producer: Producer, transport: ProducerTransport) -> None:
        self.producer = producer
        self.queue = ReceiptQueue()
        send_receipt = transport.send_receipt
        send_error = transport.send_error

        def emit(answer: Answer) -> None:
            if answer.position is not None:
                send_receipt(
                    producer, answer.sequence_id, answer.highest_sequence_id, answer.position
                )
            else:
                code = answer.code if answer.code is not None else ServerError.UnknownError
                send_error(producer, answer.sequence_id, code, answer.message)

        # Made once per producer, not once per send.
        self.emit = emit


@dataclass(slots=True)
class _Pending(Answer):
    """A send on its way to the topic: its answer slot, and what to do when it is stored.

    One object per send, whose bound :meth:`stored` is the topic's callback, instead of the
    closures and the lambda that each send built before (``publish-before.md``).
    """

    producing: _Producing | None = None
    finished: Callable[[int], None] | None = None
    size: int = 0

    def stored(self, position: Position | None, exc: BaseException | None) -> None:
        """The topic stored the send at ``position``, or failed it with ``exc``."""
        if self.finished is not None:
            self.finished(self.size)
        if position is not None:
            self.position = position
        else:
            self.code = ServerError.PersistenceError
            self.message = f"Store failed: {exc}"
        producing = self.producing
        assert producing is not None
        producing.queue.resolve(self, producing.emit)

    def refused(self, code: ServerError, message: str) -> None:
        """The send never reached the topic's storage."""
        if self.finished is not None:
            self.finished(self.size)
        self.code = code
        self.message = message
        producing = self.producing
        assert producing is not None
        producing.queue.resolve(self, producing.emit)


class Publisher:
    """A connection's producers' sends: validated, handed to their topic, answered in order."""

    def __init__(self, transport: ProducerTransport) -> None:
        self.transport = transport
        self._queues: dict[int, _Producing] = {}

    def _producing(self, producer: Producer) -> _Producing:
        pid = producer.producer_id
        held = self._queues.get(pid)
        if held is None or held.producer is not producer:
            held = self._queues[pid] = _Producing(producer, self.transport)
        return held

    def queue(self, producer: Producer) -> ReceiptQueue:
        """``producer``'s receipt queue (a new one for a new producer on a reused id)."""
        return self._producing(producer).queue

    def forget(self, producer_id: int) -> None:
        """The producer is gone: answers still owed to it are dropped."""
        self._queues.pop(producer_id, None)

    def on_send(
        self,
        producer: Producer,
        send: pb.CommandSend,
        payload: bytes,
        checksum_ok: bool,
        on_finished: Callable[[], None] | None = None,
    ) -> None:
        """Handle one SEND of a known producer, as :meth:`publish`, from its command;
        ``on_finished`` runs once, when the topic has stored or failed it (or it was refused
        before reaching the topic)."""
        highest = send.highest_sequence_id if send.HasField("highest_sequence_id") else None
        finished = None if on_finished is None else _ignoring_size(on_finished)
        self.publish(producer, send.sequence_id, highest, payload, checksum_ok, finished)

    def publish(
        self,
        producer: Producer,
        sequence_id: int,
        highest_sequence_id: int | None,
        payload: bytes,
        checksum_ok: bool,
        finished: Callable[[int], None] | None = None,
        checksum: int | None = None,
    ) -> None:
        """Handle one SEND of a known producer (``highest_sequence_id`` None when the SEND
        has none); ``finished(len(payload))`` runs once, when the topic has stored or failed
        it (or it was refused before reaching the topic). ``checksum``: the SEND's CRC32C of
        ``payload``, when it had one and it matched (storage then need not compute it)."""
        # Echoed in the receipt as Pulsar does; the client matches on sequence_id alone. The
        # batch's real highest id is not sequence_id + num_messages - 1 for a key-based batch.
        highest = sequence_id
        if highest_sequence_id is not None and highest_sequence_id >= sequence_id:
            highest = highest_sequence_id
        producing = self._producing(producer)
        slot = _Pending(
            sequence_id, highest, None, None, "", False, producing, finished, len(payload)
        )
        producing.queue.add(slot)
        if not checksum_ok:
            slot.refused(ServerError.ChecksumError, "Checksum failed")
            return
        try:
            if checksum is None:
                producer.topic.publish(producer, sequence_id, highest, payload, slot.stored)
            else:
                producer.topic.publish(
                    producer, sequence_id, highest, payload, slot.stored, checksum
                )
        except ProtocolError as exc:
            slot.refused(ServerError.ChecksumError, exc.message)
        except BrokerError as exc:
            slot.refused(exc.code, exc.message)


def _ignoring_size(callback: Callable[[], None]) -> Callable[[int], None]:
    def finished(_size: int) -> None:
        callback()

    return finished
