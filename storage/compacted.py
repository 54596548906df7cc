"""A partition's compacted view on disk: its ledgers, the compaction cursor that names the current one, and the
retiring of old ledgers.

The compaction cursor (``compacted/cursor.json``) is the only thing readers consult to choose the compacted view:
it names the ledger and the horizon, the last offset the ledger covers, and, for a layered view
(storage/ledger_layers.py), the ledgers beneath it. Publishing a new view is one atomic replace of that record;
the ledgers the new view no longer reads are renamed ``.deleted`` (readers that already opened them keep their
memory maps and index handles) and removed after ``file.delete.delay.ms``. A ledger that neither the cursor names
nor is retiring is an orphan of a crashed run; it is removed under the compaction lock.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from storage import faults
from storage.compaction_status import CompactionStatus, published_a_view, read_status
from storage.dropped_tombstones import Ranges, check, of_record
from storage.errors import CorruptDataError, LedgerviewError, PartitionLockedError
from storage.fileio import holds_temporary_files, remove_stray_temporary_files, write_atomically
from storage.files import (
    COMPACTION_CURSOR,
    COMPACTION_LOCK,
    DELETED_SUFFIX,
    LAYER_RECORD_SUFFIX,
    key_index_folder,
    layer_record_file,
    ledger_file,
    ledgers_folder,
    parse_ledger_file,
)
from storage.key_index import UNINDEXED_MARKER
from storage.ledger import Ledger, LedgerReads
from storage.ledger_layers import LayeredLedger, LowerLayer, read_layer_record
from storage.locks import FileLock
from storage.records import CorruptRecordError, decode_record, encode_record

CURSOR_RECORD = "compaction-cursor"
CURSOR_VERSION = 4
"""1: the unchecksummed record of earlier releases (still read); 2: storage/records.py's format; 3: layered views
(``lower_layers``, ``layer_records_from``), which releases that read up to 2 refuse (they could not read this
release's batches either: docs/FORMAT.md, "Implied columns"); 4: ``dropped_tombstones``."""


class CorruptCompactionCursorError(CorruptDataError):
    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"Compaction cursor {path} is unreadable: {reason}. Rebuild the compacted view from the raw "
                         "log with `ledgerview verify --repair` (it refuses while retention has removed raw messages "
                         "the view holds; removing the cursor would then lose the keys only the view holds).")


class LostCursorError(CorruptDataError):
    """The compaction cursor is gone, though a compaction published a view here and its ledgers remain: reading
    or compacting as if the partition had never been compacted would drop every key only the view holds."""

    def __init__(self, cursor_path: Path, ledger_ids: list[int]) -> None:
        super().__init__(
            f"The compaction cursor {cursor_path} is missing, though the last compaction succeeded and ledgers "
            f"{ledger_ids} are still there: the cursor was lost. Restore it from a copy, or rebuild the view from "
            "the raw log with `ledgerview verify --repair` (it refuses while retention has removed raw messages "
            f"the view may hold; to give the view up then, remove {cursor_path.parent}).")


class ViewMismatchError(CorruptDataError):
    """The ledgers of a view do not hold what its cursor says they do: a ledger lost whole batches (a truncated
    file) or a batch header is damaged. Served as it is, the view would silently miss keys."""

    def __init__(self, cursor_path: Path, reason: str) -> None:
        super().__init__(f"The compacted view that {cursor_path} names does not match its ledgers: {reason}. A ledger "
                         "or the cursor is damaged; rebuild the view from the raw log with `ledgerview verify "
                         "--repair`, which works while retention has not removed the raw messages the view covers.")


@dataclass(frozen=True)
class CompactionCursor:
    """The cursor-metadata record of a partition's two-phase compaction."""

    ledger_id: int
    """The ledger that holds the compacted view: the top one of a layered view."""
    horizon: int
    """The last raw offset the ledger covers; readers of the compacted view read the raw log above it."""
    messages_read: int
    """Messages phase one read (the previous view plus the raw tail)."""
    messages_kept: int
    """Messages the view serves: one per live key (plus keyless ones when they are retained)."""
    ledger_bytes: int
    """Size of the view's ledger files."""
    published_ms: int
    """Wall-clock time of the publish."""
    retiring: tuple[tuple[int, int], ...] = ()
    """``(top ledger id, horizon)`` of the views this one replaced that could still be opened at the publish: a
    reader that opened one of them reads the raw log above its horizon, so retention holds that too."""
    lower_layers: tuple[int, ...] = ()
    """The ledgers beneath ``ledger_id``, bottom first, when the view is layered (their record:
    ``<ledger_id>.layers``)."""
    layer_records_from: int = 0
    """Ledgers from this id on were published with a layer record; a ledger below it was published by an earlier
    release, as a view of one ledger (0: the cursor of an earlier release, every ledger is such)."""
    dropped_tombstones: Ranges = ()
    """Offset ranges that hold every tombstone a compaction of the partition left out, being its key's latest
    message, and every raw offset no compaction read (storage/dropped_tombstones.py). A record of an earlier
    release, which keeps none, reads as everything up to its horizon."""

    @property
    def ledger_ids(self) -> tuple[int, ...]:
        """Every ledger the view reads."""
        return (*self.lower_layers, self.ledger_id)

    def recorded(self, ledger_id: int) -> bool:
        """Whether ledger ``ledger_id`` was published with a layer record (by this release)."""
        return bool(self.layer_records_from) and ledger_id >= self.layer_records_from

    def __post_init__(self) -> None:
        if self.ledger_id < 0 or self.horizon < -1 or min(self.messages_read, self.messages_kept) < 0:
            raise ValueError(f"invalid compaction cursor {self}")
        check(self.dropped_tombstones, self.horizon)

    @property
    def messages_removed(self) -> int:
        return self.messages_read - self.messages_kept


class CompactedLedgers:
    """The ``compacted/`` folder of one partition."""

    def __init__(self, partition_folder: Path) -> None:
        self.partition_folder = partition_folder
        self.folder = ledgers_folder(partition_folder)
        self.cursor_path = self.folder / COMPACTION_CURSOR

    def lock(self, *, wait: bool) -> FileLock:
        """The lock a compaction run holds from start to publish; a second run finds it taken."""
        self.folder.mkdir(exist_ok=True)
        return FileLock(self.folder / COMPACTION_LOCK, wait=wait)

    def is_locked(self) -> bool:
        """Whether a compaction run holds the lock now (checked by taking it for an instant)."""
        lock = self.lock(wait=False)
        try:
            with lock:
                return False
        except PartitionLockedError:
            return True

    def status(self, partition: int) -> CompactionStatus:
        """Pulsar's compaction status of the partition; a RUNNING one whose run holds the lock no more is an ERROR."""
        return read_status(self.partition_folder, partition, run_in_progress=self.is_locked)

    def read_cursor(self) -> CompactionCursor | None:
        try:
            data = self.cursor_path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            _, record = decode_record(self.cursor_path, data, CURSOR_RECORD, max_version=CURSOR_VERSION, legacy=True)
            record["retiring"] = tuple(tuple(pair) for pair in record.get("retiring", ()))
            record["lower_layers"] = tuple(record.get("lower_layers", ()))
            record["dropped_tombstones"] = of_record(record.get("dropped_tombstones"), record["horizon"])
            return CompactionCursor(**record)
        except CorruptRecordError as error:
            raise CorruptCompactionCursorError(self.cursor_path, error.reason) from error
        except (ValueError, TypeError, KeyError) as error:
            raise CorruptCompactionCursorError(self.cursor_path, str(error)) from error

    def open_current(self, *, verify: bool = True) -> tuple[CompactionCursor, LedgerReads] | None:
        """The cursor and its view, opened; None before the first compaction.

        A publish may retire the view between reading the cursor and opening it: then read the cursor again.
        """
        for _ in range(100):
            cursor = self.read_cursor()
            if cursor is None:
                self.check_cursor_not_lost()
                return None
            unnamed = cursor.lower_layers and not self.has_layer_record(cursor.ledger_id)  # its layers are unknown
            view = None if unnamed else self.open_ledger(cursor.ledger_id, verify=verify)
            if view is not None:
                self._check_view(cursor, view)
                return cursor, view
            if self.read_cursor() == cursor:
                raise FileNotFoundError(f"{ledger_file(self.partition_folder, cursor.ledger_id)}, which the "
                                        "compaction cursor names, or a ledger beneath it, is missing")
        raise LedgerviewError(f"The compacted ledger of {self.partition_folder} keeps changing under the reader.")

    def check_cursor_not_lost(self) -> None:
        """Raise LostCursorError if the cursor is missing though a run published a view (its status says so) and
        ledgers remain. Ledgers without a cursor are otherwise what a first run left when it stopped before its
        publish: orphans, which the next run removes. The status is read first: a publish writes the cursor before
        it, so a first run that publishes meanwhile is seen with its cursor."""
        if not published_a_view(self.partition_folder) or self.cursor_path.exists():
            return
        ledger_ids = sorted({parsed[0] for name in _names(self.folder)
                             if (parsed := parse_ledger_file(name)) is not None and parsed[2] is None})
        if ledger_ids:
            raise LostCursorError(self.cursor_path, ledger_ids)

    def _check_view(self, cursor: CompactionCursor, view: LedgerReads) -> None:
        """Raise ViewMismatchError (closing the view) unless its ledgers' batch headers agree with the cursor: the
        messages it serves, and no ledger above its horizon. The headers are in memory already; their CRCs are
        checked as batches are read, but a reader skips the batches outside its range by their headers alone."""
        ledgers: list[tuple[int, LedgerReads]] = [(cursor.horizon, view)]
        if isinstance(view, LayeredLedger):
            ledgers = [*((layer.horizon, ledger) for layer, ledger in view.lower), (cursor.horizon, view.top)]
        reason = None
        if view.messages != cursor.messages_kept:
            reason = f"it says the view serves {cursor.messages_kept} messages, the ledgers hold {view.messages}"
        for horizon, ledger in ledgers:
            if ledger.headers and ledger.headers[-1].last_offset > horizon:
                reason = (f"ledger {ledger.source} holds offset {ledger.headers[-1].last_offset}, above its horizon "
                          f"{horizon}")
        if reason is not None:
            view.close()
            raise ViewMismatchError(self.cursor_path, reason)

    def open_ledger(self, ledger_id: int, *, verify: bool = True) -> LedgerReads | None:
        """The view ledger ``ledger_id`` tops, opened whether it is current or retiring (its layer record, and the
        ledgers no later view reads, renamed ``.deleted`` by a later publish); None once it is removed. Lets the
        tasks of one query read the view they were planned on."""
        found = self._read_layer_record(ledger_id)
        if found is None:
            return self._open_one(ledger_id, verify=verify) if self._plain_view_exists(ledger_id) else None
        record, lower = found
        if not lower:
            return self._open_one(ledger_id, verify=verify)
        opened: list[Ledger] = []
        try:
            for layer_id in (*(layer.ledger_id for layer in lower), ledger_id):
                ledger = self._open_one(layer_id, verify=verify)
                if ledger is None:
                    break
                opened.append(ledger)
            if len(opened) == len(lower) + 1:
                return LayeredLedger(list(zip(lower, opened[:-1], strict=True)), opened[-1], record=record)
        except BaseException:
            for ledger in opened:
                ledger.close()
            raise
        for ledger in opened:
            ledger.close()
        return None

    def _layer_records(self, ledger_id: int) -> tuple[Path, Path]:
        """Where the layer record of the view ``ledger_id`` tops is while it is current, then once retired."""
        path = layer_record_file(self.partition_folder, ledger_id)
        return path, path.with_name(path.name + DELETED_SUFFIX)

    def _read_layer_record(self, ledger_id: int) -> tuple[Path, list[LowerLayer]] | None:
        """Where the view's record is, current or retired (a publish may rename it between the two reads), and the
        lower layers it names; None when it has none."""
        for path in self._layer_records(ledger_id):
            try:
                return path, read_layer_record(path)
            except FileNotFoundError:
                continue
        return None

    def has_layer_record(self, ledger_id: int) -> bool:
        """Whether the view ``ledger_id`` tops has its layer record, current or retiring: only a view published by
        this release has one, and only such a view can have a layered one published over it."""
        return any(path.exists() for path in self._layer_records(ledger_id))

    def _plain_view_exists(self, ledger_id: int) -> bool:
        """For a view without a layer record: whether it is a view of one ledger that an earlier release
        published and that is still there. A ledger of this release without its record is a view that was
        retired and removed, even while a layered view still reads the ledger."""
        cursor = self._cursor_unless_damaged()
        if cursor is None or cursor.recorded(ledger_id):
            return False
        ledger, _ = self.ledger_paths(ledger_id)
        return ledger.with_name(ledger.name + DELETED_SUFFIX).exists() or ledger.exists()

    def _open_one(self, ledger_id: int, *, verify: bool) -> Ledger | None:
        for _ in range(3):  # a publish renames the ledger, then its index: look again if caught between
            for suffix in ("", DELETED_SUFFIX):
                ledger = ledger_file(self.partition_folder, ledger_id)
                index = key_index_folder(self.partition_folder, ledger_id)
                ledger, index = ledger.with_name(ledger.name + suffix), index.with_name(index.name + suffix)
                if ledger.exists() and index.exists():
                    try:
                        return Ledger(ledger, index, verify=verify)
                    except FileNotFoundError:
                        continue
        return None

    def tier_can_copy(self, cursor: CompactionCursor) -> bool:
        """Whether the remote tier can copy the view ``cursor`` names: one ledger, with its key index. A layered or
        unindexed view, compacted before its topic turned remote.storage.enable on, is rewritten by the next
        compaction first."""
        return not cursor.lower_layers and not (
            key_index_folder(self.partition_folder, cursor.ledger_id) / UNINDEXED_MARKER).exists()

    def next_ledger_id(self) -> int:
        ids = [parsed[0] for name in _names(self.folder) if (parsed := parse_ledger_file(name))]
        return max(ids, default=0) + 1

    def ledger_paths(self, ledger_id: int) -> tuple[Path, Path]:
        self.folder.mkdir(exist_ok=True)
        return ledger_file(self.partition_folder, ledger_id), key_index_folder(self.partition_folder, ledger_id)

    def layer_record_path(self, ledger_id: int) -> Path:
        return layer_record_file(self.partition_folder, ledger_id)

    def publish(self, cursor: CompactionCursor) -> None:
        """Make ``cursor`` (whose ledger is finished and durable) the partition's compacted view.

        1. Replace the cursor record atomically (write, fsync, rename, fsync the folder). A crash before the
           rename leaves the old view and an orphan ledger, removed by the next run; after it, the new view.
           The record lists the previous view's top ledger and those still retiring, with their horizons, so
           retention keeps the raw data their readers still need (``retention_hold_offset``).
        2. Rename ``.deleted`` the ledgers of the previous view that the new one does not read, with their
           indexes, then the previous view's layer record. A crash before this leaves them as orphans, removed by
           the next run. Readers that opened them keep reading them.

        A damaged cursor record is replaced like any other; the ledgers it named become orphans.
        """
        previous = self._cursor_unless_damaged()
        records_from = previous.layer_records_from if previous is not None else 0
        cursor = replace(cursor, layer_records_from=records_from or cursor.ledger_id)
        if previous is not None and previous.ledger_id != cursor.ledger_id:
            still_there = tuple(pair for pair in previous.retiring if self._view_exists(pair[0]))
            cursor = replace(cursor, retiring=((previous.ledger_id, previous.horizon), *still_there))
        write_atomically(self.cursor_path, encode_record(CURSOR_RECORD, CURSOR_VERSION, asdict(cursor)))
        faults.crash_point("compacted.publish_before_retire")
        if previous is not None:
            gone = set(previous.ledger_ids) - set(cursor.ledger_ids)
            # the previous view's record after its ledgers, so a retired ledger is removed no later than it (the
            # records of the ledgers beneath were retired when they stopped being the top)
            retired = [*(path for ledger_id in sorted(gone) for path in self.ledger_paths(ledger_id)),
                       self.layer_record_path(previous.ledger_id)]
            for path in retired:
                if path.exists():
                    path.rename(path.with_name(path.name + DELETED_SUFFIX))

    def remove_stray_record_temporaries(self) -> list[Path]:
        """Remove the temporaries of cursor and status writes a crash interrupted; returns what was removed.
        Those writes happen under ``lock``: it is tried without waiting, and a run in progress leaves its files
        alone (the next sweep takes them). The lock is taken only when there is something to remove."""
        if not holds_temporary_files(self.folder):
            return []
        try:
            with self.lock(wait=False):
                return remove_stray_temporary_files(self.folder)
        except PartitionLockedError:
            return []

    def _view_exists(self, ledger_id: int) -> bool:
        """Whether the view ``ledger_id`` tops can still be opened (``open_ledger``)."""
        return self.has_layer_record(ledger_id) or self._plain_view_exists(ledger_id)

    def _cursor_unless_damaged(self) -> CompactionCursor | None:
        try:
            return self.read_cursor()
        except CorruptCompactionCursorError:
            return None

    def lowest_horizon_in_use(self) -> int | None:
        """The lowest horizon among the current ledger and the retiring ones still on disk (None: no cursor)."""
        cursor = self.read_cursor()
        if cursor is None:
            return None
        retiring = [horizon for ledger_id, horizon in cursor.retiring if self._view_exists(ledger_id)]
        return min([cursor.horizon, *retiring])

    def remove_orphans_and_retired(self, *, delete_delay_ms: int) -> list[str]:
        """Remove ledgers no cursor names and retired ones older than the delay; call under ``lock``. While the
        cursor record is damaged no ledger counts as an orphan (the one it named is unknown).

        The delay is measured on the wall clock, as the files' change times are: a retired ledger's rename
        stamps its ctime."""
        now_seconds = time.time()
        try:
            cursor, damaged = self.read_cursor(), False
        except CorruptCompactionCursorError:
            cursor, damaged = None, True
        removed = []
        for name in _names(self.folder):
            parsed = parse_ledger_file(name)
            if parsed is None:
                continue
            ledger_id, suffix, temp = parsed
            path = self.folder / name
            retired_at = path.stat().st_ctime  # a rename updates ctime: the time it was retired
            retired_long_enough = temp == DELETED_SUFFIX and retired_at <= now_seconds - delete_delay_ms / 1000
            # a layer record belongs to the view its ledger tops: one beneath the current top is the record of a
            # view a crash kept its publish from retiring
            named = cursor is not None and (
                ledger_id == cursor.ledger_id if suffix == LAYER_RECORD_SUFFIX else ledger_id in cursor.ledger_ids)
            orphan = temp is None and not damaged and not named
            if retired_long_enough or orphan:
                shutil.rmtree(path) if path.is_dir() else path.unlink()
                removed.append(name)
        return removed


def _names(folder: Path) -> list[str]:
    try:
        return [entry.name for entry in folder.iterdir()]
    except FileNotFoundError:
        return []


def retention_hold_offset(partition_folder: Path, *, two_phase_enabled: bool) -> int | None:
    """The lowest raw offset that retention must keep, or None when nothing is held.

    While two-phase compaction is on for a topic (its threshold is set, or it has been compacted), raw data above
    the horizon is what the next compaction reads, so it is held: from offset 0 until the first compaction, then
    from horizon + 1. This is the role of Pulsar's pre-created ``__compaction`` cursor. A replaced ledger that is
    still retiring holds from its own horizon + 1, so a reader that opened it before the publish can finish
    (the problem of Pulsar's PR #12522).
    """
    horizon = CompactedLedgers(partition_folder).lowest_horizon_in_use()
    if horizon is None:
        return 0 if two_phase_enabled else None
    return horizon + 1
