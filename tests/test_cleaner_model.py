"""Model-based test of the raw view of a compacted topic under appends, rolls, cleaning passes at advancing clocks,
delete-records and retention runs, closes and reopens, against a plain list of every message appended
(invariants 2 and 6: offsets and order never change; cleaning removes exactly the superseded messages and the
tombstones whose delete horizon has passed).

The model knows nothing of segments: after a pass that ends at offset ``end`` (from its statistics), below
``end`` only each key's latest message stays, and a latest tombstone stays until ``delete.retention.ms`` after the
first pass that kept it; everything from ``end`` on stays as appended.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import event, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from storage import Store
from tests.conftest import ManualClock

DELETE_RETENTION_MS = 100
CONFIG = {"cleanup.policy": "compact,delete", "segment.bytes": "1024", "index.interval.bytes": "128",
          "min.cleanable.dirty.ratio": "0", "delete.retention.ms": str(DELETE_RETENTION_MS)}
Row = tuple[int, bytes, bytes | None]

messages = st.lists(st.tuples(st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f"]),
                              st.one_of(st.none(), st.binary(min_size=1, max_size=60))), min_size=1, max_size=20)


class CleanedLogModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="ledgerview-cleaner-model-"))
        self.clock = ManualClock()
        self.store = Store.open(self.folder, clock=self.clock)
        self.store.create_topic("t", config=CONFIG)
        self.appended: list[Row] = []
        self.present: set[int] = set()
        """Offsets the raw view still holds (from the log start on)."""
        self.kept_since: dict[int, int] = {}
        """Tombstone offset -> the clock of the first pass that kept it."""
        self.log_start = 0

    @rule(batch=messages)
    def append(self, batch: list[tuple[bytes, bytes | None]]) -> None:
        result = self.store.append("t", batch, partition=0)
        for (_, offset), (key, value) in zip(result, batch, strict=True):
            assert offset == len(self.appended)
            self.appended.append((offset, key, value))
            self.present.add(offset)

    @rule()
    def roll(self) -> None:
        self.store.roll("t", 0)

    @rule(advance_ms=st.integers(0, 2 * DELETE_RETENTION_MS))
    def clean(self, advance_ms: int) -> None:
        self.clock.advance(advance_ms)
        passes = self.store.clean("t")
        if not passes:
            return
        [stats] = passes
        event("a pass cleaned")
        end = stats.end_offset
        assert end <= self.store.partition_log("t", 0).active.base_offset  # the active segment is never cleaned
        latest = {key: offset for offset, key, _ in self.appended[:end]}
        for offset, key, value in self.appended[:end]:
            if offset not in self.present:
                continue
            if latest[key] != offset:
                self.present.discard(offset)
            elif value is None:
                first_kept = self.kept_since.setdefault(offset, self.clock.now_ms)
                if self.clock.now_ms >= first_kept + DELETE_RETENTION_MS:
                    event("an expired tombstone removed")
                    self.present.discard(offset)

    @rule(data=st.data())
    def delete_records(self, data: st.DataObject) -> None:
        store = self.store
        before = data.draw(st.integers(store.start_offset("t", 0), store.end_offset("t", 0)))
        store.delete_records("t", 0, before_offset=before)
        self.log_start = before

    @rule()
    def enforce_retention(self) -> None:
        self.store.enforce_retention("t")  # retention.ms is a week: only what delete_records freed goes

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = Store.open(self.folder, clock=self.clock)

    @invariant()
    def raw_view_matches_the_model(self) -> None:
        store = self.store
        assert store.start_offset("t", 0) == self.log_start
        assert store.end_offset("t", 0) == len(self.appended)
        table = store.read("t", 0)
        seen = list(zip(table["offset"].to_pylist(), table["key"].to_pylist(), table["value"].to_pylist(),
                        strict=True))
        assert seen == [row for row in self.appended if row[0] in self.present and row[0] >= self.log_start]

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.folder, ignore_errors=True)


TestCleanedLogModel = CleanedLogModel.TestCase
# Half the profile's examples (20 of the ci profile's 40): the fast suite's share of its minute.
TestCleanedLogModel.settings = settings(max_examples=settings.default.max_examples // 2, deadline=None)
