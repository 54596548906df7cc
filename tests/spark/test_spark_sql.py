"""Spark SQL over both views: filter pushdown of key equality and IN, partition, offset and timestamp ranges is
visible in the plan and gives the rows the Reader gives (DESIGN.md invariant 4 through Spark); SQL views of every
topic; the batch write path."""

from __future__ import annotations

import contextlib
import io
import operator
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession

from compactor import Compactor
from readers import read_table
from storage import Store
from storage.compacted import CompactedLedgers
from streaming import register_views
from tests.conftest import TINY
from tests.spark.inputs import numbered_rows

pytestmark = pytest.mark.spark

TOPIC = "prices"
START_MS = 1_700_000_000_000


def compacted_then_appended(folder: Path, config: dict[str, str]) -> Path:
    """A topic compacted once, then appended to: its compacted view has a ledger and a raw tail."""
    rows = numbered_rows(3_000, keys=40)
    timestamps = pa.array(START_MS + pa.array(range(rows.num_rows)).to_numpy(), pa.int64())
    with Store.open(folder) as store:
        store.create_topic(TOPIC, partitions=3, config=config)
        store.append(TOPIC, rows.slice(0, 2_000).append_column("timestamp", timestamps[:2_000]))
        store.append(TOPIC, [{"key": "k007", "value": None, "timestamp": START_MS + 2_000}])
        Compactor(store).compact(TOPIC)
        store.append(TOPIC, rows.slice(2_000).append_column("timestamp", timestamps[2_000:]))
    return folder


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield compacted_then_appended(tmp_path_factory.mktemp("sql") / "data", TINY)


def formatted_plan(frame: DataFrame) -> str:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        frame.explain("formatted")
    return printed.getvalue()


def rows_of(frame: DataFrame) -> list[tuple[int, int, bytes | None, bytes | None]]:
    return sorted((r.partition, r.offset, r.key, r.value) for r in frame.collect())


def view_rows(data: Path, view: str) -> pa.Table:
    """What each view holds, from the Reader: the raw log; the consumer's compacted view; and the table, each
    partition's latest message per key from the raw log, tombstones and keyless messages left out."""
    if view != "compacted":
        return read_table(data, TOPIC, read_compacted=view == "read_compacted")
    raw = read_table(data, TOPIC)
    latest: dict[tuple[int, bytes], int] = {}
    for row, (partition, key) in enumerate(zip(raw["partition"].to_pylist(), raw["key"].to_pylist(), strict=True)):
        if key is not None:
            latest[(partition, key)] = row
    table = raw.take(sorted(latest.values()))
    return table.filter(pc.is_valid(table["value"]))


def expected(data: Path, *, view: str, where: pc.Expression) -> list[tuple[int, int, bytes, bytes]]:
    table = view_rows(data, view).filter(where)
    return sorted(zip(*(table.column(c).to_pylist() for c in ("partition", "offset", "key", "value")), strict=True))


CASES = [
    ("key = 'k003'", pc.field("key") == b"k003"),
    ("key IN ('k001', 'k007', 'k039')", pc.field("key").isin([b"k001", b"k007", b"k039"])),
    ("offset >= 900 AND offset < 1000", (pc.field("offset") >= 900) & (pc.field("offset") < 1000)),
    ("partition = 1 AND offset >= 100", (pc.field("partition") == 1) & (pc.field("offset") >= 100)),
    (f"timestamp >= timestamp_millis({START_MS + 2_500}) AND timestamp < timestamp_millis({START_MS + 2_990})",
     (pc.field("timestamp") >= START_MS + 2_500) & (pc.field("timestamp") < START_MS + 2_990)),
]


@pytest.mark.parametrize("view", ["compacted", "read_compacted", "raw"])
@pytest.mark.parametrize(("condition", "model"), CASES, ids=[case[0] for case in CASES])
def test_pushed_filters_give_the_readers_rows(spark: SparkSession, data: Path, view: str, condition: str,
                                              model: pc.Expression) -> None:
    frame = spark.read.format("ledgerview").option("topic", TOPIC).option("view", view).load(str(data))
    filtered = frame.where(condition)
    plan = formatted_plan(filtered)
    pushed = next(line for line in plan.splitlines() if line.startswith("PushedFilters"))
    assert pushed != "PushedFilters: []", plan
    answer = expected(data, view=view, where=model)
    assert answer and rows_of(filtered) == answer
    # The same rows when Spark evaluates the condition itself, after a scan that pushes nothing.
    unpushed = spark.read.format("ledgerview").option("topic", TOPIC).option("view", view).load(str(data))
    assert rows_of(unpushed.localCheckpoint().where(condition)) == answer


@pytest.mark.parametrize(("condition", "model"), CASES[:2], ids=[case[0] for case in CASES[:2]])
def test_key_filters_on_ledgers_without_a_key_index_give_the_readers_rows(
        spark: SparkSession, tmp_path: Path, condition: str, model: pc.Expression) -> None:
    """compaction.key.index false: the table's pushed key filter reads the ledger's rows and filters them."""
    data = compacted_then_appended(tmp_path / "data", {**TINY, "compaction.key.index": "false"})
    with Store.open(data) as store:
        for partition in range(3):
            ledgers = CompactedLedgers(store.partition_log(TOPIC, partition).folder)
            cursor = ledgers.read_cursor()
            assert cursor is not None and not ledgers.tier_can_copy(cursor)  # the ledger has no key index
    frame = spark.read.format("ledgerview").option("topic", TOPIC).option("view", "compacted").load(str(data))
    answer = expected(data, view="compacted", where=model)
    assert answer and rows_of(frame.where(condition)) == answer


ZERO_BOUNDS = {"offset > 0": operator.gt, "offset >= 0": operator.ge, "offset < 0": operator.lt,
               "offset <= 0": operator.le}


@pytest.mark.parametrize("view", ["compacted", "read_compacted", "raw"])
@pytest.mark.parametrize("condition", list(ZERO_BOUNDS))
def test_an_offset_bound_of_zero_is_a_bound(spark: SparkSession, data: Path, view: str, condition: str) -> None:
    """0 is a bound like any other: each view's rows filtered in Python, not every row or none."""
    frame = spark.read.format("ledgerview").option("topic", TOPIC).option("view", view).load(str(data))
    unfiltered = view_rows(data, view)
    passes = ZERO_BOUNDS[condition]
    answer = sorted(row for row in zip(*(unfiltered.column(c).to_pylist() for c in ("partition", "offset", "key",
                                                                                   "value")), strict=True)
                    if passes(row[1], 0))
    assert rows_of(frame.where(condition)) == answer


def test_a_compacted_scan_below_offset_0_reads_no_raw_segment(spark: SparkSession, tmp_path: Path) -> None:
    """``offset < 0`` is applied where the scan reads, not after: a damaged sealed raw segment above the horizon
    is not touched (an unbounded scan of the same view does reach it, and fails naming it)."""
    folder = tmp_path / "data"
    with Store.open(folder) as store:
        store.create_topic(TOPIC, config=TINY)
        store.append(TOPIC, numbered_rows(200))
        horizon = Compactor(store).compact(TOPIC)[0].horizon
        store.append(TOPIC, numbered_rows(400, start=200))
        sealed_above_horizon = [segment.log_path for segment in store.partition_log(TOPIC, 0).segments[:-1]
                                if segment.base_offset > horizon]
    damaged = sealed_above_horizon[0]
    contents = bytearray(damaged.read_bytes())
    contents[-10] ^= 0xFF  # inside the last batch's Arrow payload: its CRC no longer verifies
    damaged.write_bytes(bytes(contents))
    frame = spark.read.format("ledgerview").option("topic", TOPIC).option("view", "compacted").load(str(folder))
    assert rows_of(frame.where("offset < 0")) == []
    with pytest.raises(PySparkException, match=f"Corrupt batch in {damaged}"):
        frame.where("offset >= 0").collect()


def test_views_answer_sql_for_every_topic_and_see_new_data(spark: SparkSession, data: Path,
                                                           tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    with Store.open(copy) as store:
        store.create_topic("quotes.eu-1")
        store.append("quotes.eu-1", [("AAPL", "189.20"), ("MSFT", "402.10"), ("AAPL", "190.00")])
        Compactor(store).compact("quotes.eu-1")
    assert register_views(spark, copy) == ["quotes.eu-1", "quotes.eu-1_raw"]
    query = "SELECT value FROM `quotes.eu-1` WHERE key = 'AAPL' ORDER BY offset"
    assert [row.value for row in spark.sql(query).collect()] == [b"190.00"]
    assert spark.sql("SELECT count(*) AS n FROM `quotes.eu-1_raw`").collect()[0].n == 3
    with Store.open(copy) as store:
        store.append("quotes.eu-1", [("AAPL", "191.00")])
    assert spark.sql("SELECT count(*) AS n FROM `quotes.eu-1_raw`").collect()[0].n == 4
    assert [row.value for row in spark.sql(query).collect()] == [b"191.00"]


def test_batch_write_appends_partitioned_like_kafka(spark: SparkSession, tmp_path: Path) -> None:
    folder = tmp_path / "data"
    with Store.open(folder) as store:
        store.create_topic("copy", partitions=4)
    frame = spark.createDataFrame([(f"k{i}", f"v{i}") for i in range(100)], "key string, value string")
    frame.write.format("ledgerview").option("path", str(folder)).option("topic", "copy") \
        .mode("append").save()
    with Store.open(folder) as direct:
        direct.create_topic("direct", partitions=4)
        direct.append("direct", [(f"k{i}", f"v{i}") for i in range(100)])
    written, appended = read_table(folder, "copy"), read_table(folder, "direct")
    assert sorted(zip(written["partition"].to_pylist(), written["key"].to_pylist(), strict=True)) == sorted(
        zip(appended["partition"].to_pylist(), appended["key"].to_pylist(), strict=True))
    assert not (folder / "__sinks" / "copy").exists() or not any((folder / "__sinks" / "copy").iterdir())


def test_bad_writes_and_reads_fail_with_what_is_allowed(spark: SparkSession, tmp_path: Path) -> None:
    folder = tmp_path / "data"
    with Store.open(folder) as store:
        store.create_topic("copy")
    frame = spark.createDataFrame([("k", "v", 1.5)], "key string, value string, price double")
    writer = frame.write.format("ledgerview").option("path", str(folder)).option("topic", "copy")
    with pytest.raises(PySparkException, match=r"unknown column 'price'.*Columns allowed: key and value"):
        writer.mode("append").save()
    with pytest.raises(PySparkException, match="append-only log"):
        frame.select("key", "value").write.format("ledgerview").option("path", str(folder)) \
            .option("topic", "copy").mode("overwrite").save()
    with pytest.raises(PySparkException, match=r"Option view='latest' is not valid for .*allowed: compacted or "
                                               "read_compacted or raw"):
        spark.read.format("ledgerview").option("topic", "copy").option("view", "latest").load(str(folder)).count()
    with Store.open(folder) as store:
        assert store.end_offset("copy", 0) == 0
