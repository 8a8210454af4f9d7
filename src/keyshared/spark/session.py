"""A SparkSession set up for the keyshared jobs and the data source."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def get_session(
    master: str | None = None,
    app_name: str = "keyshared",
    conf: dict[str, str] | None = None,
) -> SparkSession:
    """The active session, or a new one on ``master`` (default ``local[*]``).

    Python workers run this interpreter unless ``PYSPARK_PYTHON`` says otherwise (Spark's
    default, ``python3`` from PATH, may lack pyarrow and the connector). Local sessions bind to
    loopback and run without the web UI.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    master = master or os.environ.get("KEYSHARED_SPARK_MASTER") or "local[*]"
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name).master(master)
    settings = {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "4" if master.startswith("local") else "16",
        "spark.ui.showConsoleProgress": "false",
    }
    settings.update(conf or {})
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
