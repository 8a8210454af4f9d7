"""Registers the ``keyshared`` format with Spark on its own.

Spark looks for importable top-level modules named ``pyspark_*`` that define ``DefaultSource``
(``pyspark/sql/worker/lookup_data_sources.py``), so an installed keyshared makes
``spark.read.format("keyshared")`` work without a ``spark.dataSource.register`` call.
"""

from keyshared.spark.source import KeysharedDataSource as DefaultSource

__all__ = ["DefaultSource"]
