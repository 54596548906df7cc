"""Model-based test of both views: random appends (tombstones, keyless messages, repeated keys), compactions,
reads from random starts, table snapshots and reopens, against plain lists and dicts (invariants 2, 3, 4 and 5;
the table shape of DESIGN.md's "Two shapes of the compacted view")."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import hypothesis.strategies as st
import pyarrow as pa
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from compactor import Compactor
from readers import Reader, TableView
from readers.snapshot import snapshot_batches
from storage import MESSAGE_SCHEMA, Store

PARTITIONS = 2
CONFIG = {"segment.bytes": "1024", "index.interval.bytes": "128", "compaction.memory.bytes": "4096"}
Pair = tuple[bytes | None, bytes | None]

KEYS = [b"a", b"b", b"c", b"d", b"e"]
messages = st.lists(
    st.tuples(st.one_of(st.none(), st.sampled_from(KEYS)),
              st.one_of(st.none(), st.binary(min_size=1, max_size=20))),
    min_size=1, max_size=20,
)


def compacted_model(log: list[Pair], horizon: int, start: int) -> list[tuple[int, bytes | None, bytes | None]]:
    latest = {key: offset for offset, (key, _) in enumerate(log[: horizon + 1]) if key is not None}
    head = sorted(offset for offset in latest.values() if log[offset][1] is not None and offset >= start)
    tail = range(max(horizon + 1, start), len(log))
    return [(offset, *log[offset]) for offset in [*head, *tail]]


class ViewsModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="ledgerview-views-"))
        self.store = Store.open(self.folder)
        self.store.create_topic("t", partitions=PARTITIONS, config=CONFIG)
        self.logs: list[list[Pair]] = [[] for _ in range(PARTITIONS)]
        self.horizons = [-1] * PARTITIONS

    @rule(batch=messages, partition=st.integers(0, PARTITIONS - 1))
    def append(self, batch: list[Pair], partition: int) -> None:
        self.store.append("t", batch, partition=partition)
        self.logs[partition].extend(batch)

    @rule()
    def compact(self) -> None:
        for result in Compactor(self.store).compact("t"):
            assert result.horizon == len(self.logs[result.partition]) - 1 or result.skipped
            self.horizons[result.partition] = result.horizon

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = Store.open(self.folder)

    @rule(partition=st.integers(0, PARTITIONS - 1), data=st.data(), compacted=st.booleans())
    def read_from_anywhere(self, partition: int, data: st.DataObject, compacted: bool) -> None:
        log = self.logs[partition]
        start = data.draw(st.integers(0, len(log)))
        with Reader(self.store, "t", read_compacted=compacted, start={partition: start},
                    partitions=[partition]) as reader:
            table = pa.Table.from_batches(list(reader.batches()), schema=MESSAGE_SCHEMA)
        rows = list(zip(table["offset"].to_pylist(), table["key"].to_pylist(), table["value"].to_pylist(),
                        strict=True))
        if compacted:
            assert rows == compacted_model(log, self.horizons[partition], start)
        else:
            assert rows == [(offset, *log[offset]) for offset in range(start, len(log))]

    @rule(partition=st.integers(0, PARTITIONS - 1), data=st.data())
    def snapshot(self, partition: int, data: st.DataObject) -> None:
        """The table shape: one row per live key, its latest message, whatever the horizon; with keys pushed
        down, those keys' rows; with a ledger offset range, the ledger rows outside it are left out."""
        log = self.logs[partition]
        keys = data.draw(st.one_of(st.none(), st.frozensets(st.sampled_from(KEYS))))
        low = data.draw(st.integers(0, len(log)))
        latest = {key: offset for offset, (key, _) in enumerate(log) if key is not None}
        expected = sorted((offset, key, log[offset][1]) for key, offset in latest.items()
                          if log[offset][1] is not None and (keys is None or key in keys)
                          and (offset >= low or offset > self.horizons[partition]))
        rows = [row for batch in snapshot_batches(self.store, "t", partition, len(log), keys=keys,
                                                  ledger_offsets=(low, None))
                for row in zip(batch["offset"].to_pylist(), batch["key"].to_pylist(), batch["value"].to_pylist(),
                               strict=True)]
        assert sorted(rows) == expected
        assert len({key for _, key, _ in rows}) == len(rows)

    @invariant()
    def table_view_holds_the_latest_live_value_per_key(self) -> None:
        """Checked for keys that live in one partition (a key in several has no single latest value)."""
        view = TableView(self.store, "t")
        try:
            for key in KEYS:
                holders = [log for log in self.logs if any(k == key for k, _ in log)]
                if len(holders) == 1:
                    latest = [value for k, value in holders[0] if k == key][-1]
                    assert view.get(key) == latest
                elif not holders:
                    assert view.get(key) is None
        finally:
            view.close()

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.folder, ignore_errors=True)


TestViewsModel = pytest.mark.slow(ViewsModel.TestCase)
TestViewsModel.settings = settings(max_examples=20, stateful_step_count=25, deadline=None)
