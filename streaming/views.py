"""Every topic of a store as Spark SQL temporary views, in one call."""

from __future__ import annotations

import os

from pyspark.sql import SparkSession

from storage import Store
from storage.errors import LedgerviewError
from streaming.datasource import LedgerviewDataSource

RAW_SUFFIX = "_raw"
SCAN_SUFFIX = "__scan"


def register_views(spark: SparkSession, path: str | os.PathLike[str], *, raw_suffix: str = RAW_SUFFIX) -> list[str]:
    """Register each topic as a view of its compacted view (``prices``) and of its raw log (``prices_raw``), so
    ``spark.sql("SELECT value FROM prices WHERE key = 'AAPL'")`` works; returns the view names.

    Views are temporary (per session): re-register after new topics appear. Names with '.' or '-' need backticks
    in SQL, as any identifier does.

    Each view is ``SELECT * FROM <scan view> WHERE offset >= 0``. Spark 4.3 caches a Python source's planned
    partitions and pushed filters on the relation and replans them only when a query pushes a filter, so a
    second query on a plain ``USING`` view would reuse the first one's filters and end offsets. The always-true
    offset filter makes every query push one, and so plan afresh.

    Names two topics' views would share (topics ``a`` and ``a_raw`` with the default ``raw_suffix``) are refused
    before any view is made: one view would silently replace the other."""
    spark.dataSource.register(LedgerviewDataSource)
    folder = os.path.abspath(path)
    with Store.open(folder, read_only=True) as store:  # a read: a path that is no store is an error, not made one
        topics = store.list_topics()
    _refuse_shared_names(topics, raw_suffix)
    names = []
    for topic in topics:
        for name, view in ((topic, "compacted"), (topic + raw_suffix, "raw")):
            scan = f"{name}{SCAN_SUFFIX}"
            spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW `{scan}` USING {LedgerviewDataSource.name()} "
                      f"OPTIONS (path {_literal(folder)}, topic {_literal(topic)}, view '{view}')")
            spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW `{name}` AS SELECT * FROM `{scan}` WHERE offset >= 0")
            names.append(name)
    return names


class ViewNameClashError(LedgerviewError):
    def __init__(self, name: str, first: str, second: str, raw_suffix: str) -> None:
        super().__init__(f"register_views cannot name both the {first} and the {second} {name!r}: pass a "
                         f"raw_suffix that no topic name ends with (now {raw_suffix!r}), such as '__raw'.")


def _refuse_shared_names(topics: list[str], raw_suffix: str) -> None:
    """Each view, and the scan view under it, needs a name of its own."""
    taken: dict[str, str] = {}
    for topic in topics:
        for name, what in ((topic, f"table of topic {topic!r}"), (topic + raw_suffix, f"raw view of topic {topic!r}")):
            for view, role in ((name, what), (name + SCAN_SUFFIX, f"scan under the {what}")):
                if view in taken:
                    raise ViewNameClashError(view, taken[view], role, raw_suffix)
                taken[view] = role


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
