"""``ledgerview verify --repair`` rebuilds a damaged compacted view (ledger batch, key index or cursor) from the raw
log, published as a compaction publishes, and reports it; where retention removed raw messages the view needs it
changes nothing and says so."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from compactor import CompactionState, Compactor
from readers import Reader, TableView
from storage import Store
from storage.codec import HEADER_BYTES
from storage.compacted import CompactedLedgers, LostCursorError
from storage.errors import LedgerviewError
from storage.files import key_index_folder, ledger_file, partition_folder
from tests.cli_runner import run_main

KEYS = [b"key-%04d" % number for number in range(500)]


def latest(key: bytes) -> bytes:
    return b"new-" + key if KEYS.index(key) % 2 else b"old-" + key


def build(root: Path, *, config: dict[str, str] | None = None) -> None:
    with Store.open(root) as store:
        store.create_topic("t", config=config)
        store.append("t", [(key, b"old-" + key) for key in KEYS], partition=0)
        store.append("t", [(key, b"new-" + key) for key in KEYS[1::2]], partition=0)
        Compactor(store).compact("t")


def flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x20
    path.write_bytes(bytes(data))


def folder(root: Path) -> Path:
    return partition_folder(root, "t", 0)


def damage_ledger(root: Path) -> str:
    flip(ledger_file(folder(root), 1), HEADER_BYTES + 100)
    return str(ledger_file(folder(root), 1))


def damage_ledger_first_offset(root: Path) -> str:
    """The first batch's base offset, which says where the view starts: 0 becomes 2**29."""
    flip(ledger_file(folder(root), 1), 3)
    return str(ledger_file(folder(root), 1))


def damage_key_index(root: Path) -> str:
    [sst] = key_index_folder(folder(root), 1).glob("*.sst")
    flip(sst, 10)
    return str(key_index_folder(folder(root), 1))


def damage_cursor(root: Path) -> str:
    cursor = CompactedLedgers(folder(root)).cursor_path
    cursor.write_bytes(cursor.read_bytes().replace(b'"horizon": 749', b'"horizon": 748'))
    return str(cursor)


@pytest.mark.parametrize("damage", [damage_ledger, damage_key_index, damage_cursor],
                         ids=["ledger batch", "key index", "cursor"])
def test_repair_rebuilds_a_damaged_view_from_the_raw_log(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         damage: object) -> None:
    root = tmp_path / "data"
    build(root)
    assert callable(damage)
    named = damage(root)
    checked = run_main(capsys, root, "verify")
    assert checked.code == 1 and named in checked.out
    repaired = run_main(capsys, root, "verify", "--repair")
    assert repaired.code == 0, repaired.out + repaired.err
    assert "REPAIRED t-0: compacted view rebuilt from raw offsets 0 to 749 as ledger 2 (500 messages kept of " \
           "750 read)" in repaired.out
    assert "PROBLEM" not in repaired.out and "sound" in repaired.err
    assert run_main(capsys, root, "verify").code == 0
    with TableView(root, "t") as view:
        assert dict(view.items()) == {key: latest(key) for key in KEYS}
        assert all(view.get(key) == latest(key) for key in KEYS[::17])
    cursor = CompactedLedgers(folder(root)).read_cursor()
    assert cursor is not None and cursor.ledger_id == 2


@pytest.mark.parametrize("damage", [damage_ledger, damage_ledger_first_offset],
                         ids=["ledger batch", "the ledger's first offset"])
def test_repair_says_so_when_retention_removed_the_raw_data(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            damage: Callable[[Path], str]) -> None:
    """Also when the damage is in the header that says where the view starts: a rebuild from what retention left
    would drop every key only the view holds."""
    root = tmp_path / "data"
    build(root, config={"segment.bytes": "4096"})
    with Store.open(root) as store:
        store.delete_records("t", 0, 750)
    named = damage(root)
    pristine = tmp_path / "pristine"
    shutil.copytree(root, pristine)
    result = run_main(capsys, root, "verify", "--repair")
    assert result.code == 1 and named in result.out
    assert ("NOT REPAIRED t-0: its compacted view is damaged and cannot be rebuilt: retention removed the raw "
            "messages below offset ") in result.out
    assert not any(line.startswith("REPAIRED") for line in result.out.splitlines())
    assert CompactedLedgers(folder(root)).read_cursor() == CompactedLedgers(folder(pristine)).read_cursor()


def test_a_sound_store_is_left_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "data"
    build(root)
    result = run_main(capsys, root, "verify", "--repair", "--json")
    assert result.code == 0
    assert result.json_lines()[0]["repaired"] == [] and result.json_lines()[0]["not_repaired"] == []
    cursor = CompactedLedgers(folder(root)).read_cursor()
    assert cursor is not None and cursor.ledger_id == 1


def test_a_lost_cursor_is_named_and_its_ledgers_kept_until_the_view_is_rebuilt(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A published view whose cursor is gone must not read, compact or verify as a partition never compacted:
    that would serve the raw log alone and remove the view's ledgers as orphans. Only a rebuild replaces it."""
    root = tmp_path / "data"
    build(root)
    cursor = CompactedLedgers(folder(root)).cursor_path
    cursor.unlink()
    with pytest.raises(LostCursorError, match="the cursor was lost"), Reader(root, "t", read_compacted=True) as reader:
        list(reader.batches())
    with Store.open(root) as store, pytest.raises(LostCursorError):
        Compactor(store).compact("t")
    assert ledger_file(folder(root), 1).exists()
    consumed = run_main(capsys, root, "consume", "t", "--read-compacted", "--from-beginning", "--until-end")
    assert consumed.code == 1 and "the cursor was lost" in consumed.err  # the check-failed status
    checked = run_main(capsys, root, "verify")
    assert checked.code == 1 and f"The compaction cursor {cursor} is missing" in checked.out
    repaired = run_main(capsys, root, "verify", "--repair")
    assert repaired.code == 0 and "REPAIRED t-0: compacted view rebuilt from raw offsets 0 to 749" in repaired.out
    with TableView(root, "t") as view:
        assert dict(view.items()) == {key: latest(key) for key in KEYS}


def test_a_lost_cursor_whose_raw_log_retention_cut_is_not_rebuilt(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "data"
    build(root, config={"segment.bytes": "4096"})
    with Store.open(root) as store:
        store.delete_records("t", 0, 750)
    CompactedLedgers(folder(root)).cursor_path.unlink()
    repaired = run_main(capsys, root, "verify", "--repair")
    assert repaired.code == 1 and "NOT REPAIRED t-0" in repaired.out
    assert ledger_file(folder(root), 1).exists()


def test_a_cursor_lost_after_a_failed_run_is_still_named(tmp_path: Path) -> None:
    """A run that fails after a view was published leaves an ERROR status: the view's ledgers must still not be
    taken for orphans when the cursor then goes."""
    root = tmp_path / "data"
    build(root)
    with Store.open(root) as store:
        store.append("t", [(b"new", b"message")], partition=0)
        raw = sorted(folder(root).glob("*.log"))[-1]
        data = bytearray(raw.read_bytes())
        data[-20] ^= 0x20  # the new batch's payload: the next run fails on its CRC
        raw.write_bytes(bytes(data))
        with pytest.raises(LedgerviewError):
            Compactor(store).compact("t")
        assert Compactor(store).status("t")[0].state is CompactionState.ERROR
        CompactedLedgers(folder(root)).cursor_path.unlink()
        with pytest.raises(LostCursorError):
            Compactor(store).compact("t")
    assert ledger_file(folder(root), 1).exists()


def test_a_damaged_topic_record_is_named_once_and_every_other_topic_still_verified(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """verify stopped at a topic whose metadata record is damaged, with one error line, leaving every later topic
    unchecked; its partition folders are checked too now."""
    data = tmp_path / "data"
    with Store.open(data) as store:
        for topic in ("broken", "orders"):
            store.create_topic(topic)
            store.append(topic, [(b"k", b"v")] * 3, partition=0)
    record = data / "__topics" / "broken" / "topic.json"
    record.write_bytes(record.read_bytes()[:-5])
    [orders_segment] = (data / "orders-0").glob("*.log")
    damaged = bytearray(orders_segment.read_bytes())
    damaged[-10] ^= 0xFF
    orders_segment.write_bytes(bytes(damaged))
    result = run_main(capsys, data, "verify")
    assert result.code == 1
    problems = [line for line in result.out.splitlines() if line.startswith("PROBLEM")]
    assert sum(str(record) in problem for problem in problems) == 1
    assert any(str(orders_segment) in problem for problem in problems), problems
    assert "Verified 2 topic(s), 2 partition(s)" in result.err


def test_repair_leaves_a_view_whose_raw_log_lost_a_segment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A rebuild reads the raw log over a gap without a word: with a segment lost from its middle, --repair
    replaced a view whose key index was damaged by one without the keys that only the lost segment held (and the
    old ledger still did)."""
    root = tmp_path / "data"
    with Store.open(root) as store:
        store.create_topic("t", config={"segment.bytes": "1024"})
        for start in range(0, len(KEYS), 50):
            store.append("t", [(key, b"old-" + key) for key in KEYS[start : start + 50]], partition=0)
        store.append("t", [(key, b"new-" + key) for key in KEYS[1::2]], partition=0)
        Compactor(store).compact("t")
    lost = sorted(folder(root).glob("*.log"))[2]
    for suffix in (".log", ".index", ".timeindex"):
        lost.with_suffix(suffix).unlink()
    damage_key_index(root)
    repaired = run_main(capsys, root, "verify", "--repair")
    assert repaired.code == 1
    assert "NOT REPAIRED t-0: its compacted view is damaged, and its raw log lacks offsets 44 to 49" in repaired.out
    with TableView(root, "t") as view:
        assert dict(view.items()) == {key: latest(key) for key in KEYS}
