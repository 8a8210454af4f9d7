"""The web server (admin REST, metrics), run by uvicorn inside the broker's event loop."""

from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from keyshared.standalone import Standalone


class WebServer:
    """uvicorn on a socket we bind ourselves, without uvicorn's signal handling."""

    def __init__(self, app: Standalone) -> None:
        self.standalone = app
        self.port = 0
        self.tls_port = 0
        self._server: Any = None
        self._task: asyncio.Task[Any] | None = None
        self._sockets: list[socket.socket] = []

    async def start(self) -> None:
        """Bind the web port and start serving."""
        import uvicorn

        from keyshared.admin.app import create_app

        cfg = self.standalone.config
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((cfg.bindAddress, cfg.webServicePort))
        sock.listen(128)
        sock.setblocking(False)
        self._sockets = [sock]
        self.port = sock.getsockname()[1]
        app = create_app(self.standalone.service)
        config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False)
        server = uvicorn.Server(config)
        if not config.loaded:
            config.load()
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=self._sockets)
        self._server = server
        self._task = asyncio.ensure_future(server.main_loop())

    async def stop(self) -> None:
        """Stop serving and close the socket."""
        server = self._server
        if server is None:
            return
        server.should_exit = True
        if self._task is not None:
            await self._task
        await server.shutdown(sockets=self._sockets)
        self._server = None
