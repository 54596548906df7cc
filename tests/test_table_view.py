"""TableView: the latest value per key, held against a plain-dict model through appends, compactions, tombstones
of ledger keys and keys that only the raw tail holds.

Invariants checked: 4 (the table is the compacted view folded per key: a tombstone above the horizon hides the
ledger's key; keys stay after retention removed their raw segments) and 8 (a view follows another process's
appends and compactions).
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from readers import TableView
from readers.partition_table import PartitionTable
from storage import Store
from storage.compacted import CompactedLedgers
from storage.ledger import Ledger
from tests.test_readers import Model, random_rows, retire_raw_below


def assert_matches(view: TableView, model: Model, absent: tuple[bytes, ...] = (b"never-written",)) -> None:
    expected = model.latest()
    assert dict(view.items()) == expected
    assert sorted(view.keys()) == sorted(expected)
    assert len(view.items()) == len(view.keys())
    assert len(view) == len(expected)
    every_key = {m.key for messages in model.messages.values() for m in messages if m.key is not None}
    for key in every_key | set(absent):
        assert view.get(key) == expected.get(key), key
        assert (key in view) == (key in expected), key


@pytest.mark.parametrize("partitions", [1, 3])
def test_the_view_follows_appends_compactions_and_tombstones_of_ledger_keys(store: Store, partitions: int) -> None:
    model = Model(store, "prices", partitions=partitions)
    model.append([(f"k{i}".encode(), f"v{i}".encode()) for i in range(10)])
    view = TableView(store, "prices")
    assert_matches(view, model)
    model.append([(b"k1", b"again"), (b"k2", None)])
    model.compact()
    assert_matches(view, model)
    # tombstones of keys now only in the ledger, new versions of others, and keys only the tail holds
    model.append([(b"k3", None), (b"k4", b"tail"), (b"new1", b"n"), (b"new2", None), (b"new3", b"x"),
                  (b"k4", None), (b"k2", b"back")])
    assert_matches(view, model)
    assert view.get(b"new1") == b"n" and b"new3" in view and b"new2" not in view
    model.compact()
    assert_matches(view, model)
    model.append([(b"k5", None), (b"new1", None), (b"k3", b"again")])
    assert_matches(view, model)
    model.compact()
    assert_matches(view, model)
    view.close()


@pytest.mark.parametrize("seed", range(3))
def test_the_view_equals_the_model_over_random_histories(store: Store, seed: int) -> None:
    rng = random.Random(seed)
    model = Model(store, "prices", partitions=2)
    with TableView(store, "prices") as view:
        for _ in range(8):
            model.append(random_rows(rng, rng.randrange(1, 12), keys=10))
            if rng.random() < 0.4:
                model.compact()
            assert_matches(view, model)
    with TableView(store, "prices") as fresh:
        assert_matches(fresh, model)


def test_get_looks_ledger_keys_up_in_the_key_index_never_scanning_the_ledger(store: Store,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    model = Model(store, "prices")
    model.append([(f"k{i}".encode(), f"v{i}".encode()) for i in range(50)])
    model.compact()
    retire_raw_below(store, "prices", 0, model.horizons[0] + 1)  # the raw messages of most keys are gone
    model.append([(b"k0", None), (b"tail-only", b"t")])
    view = TableView(store, "prices")

    def no_scan(*args: object, **kwargs: object) -> None:
        raise AssertionError("get must not scan the ledger")

    monkeypatch.setattr(Ledger, "read_batches", no_scan)
    assert view.get(b"k7") == b"v7"
    assert view.get(b"k0") is None
    assert view.get("tail-only") == b"t"
    assert view.get(b"absent") is None
    assert b"k49" in view
    monkeypatch.undo()
    assert_matches(view, model)


def test_refresh_reopens_the_ledger_only_when_the_cursor_moved(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    model = Model(store, "prices")
    model.append([(b"a", b"1"), (b"b", b"1")])
    model.compact()
    view = TableView(store, "prices")
    opened: list[Path] = []
    original = CompactedLedgers.open_current

    def counting(ledgers: CompactedLedgers) -> object:
        opened.append(ledgers.folder)
        return original(ledgers)

    monkeypatch.setattr(CompactedLedgers, "open_current", counting)
    for _ in range(3):
        assert view.get(b"a") == b"1"
    model.append([(b"a", b"2")])
    assert view.get(b"a") == b"2"
    assert opened == []
    model.compact()
    opened.clear()  # the compactor opens the previous ledger through the same call
    assert view.get(b"a") == b"2"
    assert view.get(b"b") == b"1"
    assert len(opened) == 1


def test_a_key_in_two_partitions_shows_its_latest_live_value(store: Store) -> None:
    store.create_topic("prices", partitions=2)
    store.append("prices", [{"key": b"k", "value": b"old", "timestamp": 100}], partition=0)
    store.append("prices", [{"key": b"k", "value": b"new", "timestamp": 200}], partition=1)
    view = TableView(store, "prices")
    assert view.get(b"k") == b"new" and view.items() == [(b"k", b"new")] and len(view) == 1
    store.append("prices", [{"key": b"k", "value": None, "timestamp": 300}], partition=1)
    assert view.get(b"k") == b"old" and len(view) == 1  # a tombstone removes the key from its partition only


def test_a_horizon_that_moves_back_rebuilds_the_partition(store: Store) -> None:
    model = Model(store, "prices")
    model.append([(b"a", b"1"), (b"b", b"1")])
    model.compact()
    view = TableView(store, "prices")
    model.append([(b"a", None)])
    shutil.rmtree(CompactedLedgers(store.partition_log("prices", 0).folder).folder)  # the view given up
    assert_matches(view, model)
    model.compact()
    assert_matches(view, model)


APPEND_AND_COMPACT = """
import sys
from storage import Store
from compactor import Compactor
with Store.open(sys.argv[1]) as store:
    store.append("prices", [(b"k1", None), (b"k2", b"other-process"), (b"k9", b"nine")], partition=0)
    Compactor(store).compact("prices")
    store.append("prices", [(b"k3", None)], partition=0)
"""


@pytest.mark.slow  # a Python process or more of its own: after the fast suite
def test_the_view_follows_another_process(store: Store, data_dir: Path) -> None:
    model = Model(store, "prices")
    model.append([(f"k{i}".encode(), f"v{i}".encode()) for i in range(5)])
    with TableView(data_dir, "prices") as view:
        assert view.get(b"k1") == b"v1"
        store.flush()
        subprocess.run([sys.executable, "-c", APPEND_AND_COMPACT, str(data_dir)], check=True, timeout=60,
                       capture_output=True)
        assert view.get(b"k1") is None
        assert dict(view.items()) == {b"k0": b"v0", b"k2": b"other-process", b"k4": b"v4", b"k9": b"nine"}
        assert len(view) == 4


def test_a_partition_table_counts_without_listing_keys(store: Store) -> None:
    model = Model(store, "prices")
    model.append([(f"k{i}".encode(), b"v") for i in range(20)] + [(None, b"keyless")])
    model.compact()
    model.append([(b"k0", None), (b"k1", b"w"), (b"fresh", b"f"), (b"gone", None)])
    table = PartitionTable(store, "prices", 0)
    table.refresh()
    assert table.count() == len(model.latest()) == 20
    table.close()
