"""The metadata store: a small key/value API over SQLite.

All broker metadata (ledger lists, topics, partitions, policies, cursor snapshots, dedup state)
lives here as bytes (usually JSON) under slash-separated keys such as ``managed-ledgers/<name>``
or ``cursors/<ledger>/<cursor>``.

Durability: WAL mode. With ``durable=True`` (the default, tied to ``journalSyncData``) each commit
runs with ``synchronous=FULL``, which fsyncs the WAL at every commit. ``NORMAL`` would be safe
against a process crash (SIGKILL) but may lose the last commits on power loss, and that is not
acceptable here: a ledger's creation is recorded before its entries are confirmed, so losing that
record would orphan confirmed entries. With ``durable=False`` (no data sync anywhere) NORMAL is
used; the database still cannot be corrupted.

Each commit costs one fsync (well under a millisecond on an SSD); callers that write many keys
at once (cursor snapshots of a whole topic) should use :meth:`MetadataStore.put_many`, which is one
transaction.

Threads: one connection guarded by a lock; every method is safe from any thread (the journal
thread does not use it). The broker calls it from the event loop.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import orjson

from keyshared.storage.errors import DiskFullError, StorageError

# Every key sorts below this: U+10FFFF is the largest code point, so `prefix + _TOP` bounds
# a prefix range scan.
_TOP = "\U0010ffff"
# sqlite3.SQLITE_FULL: the database or disk is full.
_SQLITE_FULL = 13


class MetadataStore:
    """Key/value metadata in one SQLite file (or ``":memory:"``)."""

    def __init__(self, path: Path | str, *, durable: bool = True) -> None:
        self._lock = threading.Lock()
        try:
            self._conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value BLOB NOT NULL)"
                " WITHOUT ROWID"
            )
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open metadata store {path}: {exc}") from exc
        self._closed = False
        # Called with the error when a write fails for lack of space (the storage's DiskMonitor).
        self.on_full: Callable[[StorageError], None] | None = None

    @contextmanager
    def _locked(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._closed:
                raise StorageError("metadata store is closed")
            try:
                yield self._conn
            except sqlite3.Error as exc:
                if getattr(exc, "sqlite_errorcode", None) == _SQLITE_FULL:
                    err: StorageError = DiskFullError(f"metadata store: {exc}")
                    if self.on_full is not None:
                        self.on_full(err)
                    raise err from exc
                raise StorageError(f"metadata store: {exc}") from exc

    def get(self, key: str) -> bytes | None:
        """The value of ``key``, or None."""
        with self._locked() as conn:
            row = conn.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def put(self, key: str, value: bytes) -> None:
        """Set ``key`` (one durable transaction)."""
        with self._locked() as conn:
            conn.execute("INSERT OR REPLACE INTO kv (key, value) VALUES (?, ?)", (key, value))

    def delete(self, key: str) -> bool:
        """Remove ``key``; whether it existed."""
        with self._locked() as conn:
            return conn.execute("DELETE FROM kv WHERE key = ?", (key,)).rowcount > 0

    def list_keys(self, prefix: str = "") -> list[str]:
        """Keys starting with ``prefix``, sorted."""
        with self._locked() as conn:
            rows = conn.execute(
                "SELECT key FROM kv WHERE key >= ? AND key < ? ORDER BY key",
                (prefix, prefix + _TOP),
            ).fetchall()
        return [row[0] for row in rows if row[0].startswith(prefix)]

    def items(self, prefix: str = "") -> list[tuple[str, bytes]]:
        """``(key, value)`` pairs whose key starts with ``prefix``, sorted by key."""
        with self._locked() as conn:
            rows = conn.execute(
                "SELECT key, value FROM kv WHERE key >= ? AND key < ? ORDER BY key",
                (prefix, prefix + _TOP),
            ).fetchall()
        return [(row[0], bytes(row[1])) for row in rows if row[0].startswith(prefix)]

    def put_many(
        self,
        items: Mapping[str, bytes] | Iterable[tuple[str, bytes]],
        deletes: Iterable[str] = (),
    ) -> None:
        """Set several keys and remove others in one transaction (all or nothing)."""
        pairs = list(items.items() if isinstance(items, Mapping) else items)
        doomed = [(key,) for key in deletes]
        with self._locked() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                if pairs:
                    conn.executemany("INSERT OR REPLACE INTO kv (key, value) VALUES (?, ?)", pairs)
                if doomed:
                    conn.executemany("DELETE FROM kv WHERE key = ?", doomed)
                conn.execute("COMMIT")
            except BaseException:
                # SQLITE_FULL (and a few other errors) roll the transaction back themselves: a
                # second ROLLBACK would fail with "no transaction is active" and hide the cause.
                if conn.in_transaction:
                    with suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise

    def delete_prefix(self, prefix: str) -> int:
        """Remove every key starting with ``prefix``; how many were removed."""
        if not prefix:
            raise ValueError("refusing to delete every key")
        with self._locked() as conn:
            cur = conn.execute(
                "DELETE FROM kv WHERE key >= ? AND key < ? AND substr(key, 1, ?) = ?",
                (prefix, prefix + _TOP, len(prefix), prefix),
            )
            return cur.rowcount

    def get_json(self, key: str) -> Any:
        """The JSON value of ``key`` decoded, or None."""
        raw = self.get(key)
        return None if raw is None else orjson.loads(raw)

    def put_json(self, key: str, value: Any) -> None:
        """Set ``key`` to ``value`` encoded as JSON."""
        self.put(key, orjson.dumps(value))

    def close(self) -> None:
        """Close the connection; later calls raise :class:`StorageError`."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed
