"""Spark SQL over a compressed topic (compression.type lz4, zstd) gives the rows of the same topic uncompressed:
Spark's executors decode compressed batches transparently."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from compactor import Compactor
from storage import Store
from tests.conftest import TINY
from tests.spark.inputs import numbered_rows

pytestmark = pytest.mark.spark


def filled(folder: Path, codec: str) -> Path:
    rows = numbered_rows(1_500, keys=30)
    with Store.open(folder) as store:
        store.create_topic("t", partitions=2, config={**TINY, "compression.type": codec})
        store.append("t", rows.slice(0, 1_000))
        Compactor(store).compact("t")
        store.append("t", rows.slice(1_000))
    return folder


@pytest.mark.parametrize("view", ["raw", "compacted"])
def test_spark_reads_compressed_topics_as_the_uncompressed_one(spark: SparkSession, tmp_path: Path,
                                                              view: str) -> None:
    def rows(folder: Path) -> list[tuple[int, int, bytes | None, bytes | None]]:
        frame = spark.read.format("ledgerview").option("topic", "t").option("view", view).load(str(folder))
        return sorted((r.partition, r.offset, r.key, r.value) for r in frame.collect())

    expected = rows(filled(tmp_path / "plain", "uncompressed"))
    assert expected
    for codec in ("lz4", "zstd"):
        assert rows(filled(tmp_path / codec, codec)) == expected
