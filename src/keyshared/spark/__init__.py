"""Spark on keyshared: a PySpark data source for topics and ready-made jobs.

``spark.read.format("keyshared")`` (batch and streaming) and ``df.write.format("keyshared")``
work once keyshared is installed (``pyspark_keyshared.DefaultSource``); :func:`register` does
the same explicitly. The jobs are :mod:`keyshared.spark.audit`, :mod:`keyshared.spark.backlog`
and :mod:`keyshared.spark.compact`; :mod:`keyshared.spark.consumption_log` is the helper
consumers use to write the logs the audit reads (it does not import Spark).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FORMAT = "keyshared"


def register(spark: SparkSession) -> None:
    """Register the ``keyshared`` format with ``spark`` (needed only where the automatic
    registration cannot see the installed package, e.g. a notebook's changed ``sys.path``)."""
    from keyshared.spark.source import KeysharedDataSource

    spark.dataSource.register(KeysharedDataSource)
