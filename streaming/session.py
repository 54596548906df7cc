"""A SparkSession set up for ledgerview: the data source registered; on a local master also workers on this
interpreter, quiet logs and the settings measured to suit a small machine (conf/spark-defaults.conf,
conf/log4j2.properties), which pin the driver to 127.0.0.1. A cluster master keeps the cluster's own settings."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import pyspark
from pyspark.sql import SparkSession

from streaming.datasource import LedgerviewDataSource

CONF_FOLDER = Path(__file__).resolve().parent.parent / "conf"


def local_session(app_name: str = "ledgerview", *, master: str = "local[2]",
                  config: dict[str, str] | None = None) -> SparkSession:
    """Start (or get) a session on ``master`` with the "ledgerview" data source registered.

    On a local master (``local[…]``, or ``local-cluster[…]`` with executors in processes of their own) Spark reads
    conf/ (spark-defaults.conf, log4j2.properties) when its JVM starts, so this must run before any other
    SparkSession in the process, and ``PYSPARK_PYTHON`` is set to this interpreter, or the workers would run a
    system Python without the project's packages. Any other master (a real cluster) gets neither: its executors
    run the cluster's Python, which must have ledgerview installed, and its driver address is the cluster's."""
    # pyspark warns that pandas 3 is not fully supported; ledgerview never hands pandas to Spark.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    if master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_HOME", str(Path(pyspark.__file__).parent))  # local-cluster launches from it
        if (CONF_FOLDER / "spark-defaults.conf").exists():
            os.environ.setdefault("SPARK_CONF_DIR", str(CONF_FOLDER))
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in (config or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(LedgerviewDataSource)
    return spark
