"""Model-based test of the store: random appends, rolls, flushes, closes and reopens against plain lists
(invariants 1 and 2: nothing acknowledged is lost, offsets and order never change)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from storage import Store
from tests.s3_server import S3Server

PARTITIONS = 2
CONFIG = {"segment.bytes": "1024", "index.interval.bytes": "128"}

messages = st.lists(
    st.tuples(st.one_of(st.none(), st.binary(max_size=6)), st.one_of(st.none(), st.binary(max_size=80))),
    min_size=1,
    max_size=25,
)


class StoreModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="ledgerview-model-"))
        self.store: Store | None = Store.open(self.folder)
        self.store.create_topic("t", partitions=PARTITIONS, config=CONFIG)
        self.model: list[list[tuple[bytes | None, bytes | None]]] = [[] for _ in range(PARTITIONS)]

    @property
    def open_store(self) -> Store:
        if self.store is None:
            self.store = Store.open(self.folder)
        return self.store

    @rule(batch=messages, partition=st.integers(0, PARTITIONS - 1), compression=st.sampled_from([None, "lz4", "zstd"]))
    def append(self, batch: list[tuple[bytes | None, bytes | None]], partition: int, compression: str | None) -> None:
        result = self.open_store.append("t", batch, partition=partition, compression=compression)
        start = len(self.model[partition])
        assert list(result) == [(partition, start + i) for i in range(len(batch))]
        self.model[partition].extend(batch)

    @rule(batch=messages)
    def append_by_key(self, batch: list[tuple[bytes | None, bytes | None]]) -> None:
        result = self.open_store.append("t", batch)
        for (partition, offset), message in zip(result, batch, strict=True):
            assert offset == len(self.model[partition])
            self.model[partition].append(message)

    @rule(partition=st.integers(0, PARTITIONS - 1))
    def roll(self, partition: int) -> None:
        self.open_store.roll("t", partition)

    @rule()
    def flush(self) -> None:
        self.open_store.flush()

    @precondition(lambda self: self.store is not None)
    @rule()
    def close(self) -> None:
        assert self.store is not None
        self.store.close()
        self.store = None

    @rule(partition=st.integers(0, PARTITIONS - 1), data=st.data())
    def read_from_anywhere(self, partition: int, data: st.DataObject) -> None:
        expected = self.model[partition]
        start = data.draw(st.integers(0, len(expected)))
        limit = data.draw(st.one_of(st.none(), st.integers(1, 30)))
        table = self.open_store.read("t", partition, start_offset=start, max_messages=limit)
        stop = len(expected) if limit is None else min(len(expected), start + limit)
        assert table["offset"].to_pylist() == list(range(start, stop))
        assert list(zip(table["key"].to_pylist(), table["value"].to_pylist(), strict=True)) == expected[start:stop]

    @invariant()
    def end_offsets_match(self) -> None:
        for partition in range(PARTITIONS):
            assert self.open_store.end_offset("t", partition) == len(self.model[partition])

    def teardown(self) -> None:
        if self.store is not None:
            self.store.close()
        shutil.rmtree(self.folder, ignore_errors=True)


TestStoreModel = StoreModel.TestCase
# Half the profile's examples (20 of the ci profile's 40): the fast suite's share of its minute.
TestStoreModel.settings = settings(max_examples=settings.default.max_examples // 2, deadline=None)


class TieredStoreModel(StoreModel):
    """The same rules over a store whose sealed segments go to a remote tier (a real S3 server) and leave the local
    folder at once: every read of a sealed segment crosses the tier."""

    def __init__(self) -> None:
        RuleBasedStateMachine.__init__(self)
        self.folder = Path(tempfile.mkdtemp(prefix="ledgerview-model-"))
        self.store = Store.open(self.folder, remote=f"s3://{S3_SERVER[0].new_bucket()}/tier")
        self.store.create_topic("t", partitions=PARTITIONS, config={
            **CONFIG, "remote.storage.enable": "true", "local.retention.ms": "0", "file.delete.delay.ms": "0"})
        self.model = [[] for _ in range(PARTITIONS)]

    @rule()
    def tier(self) -> None:
        """Upload what is sealed, then drop the local copies (local.retention.ms=0)."""
        synced = self.open_store.sync_remote()
        self.open_store.enforce_retention("t", now_ms=self.open_store.clock() + 1)
        for result in synced:  # only what is not uploaded is still local
            log = self.open_store.partition_log("t", result.partition)
            assert log.segments[0].base_offset >= result.remote_end_offset


S3_SERVER: list[S3Server] = []


@pytest.mark.slow
def test_the_store_keeps_every_message_across_the_remote_tier(s3_server: S3Server) -> None:
    S3_SERVER[:] = [s3_server]
    run_state_machine_as_test(TieredStoreModel, settings=settings(max_examples=15, stateful_step_count=30,
                                                                   deadline=None))
