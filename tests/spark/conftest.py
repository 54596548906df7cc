"""One SparkSession for every Spark test of a run (starting one costs about 10 s, its first Python-source query
about as much again): local[2], the "ledgerview" data source registered, the conf/ settings."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from streaming import local_session


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = local_session("ledgerview-tests", config={"spark.sql.warehouse.dir": str(warehouse)})
    yield session
    session.stop()

