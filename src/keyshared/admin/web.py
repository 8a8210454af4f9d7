"""The web server (admin REST, metrics), run by uvicorn inside the broker's event loop."""

from __future__ import annotations

import asyncio
import socket
import ssl
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from keyshared.standalone import Standalone


class WebServer:
    """uvicorn on sockets we bind ourselves, without uvicorn's signal handling.

    The plain port always; the TLS port (``webServicePortTls``) too when the broker has a web TLS
    context. When authentication is on, every request goes through admin.http_auth first.
    """

    def __init__(self, app: Standalone) -> None:
        self.standalone = app
        self.port = 0
        self.tls_port = 0
        self._running: list[tuple[Any, asyncio.Task[Any], list[socket.socket]]] = []

    async def start(self) -> None:
        """Bind the web port(s) and start serving."""
        from keyshared.admin.app import create_app

        cfg = self.standalone.config
        app: Any = create_app(self.standalone.service)
        authn = getattr(self.standalone, "authenticator", None)
        if authn is not None:
            from keyshared.admin.http_auth import SecuredApp

            app = SecuredApp(
                app,
                authn,
                getattr(self.standalone, "authorizer", None),
                public_metrics=not cfg.authenticateMetricsEndpoint,
            )
        self.port = await self._serve(app, cfg.bindAddress, cfg.webServicePort, None)
        tls_ctx: ssl.SSLContext | None = getattr(self.standalone, "web_ssl_context", None)
        if tls_ctx is not None and cfg.webServicePortTls:
            self.tls_port = await self._serve(app, cfg.bindAddress, cfg.webServicePortTls, tls_ctx)

    async def _serve(self, app: Any, host: str, port: int, tls: ssl.SSLContext | None) -> int:
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
        config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False)
        server = uvicorn.Server(config)
        if not config.loaded:
            config.load()
        # uvicorn serves given sockets with config.ssl; ours carries the broker's TLS settings.
        config.ssl = tls
        if tls is not None:
            from keyshared.admin.web_tls import tls_aware

            config.http_protocol_class = tls_aware(config.http_protocol_class)
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=[sock])
        task = asyncio.ensure_future(server.main_loop())
        self._running.append((server, task, [sock]))
        bound: int = sock.getsockname()[1]
        return bound

    async def stop(self) -> None:
        """Stop serving and close the sockets."""
        running, self._running = self._running, []
        for server, _, _ in running:
            server.should_exit = True
        for server, task, sockets in running:
            await task
            await server.shutdown(sockets=sockets)
