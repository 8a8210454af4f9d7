"""Cursor state kept in the metadata store, under ``cursors/<managed ledger>/<cursor>``."""

from __future__ import annotations

from keyshared.storage.metadata import MetadataStore

PREFIX = "cursors/"


class MetadataCursorStateStore:
    """A ``CursorStateStore`` for the cursors of one managed ledger."""

    def __init__(self, metadata: MetadataStore, ledger_name: str) -> None:
        self._metadata = metadata
        self._prefix = f"{PREFIX}{ledger_name}/"

    def load(self, cursor_name: str) -> bytes | None:
        """The last saved state of ``cursor_name``."""
        return self._metadata.get(self._prefix + cursor_name)

    def save(self, cursor_name: str, state: bytes) -> None:
        """Replace the saved state of ``cursor_name``."""
        self._metadata.put(self._prefix + cursor_name, state)

    def delete(self, cursor_name: str) -> None:
        """Forget ``cursor_name``."""
        self._metadata.delete(self._prefix + cursor_name)

    def names(self) -> list[str]:
        """Cursors with saved state."""
        n = len(self._prefix)
        return [k[n:] for k in self._metadata.list_keys(self._prefix)]
