"""The cursor's settings (:class:`CursorConfig`), each mirroring a ``broker.conf`` key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from keyshared.config import BrokerConfig


@dataclass(frozen=True, slots=True)
class CursorConfig:
    """Cursor settings, with the ``broker.conf`` key each one mirrors."""

    # managedLedgerMaxUnackedRangesToPersist (10000): ack ranges persisted; the rest stay in
    # memory only and are redelivered after a restart.
    max_unacked_ranges_to_persist: int = 10_000
    # managedLedgerMaxUnackedRangesToPersistInMetadataStore (1000): Pulsar's cap for ranges
    # written to ZooKeeper rather than a cursor ledger. We have one store, so it is advisory.
    max_unacked_ranges_to_persist_in_metadata_store: int = 1_000
    # managedLedgerMaxBatchDeletedIndexToPersist (10000): partially acked batches persisted.
    max_batch_deleted_index_to_persist: int = 10_000
    # managedLedgerDefaultMarkDeleteRateLimit (1.0): persists per second per cursor; 0 = every
    # mark-delete is persisted.
    mark_delete_rate_limit: float = 1.0
    # managedLedgerCursorPositionFlushSeconds (60): how often the owner should call flush().
    position_flush_seconds: float = 60.0
    # acknowledgmentAtBatchIndexLevelEnabled: keep per-index acks of batch entries.
    batch_index_ack_enabled: bool = True
    # Ours: persist (rate limited) when the mark-delete moves, as Pulsar does. Off, acks only
    # mark the cursor dirty and the owner's periodic flush() writes it, e.g. to batch the
    # writes of many cursors into one transaction.
    persist_on_mark_delete: bool = True

    @classmethod
    def from_broker_config(cls, conf: BrokerConfig) -> CursorConfig:
        """The cursor settings of a broker configuration."""
        return cls(
            max_unacked_ranges_to_persist=conf.managedLedgerMaxUnackedRangesToPersist,
            max_unacked_ranges_to_persist_in_metadata_store=(
                conf.managedLedgerMaxUnackedRangesToPersistInMetadataStore
            ),
            max_batch_deleted_index_to_persist=conf.managedLedgerMaxBatchDeletedIndexToPersist,
            mark_delete_rate_limit=conf.managedLedgerDefaultMarkDeleteRateLimit,
            position_flush_seconds=float(conf.managedLedgerCursorPositionFlushSeconds),
            batch_index_ack_enabled=conf.acknowledgmentAtBatchIndexLevelEnabled,
        )
