"""A local SparkSession set up for ledgerview: workers on this interpreter, the data source registered, quiet
logs and the settings measured to suit a small machine (conf/spark-defaults.conf, conf/log4j2.properties)."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

from pyspark.sql import SparkSession

from streaming.datasource import LedgerviewDataSource

CONF_FOLDER = Path(__file__).resolve().parent.parent / "conf"


def local_session(app_name: str = "ledgerview", *, master: str = "local[2]",
                  config: dict[str, str] | None = None) -> SparkSession:
    """Start (or get) a local session with the "ledgerview" data source registered.

    Spark reads conf/ (spark-defaults.conf, log4j2.properties) when its JVM starts, so this must run before any
    other SparkSession in the process; ``PYSPARK_PYTHON`` is set to this interpreter, or the workers would run
    a system Python without the project's packages."""
    # pyspark warns that pandas 3 is not fully supported; ledgerview never hands pandas to Spark.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if (CONF_FOLDER / "spark-defaults.conf").exists():
        os.environ.setdefault("SPARK_CONF_DIR", str(CONF_FOLDER))
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in (config or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(LedgerviewDataSource)
    return spark
