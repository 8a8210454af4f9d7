"""The producer commands of a connection: PRODUCER, SEND, CLOSE_PRODUCER, and the answers."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.producer_access import access_mode_of
from keyshared.broker.schema import version_bytes
from keyshared.broker.topic import Producer
from keyshared.protocol import SendFrame, encode_send_receipt, pb
from keyshared.server import schema_commands
from keyshared.server.connection_core import _U64, ConnectionCore, T, _wire_error
from keyshared.storage.position import Position


class ProducerCommands(ConnectionCore):
    """Producers on a connection; the broker's ``ProducerTransport`` side of it."""

    # --- producers ---------------------------------------------------------------------------
    def _on_producer(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.producer
        request_id = r.request_id
        if r.producer_id in self.producers:
            existing = self.producers[r.producer_id]
            self._producer_success(request_id, existing, ready=existing.ready)
            return
        try:
            name = self.service.parse_topic(r.topic)
            self._authorize(name.full, "produce")
            topic = self.service.get_any_topic(name, create=True)
            schema = self.service.schemas.for_producer(
                name, schema_commands.schema_tuple(r.schema) if r.HasField("schema") else None
            )
            producer_name = (
                r.producer_name if r.HasField("producer_name") and r.producer_name else None
            )
            if producer_name is None:
                producer_name = self.server.new_producer_name()
            producer = Producer(
                producer_id=r.producer_id,
                producer_name=producer_name,
                topic=topic,
                transport=self,
                user_provided_name=r.user_provided_producer_name,
                epoch=r.epoch,
                access_mode=access_mode_of(r.producer_access_mode),
                topic_epoch=r.topic_epoch if r.HasField("topic_epoch") else None,
                metadata={kv.key: kv.value for kv in r.metadata},
                schema_version=None if schema is None else version_bytes(schema.version),
            )
            admission = topic.add_producer(
                producer, functools.partial(self._producer_wait_done, request_id, producer)
            )
        except BrokerError as exc:
            self._error(request_id, exc.code, exc.message)
            return
        self.producers[r.producer_id] = producer
        if admission.queued:
            producer.ready = False
            self._producer_success(request_id, producer, ready=False)
            return
        ready = topic.ready
        if ready is not None and not ready.done():
            # The last sequence id is known only once deduplication state is recovered.
            self._spawn(self._producer_success_when_ready(ready, request_id, producer))
            return
        self._producer_success(request_id, producer)

    def _producer_wait_done(
        self, request_id: int, producer: Producer, _: int | None, error: BrokerError | None
    ) -> None:
        """A WaitForExclusive producer took the topic, or its wait ended with ``error``."""
        if self.closed or self.producers.get(producer.producer_id) is not producer:
            return
        if error is not None:
            del self.producers[producer.producer_id]
            self._error(request_id, error.code, error.message)
            return
        producer.ready = True
        self._producer_success(request_id, producer)

    async def _producer_success_when_ready(
        self, ready: asyncio.Future[None], request_id: int, producer: Producer
    ) -> None:
        try:
            await asyncio.shield(ready)
        except Exception as exc:
            self._error(request_id, ServerError.MetadataError, f"Topic not ready: {exc}")
            return
        self._producer_success(request_id, producer)

    def _producer_success(self, request_id: int, producer: Producer, *, ready: bool = True) -> None:
        success = pb.CommandProducerSuccess(
            request_id=request_id,
            producer_name=producer.producer_name,
            last_sequence_id=producer.topic.last_sequence_id(producer.producer_name),
            producer_ready=ready,
        )
        if producer.topic_epoch is not None:
            success.topic_epoch = producer.topic_epoch
        if producer.schema_version is not None:
            success.schema_version = producer.schema_version
        self.send_command(T(type=T.PRODUCER_SUCCESS, producer_success=success))

    def _on_send_frame(self, send: SendFrame) -> None:
        producer_id = send.producer_id
        producer = self.producers.get(producer_id)
        if producer is None:
            if producer_id in self._recently_closed_producers:
                # Written before the client saw our CLOSE_PRODUCER: it resends after
                # re-creating the producer (Pulsar's recentlyClosedProducers).
                return
            self._fail(f"SEND for unknown producer {producer_id}")
            return
        if not producer.ready:
            # As Pulsar: a producer still queued for exclusive access must not publish.
            self._fail(f"SEND for producer {producer_id} that is not ready")
            return
        payload = send.payload
        # Counted against the publish buffer and the connection's pending-send limit until
        # its topic has stored it or failed it (server/publish_buffer.py).
        size = len(payload)
        publishes = self._publishes
        publishes.started(size)
        self.service.rate_limits.on_publish(producer.topic.name, publishes, send.num_messages, size)
        self.publisher.publish(
            producer,
            send.sequence_id,
            send.highest_sequence_id,
            payload,
            send.checksum_ok,
            publishes.finished,
            # Verified against the payload: storage keeps it instead of computing it again.
            send.checksum if send.checksum_ok else None,
        )

    def send_receipt(
        self, producer: Producer, sequence_id: int, highest_sequence_id: int, position: Position
    ) -> None:
        """Confirm a stored message to its producer."""
        if producer.closed:
            return
        # encode_send_receipt takes the ids as unsigned 64-bit values itself.
        self.write(
            encode_send_receipt(
                producer.producer_id, sequence_id, position[0], position[1], highest_sequence_id
            )
        )

    def send_error(
        self, producer: Producer, sequence_id: int, code: ServerError, message: str
    ) -> None:
        """Report a failed send to its producer (not to one the broker closed: its client
        resends what is pending once it has reconnected)."""
        if producer.closed:
            return
        self.send_command(
            T(
                type=T.SEND_ERROR,
                send_error=pb.CommandSendError(
                    producer_id=producer.producer_id,
                    sequence_id=sequence_id,
                    error=_wire_error(code),
                    message=message,
                ),
            )
        )

    def close_producer(self, producer: Producer) -> None:
        """Broker-initiated close: the client reconnects.

        SENDs already in flight for it are ignored for a keepalive interval, not taken as a
        protocol error that would close the connection and every producer and consumer on it.
        """
        pid = producer.producer_id
        self.producers.pop(pid, None)
        self.publisher.forget(pid)
        token = object()
        self._recently_closed_producers[pid] = token
        asyncio.get_running_loop().call_later(
            max(self.config.keepAliveIntervalSeconds, 1), self._forget_closed_producer, pid, token
        )
        self.send_command(
            T(
                type=T.CLOSE_PRODUCER,
                close_producer=pb.CommandCloseProducer(
                    producer_id=producer.producer_id, request_id=_U64 - 1
                ),
            )
        )

    def _forget_closed_producer(self, producer_id: int, token: object) -> None:
        if self._recently_closed_producers.get(producer_id) is token:
            del self._recently_closed_producers[producer_id]

    def _on_close_producer(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.close_producer
        producer = self.producers.pop(r.producer_id, None)
        self.publisher.forget(r.producer_id)
        if producer is not None:
            producer.topic.remove_producer(producer)
        self._success(r.request_id)
