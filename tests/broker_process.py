"""Start and stop a real ``keyshared standalone`` process for tests and benchmarks."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Attempts of a first start whose chosen ports another process took between the check and the bind.
_FIRST_START_TRIES = 5


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out for outgoing connections and binds to port 0."""
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def listen_ports(count: int = 2) -> list[int]:
    """``count`` loopback ports that are free now and below the kernel's ephemeral range.

    A restarted broker binds its old ports again. Had they come from port 0 (the ephemeral
    range), any client connecting anywhere in the meantime could have been given one as its
    source port, and the restart fails with "Address already in use" through no fault of the
    broker (seen under three pytest workers). Below the range only another such choice can
    take them; 0 (the kernel's choice) when the range leaves no room below it.
    """
    low = _ephemeral_low()
    if low <= 10_000 + 1_000:
        return [0] * count
    rng = random.Random(os.urandom(8))
    ports: list[int] = []
    while len(ports) < count:
        port = rng.randrange(10_000, low)
        if port in ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
    return ports


def free_port() -> int:
    """One loopback port free now: for ports a test hands out itself (TLS listeners, which have
    no ``0`` option; other daemons; an address nothing listens on). From below the ephemeral
    range as :func:`listen_ports` chooses, or the kernel's choice where that range leaves none."""
    port = listen_ports(1)[0]
    if port:
        return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        chosen: int = s.getsockname()[1]
        return chosen


_READY = re.compile(r"broker service: pulsar://([^:/\s]+):(\d+)")
_WEB = re.compile(r"web service:\s+http://([^:/\s]+):(\d+)")


class PortTaken(RuntimeError):
    """The broker could not bind a port it was given."""


class BrokerProcess:
    """A standalone broker in its own process, on free loopback ports."""

    def __init__(
        self,
        data_dir: Path | None = None,
        conf: Mapping[str, object] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="keyshared-test-")
        self.root = Path(self._tmp.name)
        self.data_dir = data_dir or self.root / "data"
        self.conf = dict(conf or {})
        self.env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.web_port = 0
        self.log_path = self.root / "broker.log"
        self.starts = 0

    @property
    def service_url(self) -> str:
        """``pulsar://127.0.0.1:PORT``."""
        return f"pulsar://127.0.0.1:{self.port}"

    @property
    def web_url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.web_port}"

    def start(self, timeout: float = 20.0, *, same_ports: bool = False) -> BrokerProcess:
        """Start the broker and wait until it prints where it listens.

        A first start listens on ports from :func:`listen_ports` (tried again on others if one
        was taken meanwhile); ``same_ports`` binds the ports of the last start again."""
        if same_ports:
            return self._start(self.port, self.web_port, timeout)
        for attempt in range(_FIRST_START_TRIES):
            port, web_port = listen_ports(2)
            try:
                return self._start(port, web_port, timeout)
            except PortTaken:
                if attempt == _FIRST_START_TRIES - 1:
                    raise
        raise AssertionError("unreachable")

    def _start(self, port: int, web_port: int, timeout: float) -> BrokerProcess:
        conf_path = self.root / "broker.conf"
        conf_path.write_text("".join(f"{k}={v}\n" for k, v in self.conf.items()))
        self.starts += 1
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        log.write(f"\n===== start {self.starts} =====\n".encode())
        log.flush()
        env = dict(os.environ)
        env.update(self.env)
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "keyshared.cli",
                "standalone",
                "--data-dir",
                str(self.data_dir),
                "--broker-port",
                str(port),
                "--web-port",
                str(web_port),
                "--bind-address",
                "127.0.0.1",
                "--config",
                str(conf_path),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        log.close()
        deadline = time.monotonic() + timeout
        start_marker = f"===== start {self.starts} =====".encode()
        while time.monotonic() < deadline:
            text = self.log_path.read_bytes()
            text = text[text.rfind(start_marker) :].decode(errors="replace")
            m, w = _READY.search(text), _WEB.search(text)
            if m and w:
                self.port = int(m.group(2))
                self.web_port = int(w.group(2))
                return self
            if self.proc.poll() is not None:
                error = PortTaken if "Address already in use" in text else RuntimeError
                raise error(f"broker exited with {self.proc.returncode}:\n{text}")
            time.sleep(0.02)
        self.kill()
        raise TimeoutError(f"broker did not start in {timeout}s:\n{self.log()}")

    def log(self) -> str:
        """Everything the broker printed."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait for a clean exit; returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                raise
        return self.proc.returncode

    def restart(self, *, crash: bool = False) -> BrokerProcess:
        """Stop (or SIGKILL) and start again on the same ports and data."""
        if crash:
            self.kill()
        else:
            self.stop()
        return self.start(same_ports=True)

    def admin(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One admin REST call; returns (status, parsed JSON or text)."""
        import json

        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.web_url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                raw = resp.read()
                status = resp.status
        except urllib.error.HTTPError as err:
            raw = err.read()
            status = err.code
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def close(self) -> None:
        """Stop the process and remove its files."""
        with contextlib.suppress(Exception):
            self.stop(5)
        self.kill()
        self._tmp.cleanup()


@contextlib.contextmanager
def running_broker(**kwargs: Any) -> Iterator[BrokerProcess]:
    """A started broker, stopped and cleaned up afterwards."""
    broker = BrokerProcess(**kwargs)
    try:
        yield broker.start()
    finally:
        broker.close()


def quiet_logger() -> logging.Logger:
    """A logger for pulsar.Client that only shows warnings."""
    logger = logging.getLogger("pulsar-client")
    logger.setLevel(logging.WARNING)
    return logger
