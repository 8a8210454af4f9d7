"""The consumption log: what a Key_Shared consumer received and acknowledged, one JSON per line.

Consumers write it with :class:`ConsumptionLog`; :mod:`keyshared.spark.audit` reads a directory
(or list) of such files together with the topic. This module does not import Spark or the client,
so it costs nothing in a consumer.

Format (JSON Lines, UTF-8; one file per consumer is simplest, any split works):

========== =========================================================================== ========
field      meaning                                                                     events
========== =========================================================================== ========
``ev``     ``"join"``, ``"recv"``, ``"ack"`` or ``"leave"``                            all
``ts``     wall-clock seconds (``time.time()``); one host, or hosts with synced clocks  all
``consumer`` the consumer's name, unique across the audited logs                       all
``subscription`` subscription name                                                     all
``topic``  full topic (partition) name: ``msg.topic_name()`` for recv/ack               all
``key``    partition key (null if none)                                                recv, ack
``okey``   ordering key (absent or null if none; Key_Shared hashes it first)           recv, ack
``ledger``, ``entry``, ``batch`` the message id (batch -1 when not batched)            recv, ack
``redelivery`` the message's redelivery count                                          recv
``ranges`` STICKY consumers: their inclusive hash ranges ``[[start, end], ...]``       join
========== =========================================================================== ========

Rules that make the audit sound: log ``ack`` *before* calling ``acknowledge`` and ``leave``
*before* closing the consumer (so a hand-over to another consumer is always later in time), and
log every receipt, redeliveries included.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

EVENTS = ("join", "recv", "ack", "leave")


class ConsumptionLog:
    """Writes one consumer's consumption log (thread-safe; each line is flushed at once).

    Usage::

        log = ConsumptionLog("logs/c1.jsonl", "c1", "orders-sub", topic)
        msg = consumer.receive()
        log.received(msg)
        ...process...
        log.acked(msg)
        consumer.acknowledge(msg)
        ...
        log.close()          # before consumer.close()
    """

    def __init__(
        self,
        path: str | Path,
        consumer: str,
        subscription: str,
        topic: str,
        *,
        ranges: list[tuple[int, int]] | None = None,
    ) -> None:
        self.consumer = consumer
        self.subscription = subscription
        self.topic = topic
        self._lock = threading.Lock()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO | None = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
        event: dict[str, Any] = {"ev": "join", "topic": topic}
        if ranges is not None:
            event["ranges"] = [[int(a), int(b)] for a, b in ranges]
        self._write(event)

    def _write(self, event: dict[str, Any]) -> None:
        event["ts"] = time.time()
        event["consumer"] = self.consumer
        event["subscription"] = self.subscription
        line = json.dumps(event, separators=(",", ":")) + "\n"
        with self._lock:
            if self._file is None:
                raise ValueError("consumption log is closed")
            self._file.write(line)

    @staticmethod
    def _message_fields(msg: Any) -> dict[str, Any]:
        mid = msg.message_id()
        okey = msg.ordering_key()
        fields: dict[str, Any] = {
            "topic": msg.topic_name(),
            "key": msg.partition_key() or None,
            "ledger": mid.ledger_id(),
            "entry": mid.entry_id(),
            "batch": mid.batch_index(),
        }
        if okey:
            fields["okey"] = okey.decode() if isinstance(okey, bytes) else okey
        return fields

    def received(self, msg: Any) -> None:
        """Log a receipt of a ``pulsar.Message``."""
        event = self._message_fields(msg)
        event["ev"] = "recv"
        event["redelivery"] = msg.redelivery_count()
        self._write(event)

    def acked(self, msg: Any) -> None:
        """Log an acknowledgement; call it just before ``consumer.acknowledge(msg)``."""
        event = self._message_fields(msg)
        event["ev"] = "ack"
        self._write(event)

    def close(self) -> None:
        """Log the consumer leaving; call it just before ``consumer.close()``."""
        if self._file is None:
            return
        self._write({"ev": "leave", "topic": self.topic})
        with self._lock:
            assert self._file is not None
            self._file.close()
            self._file = None

    def __enter__(self) -> ConsumptionLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def read_events(paths: list[str | Path]) -> list[dict[str, Any]]:
    """Every event of the given files, without Spark (for small logs and tests)."""
    out: list[dict[str, Any]] = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            out.extend(json.loads(line) for line in f if line.strip())
    return out
