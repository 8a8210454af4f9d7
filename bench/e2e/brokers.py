"""Start and stop the brokers under test as subprocesses, bound to 127.0.0.1 only.

Each start gets a fresh data directory inside a temporary directory, so no run sees another
run's data (and no background compaction from an earlier run steals CPU from a later one).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

HOST = "127.0.0.1"
LISTEN_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0

BROKER_NAMES = ("keyshared", "pulsar-lite")

_KEYSHARED_BINDS: bool | None = None


class BrokerStartError(RuntimeError):
    """The broker process exited or never accepted a connection."""


def free_port() -> int:
    """Return a port the kernel considers free on 127.0.0.1 (bind to port 0, then release)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def pulsar_lite_binary() -> Path:
    """Path of the broker binary shipped inside the ``pulsar-lite`` wheel."""
    spec = importlib.util.find_spec("pulsar_lite")
    if spec is None or spec.origin is None:
        raise BrokerStartError("pulsar-lite is not installed: .venv/bin/pip install pulsar-lite")
    binary = Path(spec.origin).parent / "bin" / "pulsar-lite"
    if not binary.exists():
        raise BrokerStartError(f"pulsar-lite binary not found at {binary}")
    return binary


def keyshared_binary() -> Path:
    """Path of the ``keyshared`` console script in the running virtualenv."""
    binary = Path(sys.executable).parent / "keyshared"
    if not binary.exists():
        raise BrokerStartError(f"keyshared console script not found at {binary}")
    return binary


@dataclass
class RunningBroker:
    """A started broker process and what is needed to reach and clean it up."""

    name: str
    process: subprocess.Popen[bytes]
    port: int
    workdir: Path
    log_path: Path
    popen_at: float
    listening_at: float = 0.0
    web_port: int | None = None
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """The ``pulsar://`` service URL."""
        return f"pulsar://{HOST}:{self.port}"

    @property
    def listen_s(self) -> float:
        """Seconds from ``Popen`` to the first successful TCP connect."""
        return self.listening_at - self.popen_at

    def cpu_seconds(self) -> float:
        """User + system CPU seconds the broker process has used so far (Linux ``/proc``)."""
        try:
            stat = Path(f"/proc/{self.process.pid}/stat").read_text()
        except OSError:
            return float("nan")
        # Fields after the parenthesised command name; utime and stime are fields 14 and 15.
        fields = stat.rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the broker's combined stdout/stderr, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _pulsar_lite_command(workdir: Path, port: int) -> tuple[list[str], int | None]:
    config = workdir / "pulsar-lite.toml"
    # Without this section pulsar-lite opens a metrics HTTP listener on 0.0.0.0:8080.
    config.write_text("[metrics]\nenabled = false\n")
    command = [
        str(pulsar_lite_binary()),
        "--config",
        str(config),
        "--addr",
        f"{HOST}:{port}",
        "--db-path",
        str(workdir / "db"),
        "--log-level",
        "warn",
    ]
    return command, None


def _keyshared_help() -> str:
    probe = subprocess.run(
        [str(keyshared_binary()), "standalone", "--help"],
        capture_output=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        tail = probe.stderr.decode(errors="replace").strip().splitlines()[-1:]
        raise BrokerStartError(f"`keyshared standalone --help` failed: {' '.join(tail)}")
    return probe.stdout.decode(errors="replace")


def _keyshared_command(workdir: Path, port: int) -> tuple[list[str], int | None]:
    web_port = free_port()
    global _KEYSHARED_BINDS
    if _KEYSHARED_BINDS is None:
        _KEYSHARED_BINDS = "--bind-address" in _keyshared_help()
    # Loopback only; the flag is optional in the CLI contract, so use it when it exists.
    bind = ["--bind-address", HOST] if _KEYSHARED_BINDS else []
    command = [
        str(keyshared_binary()),
        "standalone",
        "--data-dir",
        str(workdir / "data"),
        "--broker-port",
        str(port),
        "--web-port",
        str(web_port),
        *bind,
    ]
    return command, web_port


COMMANDS: dict[str, Callable[[Path, int], tuple[list[str], int | None]]] = {
    "keyshared": _keyshared_command,
    "pulsar-lite": _pulsar_lite_command,
}


def broker_available(name: str) -> str | None:
    """Return None when ``name`` can be launched here, else the reason it cannot."""
    try:
        if name == "pulsar-lite":
            pulsar_lite_binary()
        elif name == "keyshared":
            _keyshared_help()
        else:
            return f"unknown broker {name!r}"
    except (BrokerStartError, subprocess.TimeoutExpired) as error:
        return str(error)
    return None


def _wait_listening(broker: RunningBroker, deadline: float) -> None:
    while True:
        if broker.process.poll() is not None:
            raise BrokerStartError(
                f"{broker.name} exited with {broker.process.returncode} before listening:\n"
                + broker.log_tail()
            )
        try:
            with socket.create_connection((HOST, broker.port), timeout=0.5):
                broker.listening_at = time.perf_counter()
                return
        except OSError:
            if time.perf_counter() > deadline:
                raise BrokerStartError(
                    f"{broker.name} not listening on {broker.port} after {LISTEN_TIMEOUT_S} s:\n"
                    + broker.log_tail()
                ) from None
            time.sleep(0.002)


def compile_keyshared() -> None:
    """Byte-compile the keyshared package the broker will import, as ``pip install`` does.

    An editable install run under ``PYTHONDONTWRITEBYTECODE=1`` (this machine's environment)
    compiles every module from source at every start, which doubles the CPU a start takes
    before it listens; start-up figures are of an installed broker, so compile first.
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    script = "import compileall, os, keyshared; compileall.compile_dir(os.path.dirname(keyshared.__file__), quiet=1)"
    subprocess.run([sys.executable, "-c", script], env=env, check=False, capture_output=True)


def start(name: str, parent_dir: Path) -> RunningBroker:
    """Start broker ``name`` in a fresh directory under ``parent_dir``; wait until it listens."""
    workdir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=parent_dir))
    port = free_port()
    command, web_port = COMMANDS[name](workdir, port)
    log_path = workdir / "broker.log"
    with log_path.open("wb") as log:
        popen_at = time.perf_counter()
        # A new session, so a Ctrl-C in the terminal reaches us (we stop it) and not the broker.
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            start_new_session=True,
        )
    broker = RunningBroker(
        name=name,
        process=process,
        port=port,
        workdir=workdir,
        log_path=log_path,
        popen_at=popen_at,
        web_port=web_port,
    )
    try:
        _wait_listening(broker, popen_at + LISTEN_TIMEOUT_S)
    except BaseException:
        stop(broker)
        raise
    return broker


# What a broker prints once everything is up (keyshared imports its web stack in a thread
# after the binary port listens, then tunes the garbage collector).
READY_LINES = {"keyshared": b"standalone ready in"}


def wait_ready(broker: RunningBroker, timeout_s: float = LISTEN_TIMEOUT_S) -> float:
    """Wait until ``broker`` says it is fully started; returns seconds from ``Popen``.

    Throughput and latency runs measure a started broker, not its start-up (which has figures
    of its own); a broker without a ready line is ready once it listens.
    """
    marker = READY_LINES.get(broker.name)
    if marker is None:
        return broker.listen_s
    deadline = time.perf_counter() + timeout_s
    while True:
        try:
            if marker in broker.log_path.read_bytes():
                return time.perf_counter() - broker.popen_at
        except OSError:
            pass
        if broker.process.poll() is not None or time.perf_counter() > deadline:
            raise BrokerStartError(f"{broker.name} never said it was ready:\n" + broker.log_tail())
        time.sleep(0.01)


def stop(broker: RunningBroker, keep_dir: bool = False) -> int | None:
    """Stop the broker by PID (SIGTERM, then SIGKILL), then delete its directory."""
    process = broker.process
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait(timeout=STOP_TIMEOUT_S)
    if not keep_dir:
        shutil.rmtree(broker.workdir, ignore_errors=True)
    return process.returncode


@contextlib.contextmanager
def running(name: str, parent_dir: Path) -> Iterator[RunningBroker]:
    """Context manager: a started broker that is always stopped on exit."""
    broker = start(name, parent_dir)
    try:
        yield broker
    finally:
        stop(broker)
