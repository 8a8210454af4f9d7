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
        slot = Answer(sequence_id, highest_sequence_id)
        self._slots.append(slot)
        return slot

    def resolve(self, slot: Answer, emit: Callable[[Answer], None]) -> None:
        """``slot`` is answered: ``emit`` every answer now at the head, in order."""
        slot.ready = True
        slots = self._slots
        while slots and slots[0].ready:
            emit(slots.popleft())


class Publisher:
    """A connection's producers' sends: validated, handed to their topic, answered in order."""

    def __init__(self, transport: ProducerTransport) -> None:
        self.transport = transport
        self._queues: dict[int, tuple[Producer, ReceiptQueue]] = {}

    def queue(self, producer: Producer) -> ReceiptQueue:
        """``producer``'s receipt queue (a new one for a new producer on a reused id)."""
        pid = producer.producer_id
        held = self._queues.get(pid)
        if held is None or held[0] is not producer:
            held = self._queues[pid] = (producer, ReceiptQueue())
        return held[1]

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
        """Handle one SEND of a known producer; ``on_finished`` runs once, when the topic has
        stored or failed it (or it was refused before reaching the topic)."""
        finished = on_finished if on_finished is not None else _nothing
        sequence_id = send.sequence_id
        # Echoed in the receipt as Pulsar does; the client matches on sequence_id alone. The
        # batch's real highest id is not sequence_id + num_messages - 1 for a key-based batch.
        highest = sequence_id
        if send.HasField("highest_sequence_id") and send.highest_sequence_id >= sequence_id:
            highest = send.highest_sequence_id
        queue = self.queue(producer)
        slot = queue.reserve(sequence_id, highest)
        transport = self.transport

        def emit(answer: Answer) -> None:
            if answer.position is not None:
                transport.send_receipt(
                    producer, answer.sequence_id, answer.highest_sequence_id, answer.position
                )
            else:
                code = answer.code if answer.code is not None else ServerError.UnknownError
                transport.send_error(producer, answer.sequence_id, code, answer.message)

        def fail(code: ServerError, message: str) -> None:
            slot.code = code
            slot.message = message
            queue.resolve(slot, emit)

        if not checksum_ok:
            finished()
            fail(ServerError.ChecksumError, "Checksum failed")
            return

        def done(position: Position | None, exc: BaseException | None) -> None:
            finished()
            if position is not None:
                slot.position = position
                queue.resolve(slot, emit)
            else:
                fail(ServerError.PersistenceError, f"Store failed: {exc}")

        try:
            producer.topic.publish(producer, sequence_id, highest, payload, done)
        except ProtocolError as exc:
            finished()
            fail(ServerError.ChecksumError, exc.message)
        except BrokerError as exc:
            finished()
            fail(exc.code, exc.message)


def _nothing() -> None:
    pass
