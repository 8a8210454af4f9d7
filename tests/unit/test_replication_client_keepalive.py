"""The replicator's client gives up a remote that stops answering (a partition keeps the
socket open: only the keep-alive finds it out), and keeps one that answers its pings."""

from __future__ import annotations

import asyncio

from keyshared.broker.replication.client import RemoteConnection
from keyshared.protocol import FrameDecoder, commands, pb


async def _remote(answer_pings: bool) -> asyncio.Server:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder(5 * 1024 * 1024)
        while data := await reader.read(65536):
            decoder.feed(data)
            for frame in decoder:
                t = frame.command.type
                if t == pb.BaseCommand.CONNECT:
                    writer.write(commands.connected())
                elif t == pb.BaseCommand.PING and answer_pings:
                    writer.write(commands.pong())

    return await asyncio.start_server(serve, "127.0.0.1", 0)


async def _connected_after(answer_pings: bool, seconds: float) -> tuple[bool, str]:
    server = await _remote(answer_pings)
    port = server.sockets[0].getsockname()[1]
    conn = await RemoteConnection.open(f"pulsar://127.0.0.1:{port}", keepalive=0.2)
    try:
        await asyncio.sleep(seconds)
        return conn.error is None, str(conn.error or "")
    finally:
        conn.close()
        server.close()


def test_a_silent_remote_is_given_up() -> None:
    alive, why = asyncio.run(_connected_after(False, 1.5))
    assert not alive and "keep-alive" in why


def test_a_remote_that_answers_pings_is_kept() -> None:
    alive, why = asyncio.run(_connected_after(True, 1.5))
    assert alive, why
