"""A small layer-4 SNI-routing proxy for tests, as Apache Traffic Server is set up for Pulsar's
PIP-60: it reads the TLS ClientHello, routes the connection by its server name to a
``host:port`` from its table and then copies bytes both ways without terminating TLS. A server
name it has no route for (or none at all) gets the connection closed.

It runs its own event loop in a thread, so synchronous tests can use it around broker processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
from collections import Counter
from collections.abc import Mapping

_HANDSHAKE = 0x16
_CLIENT_HELLO = 0x01
_SERVER_NAME = 0x0000


class ClientHelloError(ValueError):
    """The bytes are not a TLS ClientHello this proxy can read."""


def server_name(record: bytes) -> str | None:
    """The host name in the SNI extension of a ClientHello ``record`` (None: none sent)."""
    try:
        if record[0] != _HANDSHAKE or record[5] != _CLIENT_HELLO:
            raise ClientHelloError("not a ClientHello")
        at = 5 + 4 + 2 + 32  # record header, handshake header, version, random
        at += 1 + record[at]  # session id
        (n,) = struct.unpack_from("!H", record, at)
        at += 2 + n  # cipher suites
        at += 1 + record[at]  # compression methods
        if at >= len(record):
            return None  # no extensions
        (total,) = struct.unpack_from("!H", record, at)
        at += 2
        end = at + total
        while at + 4 <= end:
            kind, size = struct.unpack_from("!HH", record, at)
            at += 4
            if kind == _SERVER_NAME:
                # server_name_list: length, then (type, length, name) entries.
                item = at + 2
                while item + 3 <= at + size:
                    name_type, name_len = struct.unpack_from("!BH", record, item)
                    if name_type == 0:
                        return record[item + 3 : item + 3 + name_len].decode("ascii")
                    item += 3 + name_len
                return None
            at += size
        return None
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise ClientHelloError(str(exc)) from exc


class SniProxy:
    """Listens on 127.0.0.1; routes by SNI through ``routes`` (name to ``(host, port)``)."""

    def __init__(self, routes: Mapping[str, tuple[str, int]]) -> None:
        self.routes = dict(routes)
        self.routed: Counter[str] = Counter()
        """Connections routed, by server name."""
        self.refused: list[str | None] = []
        """Server names of the connections closed for want of a route."""
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        """``pulsar+ssl://127.0.0.1:PORT``, the ``proxyServiceUrl`` to register."""
        return f"pulsar+ssl://127.0.0.1:{self.port}"

    def start(self) -> SniProxy:
        """Start listening (on a free port)."""
        self._thread.start()

        async def listen() -> asyncio.Server:
            return await asyncio.start_server(self._serve, "127.0.0.1", 0)

        self._server = asyncio.run_coroutine_threadsafe(listen(), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def close(self) -> None:
        """Stop listening and drop every connection."""

        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> SniProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        upstream: asyncio.StreamWriter | None = None
        try:
            header = await reader.readexactly(5)
            (length,) = struct.unpack_from("!H", header, 3)
            record = header + await reader.readexactly(length)
            name = server_name(record)
            route = self.routes.get(name or "")
            if route is None:
                self.refused.append(name)
                return
            self.routed[name or ""] += 1
            up_reader, upstream = await asyncio.open_connection(*route)
            upstream.write(record)
            await asyncio.gather(_pipe(reader, upstream), _pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError, ClientHelloError):
            pass
        finally:
            for w in (writer, upstream):
                if w is not None:
                    w.close()
            self._tasks.discard(task)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until the reader ends, then half-close (a reset ends the copy too)."""
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
