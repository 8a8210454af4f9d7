"""Errors raised by the storage layer."""

from __future__ import annotations


class StorageError(Exception):
    """A storage operation failed: an I/O error, a corrupt record, or a closed ledger or store.

    Appends that fail complete their future with this error; the broker turns it into a
    ``PersistenceError`` for the producer.
    """
