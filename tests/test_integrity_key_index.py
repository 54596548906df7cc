"""One flipped byte anywhere in a key index (storage/key_index.py) never makes a point lookup answer wrong: RocksDB's
block checksums and the open-time check of its manifest against the folder's SST files turn the damage into a
CorruptKeyIndexError naming the index, and a ledger whose index is damaged answers lookups from a scan of itself.
Every file of the index is swept (a bounded sample of positions per file)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from compactor import Compactor
from readers import TableView
from storage import Store
from storage.compacted import CompactedLedgers
from storage.files import key_index_folder, partition_folder
from storage.key_index import CorruptKeyIndexError, KeyIndex

KEYS = [b"key-%05d" % number for number in range(3000)]
PROBES = KEYS[::13] + [b"key-%05d" % number for number in range(3000, 3010)] + [b"", b"a", b"zzz"]
POSITIONS_PER_FILE = 6
"""Per file in the fast sweep; the slow one takes 200."""


def expected(key: bytes) -> bytes | None:
    return b"value-" + key if key in set(KEYS) else None


@pytest.fixture(scope="module")
def compacted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data folder whose topic t is compacted: one ledger of 3,000 keys and its key index."""
    root = tmp_path_factory.mktemp("pristine") / "data"
    with Store.open(root) as store:
        store.create_topic("t")
        store.append("t", [(key, b"stale") for key in KEYS[::2]], partition=0)
        store.append("t", [(key, b"value-" + key) for key in KEYS], partition=0)
        Compactor(store).compact("t")
    return root


def index_folder(root: Path) -> Path:
    folder = partition_folder(root, "t", 0)
    cursor = CompactedLedgers(folder).read_cursor()
    assert cursor is not None
    return key_index_folder(folder, cursor.ledger_id)


def flips(root: Path, per_file: int = POSITIONS_PER_FILE) -> list[tuple[str, int]]:
    """(file name, position) pairs: evenly spread over every file of the index RocksDB may read (not its LOG),
    plus the last bytes of each (an SST's index block and footer, a manifest's last record)."""
    chosen = []
    for path in sorted(index_folder(root).iterdir()):
        size = path.stat().st_size
        if path.name == "LOG":
            continue
        spread = range(0, size, max(1, size // per_file))
        chosen += [(path.name, position) for position in sorted({*spread, *range(max(0, size - 8), size)})]
    return chosen


def damage(pristine: Path, root: Path, name: str, position: int) -> None:
    """Make ``root`` (a copy of ``pristine``) hold the pristine key index with one byte of ``name`` flipped."""
    shutil.rmtree(index_folder(root))
    shutil.copytree(index_folder(pristine), index_folder(root))
    path = index_folder(root) / name
    data = bytearray(path.read_bytes())
    data[position] ^= 0x10
    path.write_bytes(bytes(data))


def test_the_sweep_covers_every_file_of_the_index(compacted: Path) -> None:
    names = {name for name, _ in flips(compacted)}
    assert any(name.endswith(".sst") for name in names)
    assert {"CURRENT", "OPTIONS"} <= {name.split("-")[0] for name in names}
    assert any(name.startswith("MANIFEST-") for name in names)


def sweep_key_index(pristine: Path, tmp_path: Path, per_file: int) -> None:
    """KeyIndex.locate on each damaged index: every answer is the key's offset, or absent as it should be, or a
    CorruptKeyIndexError naming the index; every flip of an SST or manifest byte is detected."""
    with Store.open(pristine, read_only=True) as store:
        opened = store.compacted_ledgers("t", 0).open_current()
        assert opened is not None
        truth = {key: opened[1].offset_of(key) for key in PROBES}
        opened[1].close()
    root = tmp_path / "data"
    shutil.copytree(pristine, root)
    undetected = []
    for name, position in flips(pristine, per_file):
        damage(pristine, root, name, position)
        index = KeyIndex(index_folder(root))
        detected = False
        try:
            for key in PROBES:
                try:
                    assert index.locate(key) == truth[key], (name, position, key)
                except CorruptKeyIndexError as error:
                    assert str(index_folder(root)) in str(error)
                    detected = True
        finally:
            index.close()
        if not detected and (name.endswith(".sst") or name.startswith("MANIFEST-")):
            undetected.append((name, position))
    assert not undetected


def test_every_flip_is_an_error_or_the_right_answer(compacted: Path, tmp_path: Path) -> None:
    sweep_key_index(compacted, tmp_path, POSITIONS_PER_FILE)


@pytest.mark.slow
def test_every_flip_is_an_error_or_the_right_answer_thorough(compacted: Path, tmp_path: Path) -> None:
    sweep_key_index(compacted, tmp_path, 200)


@pytest.mark.slow
def test_table_view_answers_from_the_ledger_when_its_key_index_is_damaged(
        compacted: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """TableView.get never returns a wrong value or a wrong None, whichever byte of the index is flipped; a damaged
    index is logged with its path and what to do."""
    root = tmp_path / "data"
    shutil.copytree(compacted, root)
    warned = 0
    for name, position in flips(compacted)[::3]:
        damage(compacted, root, name, position)
        caplog.clear()
        with caplog.at_level(logging.WARNING), TableView(root, "t") as view:
            for key in PROBES:
                assert view.get(key) == expected(key), (name, position, key)
        for record in caplog.records:
            assert "verify --repair" in record.getMessage() and str(index_folder(root)) in record.getMessage()
        warned += bool(caplog.records)
    assert warned


def test_a_lost_sst_file_is_damage_not_an_empty_index(compacted: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    shutil.copytree(compacted, root)
    for sst in index_folder(root).glob("*.sst"):
        sst.rename(sst.with_suffix(".moved"))
    index = KeyIndex(index_folder(root))
    try:
        with pytest.raises(CorruptKeyIndexError, match=r"RocksDB cannot open it|manifest names"):
            index.locate(KEYS[0])
    finally:
        index.close()
    with TableView(root, "t") as view:
        assert view.get(KEYS[0]) == expected(KEYS[0])
