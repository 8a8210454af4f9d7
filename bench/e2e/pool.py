"""A fixed pool of spawned client processes, driven over pipes with a timeout on every wait.

Spawning a Python process and importing ``pulsar`` costs ~0.5 s, so workers are started once
per invocation and reused; each run still creates its own client and closes it afterwards.
Protocol (parent -> worker): ``("produce"|"latency", spec)``, then ``("go",)`` after the worker
answers ``("ready",)``; ``("consume", spec)``; ``("stop",)``. The worker answers
``("result", dict)`` or ``("error", traceback)``. ``("abort",)`` asks a running producer to stop
waiting for acks and report what it has. A worker sends the result before closing its client,
so a broker that stalls on close costs no time: the parent stops it and the close fails fast.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import traceback
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

JOIN_TIMEOUT_S = 5.0


class WorkerError(RuntimeError):
    """A worker failed, answered out of protocol, or did not answer in time."""


class _Control:
    """The worker side of the pipe protocol, handed to the workload functions."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._aborted = False
        self.reported = False

    def ready(self) -> None:
        self._conn.send(("ready",))

    def wait_go(self) -> None:
        while True:
            message = self._conn.recv()
            if message[0] == "go":
                return
            if message[0] != "abort":
                raise WorkerError(f"expected go, got {message[0]!r}")

    def report(self, result: dict[str, Any]) -> None:
        self._conn.send(("result", result))
        self.reported = True

    def aborted(self) -> bool:
        while not self._aborted and self._conn.poll():
            # Only "abort" can arrive mid-run: the parent sends nothing else until we answer.
            self._aborted = self._conn.recv()[0] == "abort"
        return self._aborted


def _worker_main(conn: Connection) -> None:
    # Imported here so the parent does not pay for it and a broken client fails in the worker.
    from . import workers

    runs: dict[str, Callable[[Any, workers.Control], None]] = {
        "produce": workers.run_producer,
        "consume": workers.run_consumer,
        "latency": workers.run_latency,
    }
    while True:
        try:
            command = conn.recv()
        except EOFError:
            return
        kind = command[0]
        if kind == "stop":
            return
        if kind == "abort":
            continue  # late: that run already answered
        control = _Control(conn)
        try:
            if kind not in runs:
                raise WorkerError(f"unknown command {kind!r}")
            runs[kind](command[1], control)
            if not control.reported:
                raise WorkerError(f"{kind} finished without a result")
        except Exception:
            # After the result went out, the parent no longer listens for this run.
            if not control.reported:
                conn.send(("error", traceback.format_exc()))


class WorkerPool:
    """``size`` spawned worker processes; restartable after a timeout or a crash."""

    def __init__(self, size: int) -> None:
        self._context = multiprocessing.get_context("spawn")
        self._size = size
        self._processes: list[BaseProcess] = []
        self._conns: list[Connection] = []
        self._start()

    def _spawn(self) -> tuple[BaseProcess, Connection]:
        parent_conn, child_conn = self._context.Pipe()
        process = self._context.Process(target=_worker_main, args=(child_conn,), daemon=True)
        process.start()
        child_conn.close()
        return process, parent_conn

    def _start(self) -> None:
        for _ in range(self._size):
            process, conn = self._spawn()
            self._processes.append(process)
            self._conns.append(conn)

    @property
    def size(self) -> int:
        """Number of worker processes."""
        return self._size

    def send(self, index: int, *message: Any) -> None:
        """Send a command tuple to worker ``index``."""
        self._conns[index].send(message)

    def answered(self, index: int) -> bool:
        """True when worker ``index`` has a message waiting."""
        return self._conns[index].poll()

    def expect(self, index: int, kind: str, timeout_s: float) -> Any:
        """Wait up to ``timeout_s`` for worker ``index`` to answer ``kind``; return its payload."""
        conn = self._conns[index]
        if not conn.poll(timeout_s):
            raise WorkerError(f"worker {index} did not answer {kind!r} within {timeout_s:.0f} s")
        try:
            message = conn.recv()
        except EOFError as error:
            raise WorkerError(f"worker {index} died while we waited for {kind!r}") from error
        if message[0] == "error":
            raise WorkerError(f"worker {index} failed:\n{message[1]}")
        if message[0] != kind:
            raise WorkerError(f"worker {index} answered {message[0]!r}, expected {kind!r}")
        return message[1] if len(message) > 1 else None

    def restart(self, indices: Iterable[int] | None = None) -> None:
        """Kill workers ``indices`` (default: all; they may be stuck mid-run) and spawn fresh
        ones in their place."""
        if indices is None:
            self._kill_all()
            self._start()
            return
        for index in sorted(set(indices)):
            process = self._processes[index]
            if process.is_alive():
                process.kill()
            process.join(JOIN_TIMEOUT_S)
            self._conns[index].close()
            self._processes[index], self._conns[index] = self._spawn()

    def close(self) -> None:
        """Ask workers to stop, then kill whichever did not exit in time."""
        for conn in self._conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(("stop",))
        for process in self._processes:
            process.join(JOIN_TIMEOUT_S)
        self._kill_all()

    def _kill_all(self) -> None:
        for process in self._processes:
            if process.is_alive():
                process.kill()
            process.join(JOIN_TIMEOUT_S)
        for conn in self._conns:
            conn.close()
        self._processes = []
        self._conns = []
