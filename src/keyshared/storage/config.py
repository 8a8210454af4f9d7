"""Storage settings, named after Pulsar's ``broker.conf`` keys where one exists."""

from __future__ import annotations

from dataclasses import dataclass, field

from keyshared.storage.disk import DiskThresholds


@dataclass(frozen=True, slots=True)
class StorageConfig:
    """Settings of the embedded storage."""

    # journalSyncData (default true): fdatasync appends (and commit metadata with
    # synchronous=FULL) before confirming them. False confirms once written to the page cache.
    journal_sync_data: bool = True
    # managedLedgerMaxEntriesPerLedger (default 50000): roll over to a new ledger after this many.
    max_entries_per_ledger: int = 50_000
    # managedLedgerCacheSizeMB (Pulsar's default is a fraction of direct memory): byte budget of
    # the entry cache shared by all managed ledgers; 0 disables it.
    cache_size_bytes: int = 256 * 1024 * 1024
    # managedLedgerMaxSizePerLedgerMbytes (default 2048): roll over when a ledger reaches this.
    max_size_per_ledger_mb: int = 2048
    # Ours: disk reads up to this many bytes run on the loop (a pread from the page cache costs
    # microseconds); larger batches go to the read thread pool.
    sync_read_max_bytes: int = 256 * 1024
    # Ours: threads for large disk reads.
    read_threads: int = 2
    # Ours: closed ledgers' files kept open for reads, least recently used closed first. Each
    # keeps a file descriptor and its offset array (8 bytes per entry: 400 KB for 50000).
    max_open_segments: int = 256
    # Ours (managedLedgerMaxOpenWritableLedgers): open ledgers (one per loaded topic) whose two
    # files (data and index) stay open; the least recently used idle ones beyond this have
    # them closed until their next append or read. 0: an eighth of the open-files limit
    # (2,500 under 20,000), so that files and connections share the limit.
    max_open_writable_segments: int = 0
    # BookKeeper's diskUsageThreshold, diskUsageWarnThreshold, diskUsageLwmThreshold and
    # diskCheckInterval: when the data directory is too full to take new entries.
    disk: DiskThresholds = field(default_factory=DiskThresholds)
