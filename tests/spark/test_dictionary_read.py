"""Spark SQL over a zstd topic whose batches hold dictionary-encoded keys and values gives the rows of the same
topic uncompressed, raw and compacted: the executors decode through storage's one payload decoder."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from compactor import Compactor
from storage import Store
from tests.test_compression_dictionary import CONFIG, ROWS, log_layouts, ticks

pytestmark = pytest.mark.spark


def filled(folder: Path, codec: str) -> Path:
    with Store.open(folder) as store:
        store.create_topic("t", config={**CONFIG, "compression.type": codec, "cleanup.policy": "compact,delete"})
        store.append("t", ticks(0), partition=0)
        Compactor(store).compact("t")
        store.append("t", ticks(ROWS), partition=0)
    return folder


@pytest.mark.parametrize("view", ["raw", "compacted"])
def test_spark_reads_dictionary_batches_as_the_uncompressed_topic(spark: SparkSession, tmp_path: Path,
                                                                  view: str) -> None:
    def rows(folder: Path) -> list[tuple[int, int, int, bytes | None, bytes | None]]:
        frame = spark.read.format("ledgerview").option("topic", "t").option("view", view).load(str(folder))
        return sorted((r.partition, r.offset, r.timestamp, r.key, r.value) for r in frame.collect())

    expected = rows(filled(tmp_path / "plain", "uncompressed"))
    assert len(expected) > 1024
    assert rows(filled(tmp_path / "zstd", "zstd")) == expected
    assert log_layouts(tmp_path / "zstd") == {"schema"}
