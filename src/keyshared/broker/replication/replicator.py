"""One topic's replicator towards one remote cluster: a durable cursor and a remote producer.

The replicator reads the topic with its cursor ``pulsar.repl.{remote}``, forwards each entry
whole to the same topic on the remote cluster through :mod:`.client` (producer
``pulsar.repl.{local}-->{remote}``), and moves its mark-delete position over an entry only once
the remote confirmed it (entries it skips are confirmed at once, in order with the others).

Failure handling is Pulsar's: on any failure (connection lost, refused, SEND_ERROR) the session
ends, the cursor is *rewound* to the entry after its mark-delete position and everything not
confirmed is sent again after a back-off (100 ms doubling to a minute). The cursor's epoch rule
(seed ``issue-20277-pip-269-cursor-read-epoch``) makes this safe: a read still in flight when the
session ends is cancelled and, issued in the old epoch, completes stale: it can never move the
read position past entries the rewind asked to read again. Entries the remote stored but whose
receipt was lost are resent; the remote drops them by their original producer name and sequence
id (deduplication on, as in Pulsar), so each message is stored there once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from keyshared.broker.client_credentials import ClientCredentials, CredentialsError
from keyshared.broker.rates import RateMeter
from keyshared.broker.replication.client import (
    KEEPALIVE_SECONDS,
    RemoteConnection,
    RemoteError,
    connect_for_topic,
)
from keyshared.broker.replication.decisions import (
    Backoff,
    forward_section,
    replicator_producer_name,
    should_forward,
)
from keyshared.broker.replication.tasks import cancel_and_wait
from keyshared.broker.replication.tls import RemoteUrls
from keyshared.broker.topic_common import iso_time
from keyshared.protocol import ProtocolError, split_payload
from keyshared.protocol.metadata import num_messages
from keyshared.storage.cursor import ManagedCursor
from keyshared.storage.position import Position

log = logging.getLogger(__name__)

READ_BATCH = 100
"""Entries per cursor read (Pulsar's ``dispatcherMaxReadBatchSize`` default)."""
MAX_PENDING = 1000
"""Sends awaiting the remote's receipt (Pulsar's ``replicationProducerQueueSize``)."""

RemoteTarget = Callable[[], tuple[str, ClientCredentials]]
"""The remote cluster's ``brokerServiceUrl`` (``brokerServiceUrlTls`` over TLS) and credentials,
read afresh at each connection (raises :class:`RemoteError` when the cluster is not known)."""


class _Restart(Exception):
    """The cursor was moved by hand: start a new session from its mark-delete position."""


@dataclass(slots=True)
class _InFlight:
    position: Position
    future: asyncio.Future[tuple[int, int]] | None
    publish_time: int


class Replicator:
    """Replicates one (non-partitioned or partition) topic to one remote cluster."""

    def __init__(
        self,
        *,
        topic: str,
        local: str,
        remote: str,
        cursor: ManagedCursor,
        target: RemoteTarget,
        read_batch: int = READ_BATCH,
        max_pending: int = MAX_PENDING,
        backoff: Backoff | None = None,
        keepalive: float = KEEPALIVE_SECONDS,
        prepare: Callable[[], Awaitable[None]] | None = None,
        route: Callable[[], RemoteUrls] | None = None,
    ) -> None:
        self.topic = topic
        self.local = local
        self.remote = remote
        self.cursor = cursor
        self.target = target
        self.read_batch = read_batch
        self.max_pending = max_pending
        self.backoff = backoff or Backoff()
        self.keepalive = keepalive
        # Run before each connection: makes the topic exist on the remote (remote_topic.py).
        self.prepare = prepare
        # How the target is reached (replication/tls.py: the TLS context for a pulsar+ssl
        # target, an SNI proxy), read with the target at each connection.
        self.route = route
        self.producer_name = replicator_producer_name(local, remote)
        self.connected = False
        self.connected_since: float | None = None
        self.outbound_address = ""
        self.last_error = ""
        self.msg_out_counter = 0
        self.bytes_out_counter = 0
        self.skipped_counter = 0
        self.sessions = 0
        self.rates = RateMeter()
        # Publish time (ms) of the oldest entry read but not yet confirmed (0: none).
        self._oldest_pending_ms = 0
        self._task: asyncio.Task[None] | None = None

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Start replicating (in the running event loop)."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        """Stop replicating; the cursor stays open (its owner closes or deletes it)."""
        task, self._task = self._task, None
        if task is not None:
            self.cursor.cancel_pending_read()
            await cancel_and_wait([task])
        self.connected = False

    # --- the sessions ------------------------------------------------------------------------
    async def _run(self) -> None:
        while not self.cursor.closed:
            conn: RemoteConnection | None = None
            try:
                url, credentials = self.target()
                route = self.route() if self.route is not None else None
                if self.prepare is not None:
                    await self.prepare()
                conn = await connect_for_topic(
                    url,
                    self.topic,
                    credentials,
                    keepalive=self.keepalive,
                    tls=route.ssl if route is not None else None,
                    proxy=route.proxy if route is not None else None,
                    listener_name=route.listener_name if route is not None else "",
                )
                await conn.create_producer(self.topic, 1, self.producer_name)
                self.sessions += 1
                self.connected = True
                self.connected_since = time.time()
                self.outbound_address = conn.local_address
                self.last_error = ""
                self.backoff.reset()
                log.info("%s: replicating to %s (%s)", self.topic, self.remote, url)
                await self._session(conn)
            except (RemoteError, CredentialsError, _Restart) as exc:
                if str(exc) != self.last_error:
                    log.warning("%s: replicator to %s: %s", self.topic, self.remote, exc)
                self.last_error = str(exc)
            except Exception as exc:  # a bug must not stop replication for good
                log.exception("%s: replicator to %s failed", self.topic, self.remote)
                self.last_error = repr(exc)
            finally:
                self.connected = False
                self.connected_since = None
                if conn is not None:
                    conn.close()
            if self.cursor.closed:
                return
            # Send again everything not confirmed: a new epoch, so a read of the session that
            # just ended can never move the read position any more.
            self.cursor.cancel_pending_read()
            self.cursor.rewind()
            await asyncio.sleep(self.backoff.next())

    async def _session(self, conn: RemoteConnection) -> None:
        """Forward entries until something fails (raises); confirms them in order."""
        in_flight: deque[_InFlight] = deque()
        more = asyncio.Event()
        room = asyncio.Event()
        room.set()
        epoch = self.cursor.epoch

        async def read_and_send() -> None:
            while True:
                if len(in_flight) >= self.max_pending:
                    room.clear()
                    await room.wait()
                    continue
                result = await self.cursor.read_entries_or_wait(self.read_batch)
                if result.stale or self.cursor.epoch != epoch:
                    raise _Restart("cursor moved while reading: starting again")
                for entry in result.entries:
                    in_flight.append(self._forward(conn, entry.position, entry.data))
                more.set()
                await conn.drain()

        async def confirm() -> None:
            while True:
                if not in_flight:
                    self._oldest_pending_ms = 0
                    more.clear()
                    await more.wait()
                    continue
                head = in_flight[0]
                self._oldest_pending_ms = head.publish_time
                if head.future is not None:
                    await head.future  # raises RemoteError on failure
                last = in_flight.popleft().position
                while in_flight and _confirmed(in_flight[0]):
                    last = in_flight.popleft().position
                if self.cursor.epoch != epoch:
                    raise _Restart("cursor moved while sending: starting again")
                self.cursor.ack_cumulative(last)
                self.cursor.persist()
                room.set()

        tasks = [
            asyncio.ensure_future(read_and_send()),
            asyncio.ensure_future(confirm()),
        ]
        closed = asyncio.ensure_future(asyncio.shield(conn.closed))
        try:
            done, _ = await asyncio.wait([*tasks, closed], return_when=asyncio.FIRST_COMPLETED)
            for task in tasks:
                exc = task.exception() if task in done else None
                if exc is not None:
                    raise exc
            raise conn.error or RemoteError(f"{conn.url}: session ended")
        finally:
            self.cursor.cancel_pending_read()
            closed.cancel()
            for f in in_flight:
                if f.future is not None and not f.future.done():
                    f.future.cancel()
            await cancel_and_wait(tasks)

    def _forward(self, conn: RemoteConnection, position: Position, data: bytes) -> _InFlight:
        try:
            md, payload = split_payload(data)
        except ProtocolError:
            # Stored entries were parsed when published; one that no longer parses cannot be
            # sent anywhere: skip it rather than block replication forever.
            log.error("%s: entry %s is unreadable, not replicated", self.topic, position)
            self.skipped_counter += 1
            return _InFlight(position, None, 0)
        if not should_forward(md, self.remote):
            self.skipped_counter += 1
            return _InFlight(position, None, md.publish_time)
        section = forward_section(md, payload, self.local)
        n = num_messages(md)
        fut = conn.send(1, md.sequence_id, section, n, marker=md.marker_type != 0)
        self.msg_out_counter += n
        self.bytes_out_counter += len(section)
        return _InFlight(position, fut, md.publish_time)

    # --- stats ---------------------------------------------------------------------------------
    @property
    def backlog(self) -> int:
        """Entries not yet confirmed by the remote (Pulsar's ``replicationBacklog``)."""
        return self.cursor.number_of_entries_in_backlog

    def stats(self) -> dict[str, Any]:
        """The outbound half of Pulsar's ``ReplicatorStats`` (the topic adds the inbound one)."""
        rate_out, throughput_out = self.rates.rates(self.msg_out_counter, self.bytes_out_counter)
        backlog = self.backlog
        delay = 0.0
        if backlog and self._oldest_pending_ms:
            delay = max(time.time() - self._oldest_pending_ms / 1000.0, 0.0)
        return {
            "msgRateOut": rate_out,
            "msgThroughputOut": throughput_out,
            "msgRateExpired": 0.0,
            "replicationBacklog": backlog,
            "connected": self.connected,
            "replicationDelayInSeconds": int(delay),
            "outboundConnection": self.outbound_address if self.connected else None,
            "outboundConnectedSince": _iso(self.connected_since),
            "msgOutCount": self.msg_out_counter,
            "bytesOutCount": self.bytes_out_counter,
        }


def _confirmed(f: _InFlight) -> bool:
    """Skipped, or stored by the remote."""
    fut = f.future
    return fut is None or (fut.done() and not fut.cancelled() and fut.exception() is None)


def _iso(ts: float | None) -> str | None:
    return iso_time(ts) if ts is not None else None
