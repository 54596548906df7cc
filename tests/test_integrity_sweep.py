"""Byte flips over every kind of file of a local data folder, each met by every reader: Store.read_batches, Reader
(raw and read_compacted), TableView.get, a durable subscription's Consumer, and the CLI's consume and verify.

For each flip, every reader either gives exactly the answer of the undamaged folder or raises an error of the
project's root (LedgerviewError) / exits non-zero with a message; and verify names the damage (a problem or
warning naming the file), unless every reader still gives the right answer (damage a reader repairs or never
reads). The sweep takes a few positions per file; the slow one takes many more.
"""

from __future__ import annotations

import fcntl
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from compactor import Compactor
from readers import Consumer, Reader, TableView
from storage import Store
from storage.codec import read_header
from storage.errors import CorruptSegmentError, LedgerviewError
from storage.files import WRITER_LOCK
from tests.cli_runner import run_main

KEYS = [b"key-%03d" % number for number in range(120)]
CONFIG = {"segment.bytes": "4096", "index.interval.bytes": "256"}
FLIPS_PER_FILE = 1
"""Positions per file in the fast sweep (spread over it); the slow sweep takes SLOW_FLIPS_PER_FILE."""
SLOW_FLIPS_PER_FILE = 4


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Topic t: several sealed segments and an active one with their indexes, a compacted ledger and key index, a
    raw tail above its horizon, compaction cursor and status, a subscription cursor, topic metadata and the
    checkpoints."""
    root = tmp_path_factory.mktemp("pristine") / "data"
    with Store.open(root) as store:
        store.create_topic("t", config=CONFIG)
        for start in range(0, len(KEYS), 10):  # small batches: several per segment, so the indexes have entries
            store.append("t", [(key, b"first-" + key) for key in KEYS[start : start + 10]], partition=0)
        store.append("t", [(key, b"second-" + key) for key in KEYS[::3]], partition=0)
        Compactor(store).compact("t")
        store.append("t", [(key, b"third-" + key) for key in KEYS[::5]], partition=0)
        with Consumer(store, "t", "dashboard") as consumer:
            consumer.acknowledge_cumulative(0, 50)
        store.flush()
    return root


Outcome = Any
Readers = dict[str, Callable[[Path, pytest.CaptureFixture[str]], Outcome]]


def rows(table: pa.Table) -> list[tuple[int, bytes, bytes]]:
    return list(zip(table["offset"].to_pylist(), table["key"].to_pylist(), table["value"].to_pylist(), strict=True))


def store_read(root: Path, _: pytest.CaptureFixture[str]) -> Outcome:
    with Store.open(root, read_only=True) as store:
        return rows(pa.Table.from_batches(list(store.read_batches("t", 0))))


def reader(compacted: bool) -> Callable[[Path, pytest.CaptureFixture[str]], Outcome]:
    def read(root: Path, _: pytest.CaptureFixture[str]) -> Outcome:
        with Reader(root, "t", read_compacted=compacted) as opened:
            return rows(pa.Table.from_batches(list(opened.batches())))
    return read


def table_view(root: Path, _: pytest.CaptureFixture[str]) -> Outcome:
    with TableView(root, "t") as view:
        return [view.get(key) for key in [*KEYS, b"absent"]]


def subscription(root: Path, _: pytest.CaptureFixture[str]) -> Outcome:
    with Consumer(root, "t", "dashboard") as consumer:
        return consumer.acknowledged


def cli(*args: str) -> Callable[[Path, pytest.CaptureFixture[str]], Outcome]:
    def run(root: Path, capsys: pytest.CaptureFixture[str]) -> Outcome:
        result = run_main(capsys, root, *args)
        if result.code != 0:
            assert result.err.strip() and "Traceback" not in result.err, result.err
            raise LedgerviewError(result.err)
        return result.out
    return run


READERS: Readers = {
    "store.read_batches": store_read,
    "Reader": reader(False),
    "Reader read_compacted": reader(True),
    "TableView.get": table_view,
    "Consumer": subscription,
    "consume": cli("consume", "t", "--from-beginning", "--until-end", "--print-offset"),
    "consume --read-compacted": cli("consume", "t", "--from-beginning", "--until-end", "--read-compacted"),
}


def kind_of(path: Path) -> str:
    name = path.name
    if path.parent.name.endswith(".keys"):
        return "key index"
    for suffix, kind in ((".log", "segment"), (".index", "offset index"), (".timeindex", "time index"),
                         (".ledger", "ledger")):
        if name.endswith(suffix):
            return kind
    return {"cursor.json": "compaction cursor", "status.json": "compaction status", "topic.json": "topic metadata",
            "dashboard.json": "subscription cursor"}.get(name, "checkpoint" if "checkpoint" in name else "other")


def active_segment(root: Path) -> Path:
    return sorted((root / "t-0").glob("*.log"))[-1]


def files(root: Path) -> list[Path]:
    """Every file a reader may read (not locks, not RocksDB's LOG, not empty ones), but the active segment (see
    test_a_flip_in_the_active_segment_is_not_cut_as_a_torn_write)."""
    return sorted(path for path in root.rglob("*") if path.is_file() and path.stat().st_size
                  and not path.name.endswith(".lock") and path.name != "LOG" and path != active_segment(root))


def flips(root: Path, per_file: int) -> list[tuple[str, int]]:
    chosen = []
    for path in files(root):
        size = path.stat().st_size
        step = max(1, size // per_file)
        chosen += [(str(path.relative_to(root)), position) for position in range(step // 2, size, step)]
    return chosen


def test_the_folder_holds_every_kind_of_file(pristine: Path) -> None:
    kinds = {kind_of(path) for path in files(pristine)}
    assert kinds >= {"segment", "offset index", "time index", "ledger", "key index", "compaction cursor",
                     "compaction status", "topic metadata", "subscription cursor", "checkpoint"}


def flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x10
    path.write_bytes(bytes(data))


def test_a_flip_in_the_active_segment_is_not_cut_as_a_torn_write(pristine: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    shutil.copytree(pristine, root)
    flip(active_segment(root), 100)
    with pytest.raises(LedgerviewError), Reader(root, "t") as opened:
        list(opened.batches())


def last_batch_position(segment: Path) -> int:
    data, position = segment.read_bytes(), 0
    while (end := position + read_header(data, position, len(data) - position).batch_length) < len(data):
        position = end
    return position


def test_a_damaged_last_batch_of_a_sealed_segment_is_corruption_not_its_end(pristine: Path, tmp_path: Path) -> None:
    """Only the active segment may end in a batch still being written: in a sealed one, a batch header that does
    not parse (here its reserved field) must fail every read, never end the segment early."""
    root = tmp_path / "data"
    shutil.copytree(pristine, root)
    sealed = sorted((root / "t-0").glob("*.log"))[0]
    flip(sealed, last_batch_position(sealed) + 44)
    with Store.open(root, read_only=True) as store, pytest.raises(CorruptSegmentError):
        list(store.read_batches("t", 0))
    with pytest.raises(CorruptSegmentError), Reader(root, "t") as opened:
        list(opened.batches())


def test_a_damaged_last_batch_of_the_active_segment_below_the_recovery_point_is_never_cut(
        pristine: Path, tmp_path: Path) -> None:
    """A batch the recovery point says was fsynced cannot be a write still under way: opened without recovery (read
    only, or while another process holds the writer lock), its damaged header must fail reads and appends, not end
    the log early and hand its offsets to new messages."""
    root = tmp_path / "data"
    shutil.copytree(pristine, root)
    segment = active_segment(root)
    flip(segment, last_batch_position(segment) + 20)  # last_offset_delta: the header no longer parses
    size = segment.stat().st_size
    with Store.open(root, read_only=True) as store, pytest.raises(CorruptSegmentError):
        list(store.read_batches("t", 0))
    with (root / "t-0" / WRITER_LOCK).open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as another process appending while we open
        store = Store.open(root)
        fcntl.flock(held, fcntl.LOCK_UN)
    with store:
        with pytest.raises(CorruptSegmentError):
            list(store.read_batches("t", 0))
        with pytest.raises(CorruptSegmentError):
            store.append("t", [(b"new", b"message")], partition=0)
    assert segment.stat().st_size == size


def test_a_reader_that_saw_a_segment_active_finds_its_damaged_tail_once_sealed(tmp_path: Path) -> None:
    root = tmp_path / "data"
    with Store.open(root) as store:
        store.create_topic("t", config=CONFIG)
        store.append("t", [(b"k", b"v")] * 10, partition=0)
        with Store.open(root, read_only=True) as reading:
            assert sum(batch.num_rows for batch in reading.read_batches("t", 0)) == 10  # segment 0 is active
            store.append("t", [(b"k", b"w")] * 10, partition=0)
            store.partition_log("t", 0).roll()
            first = sorted((root / "t-0").glob("*.log"))[0]
            flip(first, last_batch_position(first) + 44)
            with pytest.raises(CorruptSegmentError):
                list(reading.read_batches("t", 0))


def sweep(pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], per_file: int) -> None:
    truth = {name: read(pristine, capsys) for name, read in READERS.items()}
    wrong, unnamed = [], []
    for number, (relative, position) in enumerate(flips(pristine, per_file)):
        root = tmp_path / f"data{number}"
        shutil.copytree(pristine, root)
        path = root / relative
        flip(path, position)
        all_right = True
        for name, read in READERS.items():
            try:
                answer = read(root, capsys)
            except LedgerviewError:
                all_right = False
                continue
            if answer != truth[name]:
                wrong.append((kind_of(path), relative, position, name))
        verified = run_main(capsys, root, "verify", "--json")
        report = json.loads(verified.out) if verified.out.strip() else {"problems": [verified.err], "warnings": []}
        named = any(path.name in line for line in report["problems"] + report["warnings"]) or verified.code != 0
        if not named and not all_right:
            unnamed.append((kind_of(path), relative, position))
        shutil.rmtree(root)
    assert not wrong, f"readers answered wrongly: {wrong}"
    assert not unnamed, f"damage that broke a reader and that verify did not name: {unnamed}"


def test_no_flip_makes_a_reader_answer_wrongly(pristine: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    sweep(pristine, tmp_path, capsys, FLIPS_PER_FILE)


@pytest.mark.slow
def test_no_flip_makes_a_reader_answer_wrongly_thorough(pristine: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    sweep(pristine, tmp_path, capsys, SLOW_FLIPS_PER_FILE)


def test_verify_reports_every_partition_when_one_raw_log_is_damaged(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Damage that makes a partition's open refuse its raw log (here its active segment, cut short below the
    recovery point) is one problem of the report, not its end: the other topics are checked and their views
    repaired."""
    root = tmp_path / "data"
    with Store.open(root) as store:
        for topic in ("a", "b"):
            store.create_topic(topic, config=CONFIG)
            for start in range(0, len(KEYS), 10):
                store.append(topic, [(key, b"v-" + key) for key in KEYS[start : start + 10]], partition=0)
            Compactor(store).compact(topic)
        store.flush()
    raw = sorted((root / "a-0").glob("*.log"))[-1]  # the active segment
    with raw.open("r+b") as file:
        file.truncate(raw.stat().st_size - 50)
    ledger = next((root / "b-0" / "compacted").glob("*.ledger"))
    flip(ledger, 300)
    flip(next((root / "a-0" / "compacted").glob("*.ledger")), 300)  # a-0: its raw log and its view both
    checked = run_main(capsys, root, "verify")
    assert checked.code == 1
    assert f"PROBLEM {raw}: " in checked.out and "so this is damage, not a torn write" in checked.out
    assert f"PROBLEM {ledger}: " in checked.out and "keyed messages" not in checked.out
    repaired = run_main(capsys, root, "verify", "--repair")
    assert "REPAIRED b-0" in repaired.out and f"PROBLEM {raw}: " in repaired.out
    assert "NOT REPAIRED a-0: its compacted view is damaged and its raw log cannot be opened" in repaired.out
    with Reader(root, "b", read_compacted=True) as reader:
        assert sum(batch.num_rows for batch in reader.batches()) == len(KEYS)


def test_a_damaged_raw_tail_does_not_make_a_sound_view_look_damaged(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A read-only open ends the raw log at the damage, below the view's horizon: the view is not to blame."""
    root = tmp_path / "data"
    with Store.open(root) as store:
        store.create_topic("a", config=CONFIG)
        for start in range(0, len(KEYS), 10):
            store.append("a", [(key, b"v-" + key) for key in KEYS[start : start + 10]], partition=0)
        Compactor(store).compact("a")
        store.flush()
    raw = sorted((root / "a-0").glob("*.log"))[-1]
    with raw.open("r+b") as file:
        file.truncate(raw.stat().st_size - 50)
    checked = run_main(capsys, root, "verify")
    assert checked.code == 1 and f"PROBLEM {raw}: " in checked.out
    assert "cursor.json" not in checked.out
