"""A compacted ledger is written in batches of about storage.ledger.BATCH_BYTES, so one damaged byte costs one batch:
every reader that meets it (Reader's compacted view, TableView, the ledger itself) raises CorruptLedgerError naming
the ledger and the batch's position, never skips it; the other batches still read."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from compactor import Compactor
from readers import Reader, TableView
from storage import Store
from storage.codec import HEADER_BYTES, BatchHeader
from storage.compacted import CompactedLedgers
from storage.errors import CorruptLedgerError, LedgerviewError
from storage.files import ledger_file, partition_folder
from storage.ledger import BATCH_BYTES, Ledger, bounded_slices
from storage.partition_log import estimated_message_bytes
from storage.schema import STORED_SCHEMA

VALUE = b"v" * 1000
KEYS = [b"key-%05d" % number for number in range(4000)]
"""About 4 MiB of live messages: four or five ledger batches."""


@pytest.fixture(scope="module")
def compacted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pristine") / "data"
    with Store.open(root) as store:
        store.create_topic("t")
        store.append("t", [(key, b"old") for key in KEYS], partition=0)
        store.append("t", [(key, VALUE) for key in KEYS], partition=0)
        Compactor(store).compact("t")
    return root


def open_ledger(root: Path) -> Ledger:
    opened = CompactedLedgers(partition_folder(root, "t", 0)).open_current()
    assert opened is not None
    return opened[1]


def test_ledger_batches_are_bounded(compacted: Path) -> None:
    ledger = open_ledger(compacted)
    try:
        assert ledger.messages == len(KEYS) and len(ledger.headers) >= 4
        for header in ledger.headers:
            rows = ledger.read_batches(header.base_offset, header.last_offset + 1)
            table = pa.Table.from_batches(list(rows), STORED_SCHEMA)
            assert int(estimated_message_bytes(table).sum()) <= BATCH_BYTES
            assert header.batch_length <= BATCH_BYTES + 64 * 1024  # plus the header and Arrow's metadata
    finally:
        ledger.close()


def test_a_message_larger_than_the_bound_has_a_batch_of_its_own() -> None:
    batch = pa.RecordBatch.from_pylist(
        [{"offset": n, "timestamp": 0, "key": b"k%d" % n, "value": b"x" * size, "headers": None}
         for n, size in enumerate([10, 10, 5000, 10, 10])], STORED_SCHEMA)
    pieces = [piece.column(0).to_pylist() for piece in bounded_slices(batch, 1000)]
    assert pieces == [[0, 1], [2], [3, 4]]


def damaged_batch(pristine: Path, tmp_path: Path, batch: int) -> tuple[Path, Path, int, int]:
    """A copy of ``pristine`` with one payload byte of ledger batch ``batch`` flipped: (root, ledger path, position
    of the batch, its first offset)."""
    root = tmp_path / "data"
    shutil.copytree(pristine, root)
    ledger = open_ledger(root)
    header = ledger.headers[batch]
    ledger.close()
    path = ledger_file(partition_folder(root, "t", 0), 1)
    data = bytearray(path.read_bytes())
    data[header.position + HEADER_BYTES + header.batch_length // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return root, path, header.position, header.base_offset


def test_a_damaged_ledger_batch_is_named_by_every_reader_and_costs_only_that_batch(compacted: Path,
                                                                                  tmp_path: Path) -> None:
    root, path, position, first_offset = damaged_batch(compacted, tmp_path, batch=2)
    ledger = open_ledger(root)
    [damaged_range] = [(h.base_offset, h.last_offset) for h in ledger.headers if h.position == position]
    named = rf"compacted ledger {path} at file position {position} \(its messages from offset {first_offset}\)"
    with Reader(root, "t", read_compacted=True) as reader, pytest.raises(CorruptLedgerError, match=named):
        list(reader.batches())
    offset_of = {key: 4000 + number for number, key in enumerate(KEYS)}
    with TableView(root, "t") as view:
        for key in KEYS[::97]:
            if damaged_range[0] <= offset_of[key] <= damaged_range[1]:
                with pytest.raises(CorruptLedgerError, match=named):
                    view.get(key)
            else:
                assert view.get(key) == VALUE
    try:
        intact = [header for header in ledger.headers if header.position != position]
        for header in intact:  # every other batch still reads
            read = list(ledger.read_batches(header.base_offset, header.last_offset + 1))
            assert sum(batch.num_rows for batch in read) == header.record_count
    finally:
        ledger.close()


def test_a_damaged_batch_header_is_named_when_the_ledger_opens(compacted: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    shutil.copytree(compacted, root)
    ledger = open_ledger(root)
    header = ledger.headers[1]
    ledger.close()
    path = ledger_file(partition_folder(root, "t", 0), 1)
    data = bytearray(path.read_bytes())
    data[header.position + 16] ^= 0x04  # the magic byte
    path.write_bytes(bytes(data))
    named = rf"compacted ledger {path} at file position {header.position}: .*verify --repair"
    with Reader(root, "t", read_compacted=True) as reader, pytest.raises(CorruptLedgerError, match=named):
        list(reader.batches())


def copy_with_ledger_bytes(compacted: Path, tmp_path: Path, change: Callable[[bytearray, list[BatchHeader]], bytes]
                           ) -> Path:
    """A copy of the store whose ledger file is ``change(its bytes, its batch headers)``."""
    root = tmp_path / "data"
    shutil.copytree(compacted, root)
    ledger = open_ledger(root)
    headers = list(ledger.headers)
    ledger.close()
    path = ledger_file(partition_folder(root, "t", 0), 1)
    path.write_bytes(change(bytearray(path.read_bytes()), headers))
    return root


def flip_base_offset(data: bytearray, header: BatchHeader) -> bytes:
    data[header.position + 3] ^= 0x01  # base_offset + 2**24
    return bytes(data)


@pytest.mark.parametrize("change", [
    pytest.param(lambda data, headers: bytes(data[: headers[-1].position]), id="the last batch cut off"),
    pytest.param(lambda data, headers: flip_base_offset(data, headers[-1]), id="the last batch's base offset"),
    pytest.param(lambda data, headers: flip_base_offset(data, headers[1]), id="a middle batch's base offset"),
])
def test_a_ledger_that_lost_or_misplaces_a_batch_is_an_error_not_a_smaller_view(
        compacted: Path, tmp_path: Path, change: Callable[[bytearray, list[BatchHeader]], bytes]) -> None:
    """Whole batches lost (a file cut at a batch boundary) or a header saying the wrong offsets leave every batch
    that is read intact: only the view's cursor (the messages it serves, its horizon) and the order of the headers
    show it. Readers, lookups and the next compaction must refuse such a view, never serve or keep it smaller."""
    root = copy_with_ledger_bytes(compacted, tmp_path, change)
    with Reader(root, "t", read_compacted=True) as reader, pytest.raises(LedgerviewError, match="verify --repair"):
        list(reader.batches())
    with pytest.raises(LedgerviewError, match="verify --repair"), TableView(root, "t") as view:
        view.get(KEYS[-1])
    with Store.open(root) as store:
        cursor = CompactedLedgers(partition_folder(root, "t", 0)).read_cursor()
        store.append("t", [(b"new", b"message")], partition=0)
        with pytest.raises(LedgerviewError, match="verify --repair"):
            Compactor(store).compact("t")
        assert CompactedLedgers(partition_folder(root, "t", 0)).read_cursor() == cursor
