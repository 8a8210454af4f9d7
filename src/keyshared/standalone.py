"""The standalone broker: storage, broker service, binary listener and web server in one loop."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keyshared.config import BrokerConfig

if TYPE_CHECKING:
    from keyshared.storage.disk import DiskThresholds

log = logging.getLogger("keyshared")


@dataclass
class StandaloneOptions:
    """What the ``standalone`` command line gives."""

    data_dir: str | None = None
    broker_port: int | None = None
    web_port: int | None = None
    config_file: str | None = None
    bind_address: str | None = None


def build_config(opts: StandaloneOptions) -> BrokerConfig:
    """Defaults, then the config file, then the environment, then the flags."""
    from keyshared.config import load_config

    overrides: dict[str, str] = {}
    if opts.data_dir is not None:
        overrides["dataDir"] = opts.data_dir
    if opts.broker_port is not None:
        overrides["brokerServicePort"] = str(opts.broker_port)
    if opts.web_port is not None:
        overrides["webServicePort"] = str(opts.web_port)
    if opts.bind_address is not None:
        overrides["bindAddress"] = opts.bind_address
    path = Path(opts.config_file) if opts.config_file else None
    return load_config(path, overrides=overrides)


class Standalone:
    """Everything a standalone broker runs, started and stopped in order."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.storage: Any = None
        self.service: Any = None
        self.server: Any = None
        self.web: Any = None
        self.authenticator: Any = None
        self.authorizer: Any = None
        self.web_ssl_context: Any = None
        self._stop = asyncio.Event()

    async def start(self) -> None:
        """Open storage, listen on the binary port, then bring up the web server."""
        from keyshared.broker.service import BrokerService
        from keyshared.server.authz import parse_roles
        from keyshared.server.broker_client_auth import may_create_default_namespace
        from keyshared.server.listener import BrokerServer
        from keyshared.server.security import build_security
        from keyshared.storage.store import Storage, StorageConfig

        cfg = self.config
        data_dir = Path(cfg.dataDir)
        # Storage.open creates it, syncing each new directory's parent (a power cut must not
        # take a fresh data directory's name, and with it every confirmed message, away).
        self.storage = Storage(
            data_dir,
            StorageConfig(
                journal_sync_data=cfg.journalSyncData,
                max_entries_per_ledger=cfg.managedLedgerMaxEntriesPerLedger,
                max_size_per_ledger_mb=cfg.managedLedgerMaxSizePerLedgerMbytes,
                cache_size_bytes=cfg.managedLedgerCacheSizeMB * 1024 * 1024,
                max_open_writable_segments=cfg.managedLedgerMaxOpenWritableLedgers,
                disk=disk_thresholds(cfg),
            ),
        )
        self.storage.open()
        self.service = BrokerService(cfg, self.storage, default_namespace=False)
        authn, authz, ssl_ctx, self.web_ssl_context = build_security(cfg, self.service)
        allowed, why = may_create_default_namespace(
            cfg, authn, set(parse_roles(cfg.superUserRoles))
        )
        if allowed:
            self.service.create_default_namespace()
        elif not self.service.namespace_exists("public/default"):
            log.warning("Failed to create the default tenant and namespace public/default: %s", why)
        self.authenticator, self.authorizer = authn, authz
        self.server = BrokerServer(
            self.service, authenticator=authn, authorizer=authz, ssl_context=ssl_ctx
        )
        await self.server.start()
        self.service.start_background_tasks()
        print(
            f"keyshared broker listening on pulsar://{cfg.advertisedAddress}:{self.server.port}",
            flush=True,
        )
        # The web stack (FastAPI, pydantic, uvicorn) takes most of a second to import. Import it
        # in a thread so the binary port serves clients meanwhile instead of stalling on it.
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, _import_web_stack)
        from keyshared.admin.web import WebServer

        self.web = WebServer(self)
        await self.web.start()
        self.service.clusters.set_local_ports(
            self.server.port, self.server.tls_port, self.web.port, self.web.tls_port
        )

    def request_stop(self) -> None:
        """Ask the broker to shut down (signal handlers call this)."""
        self._stop.set()

    async def wait(self) -> None:
        """Run until asked to stop."""
        await self._stop.wait()

    async def stop(self) -> None:
        """Stop listening, close topics (persisting cursors), close storage."""
        if self.web is not None:
            await self.web.stop()
        if self.server is not None:
            await self.server.stop()
        if self.service is not None:
            await self.service.close()
        if self.storage is not None:
            await self.storage.close()


def disk_thresholds(cfg: BrokerConfig) -> DiskThresholds:
    """The storage's disk thresholds from BookKeeper's keys; a bad combination is a
    configuration error."""
    from keyshared.config import ConfigError
    from keyshared.storage.disk import DiskThresholds

    try:
        return DiskThresholds(
            usage=cfg.diskUsageThreshold,
            warn=cfg.diskUsageWarnThreshold,
            lwm=cfg.diskUsageLwmThreshold,
            check_interval=cfg.diskCheckInterval / 1000.0,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _import_web_stack() -> None:
    import uvicorn  # noqa: F401

    import keyshared.admin.app
    import keyshared.admin.web  # noqa: F401


def _settle_gc() -> None:
    """Tune the cyclic garbage collector once everything is started.

    What exists now (modules, the web stack, config) lives as long as the process: freezing it
    keeps every later full collection from walking it again. Young collections run every 5,000
    container allocations instead of 700: the publish path allocates a few containers per
    message that mostly die young, and a collection's cost is the live young objects it finds,
    so collecting less often does less work in all, with pauses of a few milliseconds at most.
    Measured with one unbatched producer: broker CPU 54 -> 28-33 us per message, together with
    the entry cache keeping only untracked tuples (see ``storage/cache.py``).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(5000, 10, 10)


async def _run(config: BrokerConfig, started: float) -> None:
    app = Standalone(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, app.request_stop)
    try:
        await app.start()
        _settle_gc()
        elapsed = (time.monotonic() - started) * 1000
        host = config.advertisedAddress
        lines = [
            f"keyshared standalone ready in {elapsed:.0f} ms",
            f"  broker service: pulsar://{host}:{app.server.port}",
        ]
        if app.server.tls_port:
            lines.append(f"  broker service TLS: pulsar+ssl://{host}:{app.server.tls_port}")
        lines.append(f"  web service:    http://{host}:{app.web.port}")
        if app.web.tls_port:
            lines.append(f"  web service TLS: https://{host}:{app.web.tls_port}")
        lines.append(f"  data directory: {Path(config.dataDir).resolve()}")
        print("\n".join(lines), flush=True)
        await app.wait()
    finally:
        print("keyshared: shutting down", flush=True)
        await app.stop()
        print("keyshared: stopped", flush=True)


def run_standalone(opts: StandaloneOptions, started: float | None = None) -> int:
    """Run the standalone broker until SIGTERM or Ctrl-C. Returns the exit code."""
    started = time.monotonic() if started is None else started
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from keyshared.config import ConfigError

    try:
        config = build_config(opts)
    except (ConfigError, OSError) as exc:
        print(f"keyshared: configuration error: {exc}", file=sys.stderr)
        return 2
    for warning in config.warnings():
        print(f"keyshared: warning: {warning}", file=sys.stderr)
    # The journal thread needs the GIL back as soon as its fsync returns to confirm a group;
    # with Python's default 5 ms switch interval a busy loop thread adds up to 5 ms to every
    # publish. 1 ms keeps the tail short at a negligible cost in throughput.
    sys.setswitchinterval(0.001)
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        runner = asyncio.run
    try:
        runner(_run(config, started))
    except KeyboardInterrupt:  # pragma: no cover - the signal handler normally catches it
        pass
    except ConfigError as exc:
        # Security settings are checked when the broker starts (they need its metadata store).
        print(f"keyshared: configuration error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"keyshared: cannot start: {exc}", file=sys.stderr)
        return 1
    # Everything is persisted and closed by now. Tearing down the interpreter (modules, the
    # web stack's objects) takes seconds on a busy machine and does nothing useful: leave.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
