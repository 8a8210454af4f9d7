"""A minimal asyncio Pulsar client for the replicator: connect, look up, produce.

Built on the sans-IO codec in :mod:`keyshared.protocol` (the official ``pulsar-client`` is a
development dependency only), it speaks the public binary protocol as any client does, so the
same replicator ships data to a keyshared broker or an Apache Pulsar cluster. It does what the
replicator needs and nothing more: CONNECT with the cluster's credentials (answering
AUTH_CHALLENGE with them again; with ``tls`` the proof is the client certificate the TLS context
presents, see :mod:`.tls`), LOOKUP with redirects, PRODUCER, SEND and its receipts in
order, PING/PONG, and the client's keep-alive: a remote silent for an interval is pinged, and
one still silent an interval later is given up (a partitioned or frozen peer keeps its socket
open: without this the replicator would wait on its receipts for as long as TCP lets it, while
Pulsar's replication client, with the ordinary client's keep-alive, reconnects). Any failure (refused request, SEND_ERROR, CLOSE_PRODUCER, lost socket) ends
the whole connection: the replicator starts again from its cursor's mark-delete position.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections import deque
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from keyshared.broker.client_credentials import NO_CREDENTIALS, ClientCredentials
from keyshared.protocol import FrameDecoder, ProtocolError, commands, max_frame_size, pb
from keyshared.protocol.encode import encode_payload_command

log = logging.getLogger(__name__)

_T = pb.BaseCommand
CLIENT_VERSION = "keyshared-replicator"
MAX_REDIRECTS = 5
KEEPALIVE_SECONDS = 30.0
"""The client's ``keepAliveIntervalSeconds`` default (the broker passes its own setting)."""


class RemoteError(Exception):
    """The remote broker refused a request, failed a send, or the connection was lost."""


@dataclass(slots=True)
class _Pending:
    sequence_id: int
    future: asyncio.Future[tuple[int, int]]


class RemoteConnection:
    """One connection to a remote broker (see the module docstring)."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        url: str,
        credentials: ClientCredentials,
        keepalive: float = KEEPALIVE_SECONDS,
        tls: bool = False,
    ) -> None:
        self.url = url
        self.tls = tls
        self.credentials = credentials
        self._reader = reader
        self._writer = writer
        self._decoder = FrameDecoder(max_frame_size())
        self._request_id = 0
        self._requests: dict[int, asyncio.Future[pb.BaseCommand]] = {}
        self._connected: asyncio.Future[pb.BaseCommand] = asyncio.get_running_loop().create_future()
        self._sends: dict[int, deque[_Pending]] = {}
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.error: RemoteError | None = None
        self.local_address = ""
        sock = writer.get_extra_info("sockname")
        if isinstance(sock, tuple) and len(sock) >= 2:
            self.local_address = f"{sock[0]}:{sock[1]}"
        self.last_received = time.monotonic()
        self._task = asyncio.ensure_future(self._read_loop())
        self._pinger = asyncio.ensure_future(self._keepalive(keepalive)) if keepalive > 0 else None

    # --- opening ---------------------------------------------------------------------------
    @classmethod
    async def open(
        cls,
        url: str,
        credentials: ClientCredentials = NO_CREDENTIALS,
        timeout: float = 10.0,
        keepalive: float = KEEPALIVE_SECONDS,
        tls: ssl.SSLContext | None = None,
        proxy: tuple[str, int] | None = None,
    ) -> RemoteConnection:
        """Connect to ``pulsar://host:port`` (``pulsar+ssl://`` with ``tls``) and complete the
        CONNECT handshake; with an SNI ``proxy`` (TLS only) the TCP connection goes to the
        proxy and the URL's host is the TLS server name it routes by."""
        parsed = urlparse(url)
        scheme = "pulsar+ssl" if tls is not None else "pulsar"
        if parsed.scheme != scheme or not parsed.hostname or not parsed.port:
            raise RemoteError(f"unsupported broker service URL {url!r} ({scheme}://host:port)")
        if proxy is not None and tls is None:
            raise RemoteError(f"{url}: an SNI proxy needs TLS")
        host, port = proxy if proxy is not None else (parsed.hostname, parsed.port)
        via = f" through the SNI proxy {host}:{port}" if proxy is not None else ""
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(
                    host,
                    port,
                    ssl=tls,
                    server_hostname=parsed.hostname if tls is not None else None,
                ),
                timeout,
            )
        except (TimeoutError, OSError) as exc:
            raise RemoteError(f"cannot connect to {url}{via}: {exc!r}") from exc
        conn = cls(reader, writer, url, credentials, keepalive, tls is not None)
        try:
            conn._write(
                commands.connect(
                    client_version=CLIENT_VERSION,
                    auth_method_name=credentials.method,
                    auth_data=credentials.command_data,
                )
            )
            await asyncio.wait_for(asyncio.shield(conn._connected), timeout)
        except TimeoutError as exc:
            conn.close()
            raise RemoteError(f"{url}: no CONNECTED within {timeout:.0f}s") from exc
        except BaseException:
            conn.close()
            raise
        return conn

    # --- requests --------------------------------------------------------------------------
    def _next_request(self) -> tuple[int, asyncio.Future[pb.BaseCommand]]:
        self._request_id += 1
        fut: asyncio.Future[pb.BaseCommand] = asyncio.get_running_loop().create_future()
        self._requests[self._request_id] = fut
        return self._request_id, fut

    async def _request(
        self, frame: bytes, fut: asyncio.Future[pb.BaseCommand], timeout: float
    ) -> pb.BaseCommand:
        self._write(frame)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError as exc:
            raise RemoteError(f"{self.url}: no answer within {timeout:.0f}s") from exc

    async def lookup(
        self, topic: str, timeout: float = 10.0, listener_name: str = ""
    ) -> tuple[str | None, bool]:
        """Where ``topic`` is served: (None, _) when by this broker, else (url, authoritative)
        of the broker to ask (Redirect) or to connect to (Connect), by the URLs of the
        advertised listener ``listener_name`` (the remote's internal one when empty)."""
        rid, fut = self._next_request()
        frame = commands.lookup(topic=topic, request_id=rid, advertised_listener_name=listener_name)
        answer = await self._request(frame, fut, timeout)
        r = answer.lookupTopicResponse
        if r.response == pb.CommandLookupTopicResponse.Failed:
            raise RemoteError(f"lookup of {topic} failed: {r.message}")
        url = (r.brokerServiceUrlTls if self.tls else r.brokerServiceUrl) or None
        if r.proxy_through_service_url or url == self.url:
            return None, r.authoritative
        if r.response == pb.CommandLookupTopicResponse.Connect:
            return url, True
        return url, r.authoritative

    async def create_producer(
        self, topic: str, producer_id: int, producer_name: str, timeout: float = 30.0
    ) -> int:
        """Create a producer named ``producer_name``; returns its last sequence id."""
        rid, fut = self._next_request()
        frame = commands.producer(
            topic=topic, producer_id=producer_id, request_id=rid, producer_name=producer_name
        )
        answer = await self._request(frame, fut, timeout)
        self._sends[producer_id] = deque()
        return int(answer.producer_success.last_sequence_id)

    def send(
        self,
        producer_id: int,
        sequence_id: int,
        section: bytes,
        num_messages: int,
        marker: bool = False,
    ) -> asyncio.Future[tuple[int, int]]:
        """Send one payload section; the future ends with the stored (ledger, entry) id or a
        :class:`RemoteError` (receipts come in order, as the broker answers a producer)."""
        fut: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        if self.error is not None:
            fut.set_exception(self.error)
            return fut
        cmd = pb.BaseCommand(type=_T.SEND)
        cmd.send.producer_id = producer_id
        cmd.send.sequence_id = sequence_id
        cmd.send.num_messages = num_messages
        if marker:
            # A replicated-subscription marker: the remote skips deduplication for it.
            cmd.send.marker = True
        self._sends.setdefault(producer_id, deque()).append(_Pending(sequence_id, fut))
        self._write(encode_payload_command(cmd, section))
        return fut

    async def drain(self) -> None:
        """Wait while the socket's write buffer is full."""
        try:
            await self._writer.drain()
        except OSError as exc:
            raise RemoteError(f"{self.url}: connection lost: {exc!r}") from exc

    # --- the wire --------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        if self.error is not None:
            raise self.error
        self._writer.write(data)

    async def _read_loop(self) -> None:
        why = "connection closed by the remote broker"
        try:
            while True:
                data = await self._reader.read(65536)
                if not data:
                    break
                self.last_received = time.monotonic()
                self._decoder.feed(data)
                for frame in self._decoder:
                    self._on_command(frame.command)
        except RemoteError as exc:
            why = str(exc)
        except (OSError, ProtocolError) as exc:
            why = f"connection lost: {exc!r}"
        except asyncio.CancelledError:
            why = "connection closed"
        self._fail(RemoteError(f"{self.url}: {why}"))

    async def _keepalive(self, interval: float) -> None:
        """Ping a remote silent for ``interval``; give it up when the ping went unanswered
        (anything received counts as an answer, as in Pulsar's ``ClientCnx``)."""
        ping_sent: float | None = None
        while self.error is None:
            await asyncio.sleep(interval if ping_sent is not None else interval / 2)
            now = time.monotonic()
            if ping_sent is not None:
                if self.last_received < ping_sent:
                    self._fail(RemoteError(f"{self.url}: no answer to a keep-alive ping"))
                    return
                ping_sent = None
            if now - self.last_received >= interval and self.error is None:
                ping_sent = now
                self._writer.write(commands.ping())

    def _on_command(self, cmd: pb.BaseCommand) -> None:
        t = cmd.type
        if t == _T.CONNECTED:
            if not self._connected.done():
                self._connected.set_result(cmd)
        elif t == _T.AUTH_CHALLENGE:
            # The broker asks again (refresh): the same credentials.
            self._write(
                commands.auth_response(
                    auth_method_name=self.credentials.method,
                    auth_data=self.credentials.command_data or b"",
                    client_version=CLIENT_VERSION,
                )
            )
        elif t == _T.PING:
            self._write(commands.pong())
        elif t == _T.SEND_RECEIPT:
            r = cmd.send_receipt
            queue = self._sends.get(r.producer_id)
            if not queue or queue[0].sequence_id != r.sequence_id:
                raise RemoteError(f"unexpected receipt for sequence id {r.sequence_id}")
            pending = queue.popleft()
            if not pending.future.done():
                pending.future.set_result((r.message_id.ledgerId, r.message_id.entryId))
        elif t == _T.SEND_ERROR:
            e = cmd.send_error
            raise RemoteError(f"send failed: {pb.ServerError.Name(e.error)}: {e.message}")
        elif t == _T.CLOSE_PRODUCER:
            raise RemoteError("the remote broker closed the producer")
        elif t in (_T.SUCCESS, _T.PRODUCER_SUCCESS, _T.LOOKUP_RESPONSE, _T.ERROR):
            self._answer(cmd)
        # Anything else (e.g. TOPIC_MIGRATED) is not the replicator's business.

    def _answer(self, cmd: pb.BaseCommand) -> None:
        t = cmd.type
        sub: Any
        if t == _T.SUCCESS:
            sub = cmd.success
        elif t == _T.PRODUCER_SUCCESS:
            sub = cmd.producer_success
            if sub.HasField("producer_ready") and not sub.producer_ready:
                return  # queued for exclusive access: a second PRODUCER_SUCCESS follows
        elif t == _T.LOOKUP_RESPONSE:
            sub = cmd.lookupTopicResponse
        else:
            sub = cmd.error
        fut = self._requests.pop(sub.request_id, None)
        if fut is None or fut.done():
            return
        if t == _T.ERROR:
            fut.set_exception(RemoteError(f"{pb.ServerError.Name(sub.error)}: {sub.message}"))
        else:
            fut.set_result(cmd)

    def _fail(self, error: RemoteError) -> None:
        if self.error is None:
            self.error = error
        if not self._connected.done():
            self._connected.set_exception(error)
        for fut in self._requests.values():
            if not fut.done():
                fut.set_exception(error)
        self._requests.clear()
        for queue in self._sends.values():
            for p in queue:
                if not p.future.done():
                    p.future.set_exception(error)
            queue.clear()
        if not self.closed.done():
            self.closed.set_result(None)
        with contextlib.suppress(Exception):
            self._writer.close()

    def close(self) -> None:
        """Close the connection; whatever is pending fails with :class:`RemoteError`."""
        self._fail(RemoteError(f"{self.url}: connection closed"))
        self._task.cancel()
        if self._pinger is not None:
            self._pinger.cancel()


async def connect_for_topic(
    url: str,
    topic: str,
    credentials: ClientCredentials,
    timeout: float = 10.0,
    keepalive: float = KEEPALIVE_SECONDS,
    tls: ssl.SSLContext | None = None,
    proxy: tuple[str, int] | None = None,
    listener_name: str = "",
) -> RemoteConnection:
    """A connection to the broker of the remote cluster at ``url`` that serves ``topic``,
    following lookup redirects as the clients do (to TLS URLs over TLS, each through the SNI
    ``proxy`` when there is one; the lookups ask for the advertised listener
    ``listener_name``)."""
    conn = await RemoteConnection.open(url, credentials, timeout, keepalive, tls, proxy)
    for _ in range(MAX_REDIRECTS):
        try:
            target, _authoritative = await conn.lookup(topic, timeout, listener_name)
        except BaseException:
            conn.close()
            raise
        if target is None:
            return conn
        conn.close()
        conn = await RemoteConnection.open(target, credentials, timeout, keepalive, tls, proxy)
    conn.close()
    raise RemoteError(f"lookup of {topic} redirected more than {MAX_REDIRECTS} times")
