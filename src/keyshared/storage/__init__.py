"""Storage: managed ledgers of entries, cursors and the metadata store. Knows nothing of consumers."""
