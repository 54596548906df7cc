"""A crash inside an atomic write of a partition record (the compaction cursor or status in ``compacted/``, a
subscription cursor in ``subscriptions/``) leaves ``<record>.tmp`` behind; the next Store.open removes it and
touches nothing else, so the folders do not fill with temporaries and the record stays the old or the new one
(DESIGN.md invariants 1 and 5: recovery removes stray temporary files)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from compactor import Compactor
from readers import Consumer
from storage import Store
from storage.compacted import CompactedLedgers
from storage.cursors import read_subscription_cursor
from storage.files import COMPACTION_LOCK, COMPACTION_STATUS, TEMP_SUFFIX
from tests.processes.children import Child

PROCESSES = Path(__file__).parent / "processes"
TOPIC = "t"


def files_and_contents(data: Path) -> dict[Path, bytes]:
    """Every regular file under ``data`` (lock files included) and its bytes."""
    return {path: path.read_bytes() for path in sorted(data.rglob("*")) if path.is_file()}


def killed_inside_a_write(data: Path, script: str, *args: str, crash_at: str) -> None:
    child = subprocess.run([sys.executable, str(PROCESSES / script), str(data), TOPIC, *args], capture_output=True,
                           timeout=120, env={**os.environ, "LEDGERVIEW_CRASH_AT": crash_at})
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """A topic compacted once and with a subscription that acknowledged part of it: both record folders exist."""
    folder = tmp_path / "data"
    with Store.open(folder) as store:
        store.create_topic(TOPIC)
        store.append(TOPIC, [(b"k%d" % (i % 3), b"v%d" % i) for i in range(10)])
        Compactor(store).compact(TOPIC)
        store.append(TOPIC, [(b"k%d" % (i % 3), b"w%d" % i) for i in range(10)])
        with Consumer(store, TOPIC, "dashboard") as consumer:
            consumer.acknowledge_cumulative(0, 4)
    return folder


@pytest.mark.fault
@pytest.mark.parametrize(("script", "args", "crash_at", "record_folder"), [
    ("compact.py", (), "atomic_write.before_rename:1", "compacted"),
    ("compact.py", (), "atomic_write.before_rename:2", "compacted"),
    ("subscribe.py", ("dashboard",), "atomic_write.before_rename:1", "subscriptions"),
    ("subscribe.py", ("audit",), "atomic_write.before_rename:1", "subscriptions"),
], ids=["compaction status", "compaction cursor", "acknowledgement", "new subscription"])
def test_reopening_removes_a_killed_writes_temporary_and_touches_nothing_else(
        data: Path, script: str, args: tuple[str, ...], crash_at: str, record_folder: str) -> None:
    killed_inside_a_write(data, script, *args, crash_at=crash_at)
    before = files_and_contents(data)
    strays = [path for path in before if path.name.endswith(TEMP_SUFFIX)]
    assert len(strays) == 1 and strays[0].parent == data / f"{TOPIC}-0" / record_folder, strays

    with Store.open(data) as store:
        assert files_and_contents(data) == {path: content for path, content in before.items() if path != strays[0]}
        partition = store.partition_log(TOPIC, 0).folder
        cursor = CompactedLedgers(partition).read_cursor()
        assert cursor is not None and cursor.horizon in (9, 19)  # the old record or the new one, whole
        acked = read_subscription_cursor(partition, "dashboard", 0)
        assert acked is not None and acked.acked_offset in (5, 20)


def test_a_running_compactions_temporary_is_left_to_it(data: Path) -> None:
    """A compaction in another process holds the compaction lock while it writes its records: a store opened
    meanwhile must not take the temporary from under it (the rename would fail); the next open removes it."""
    ledgers = CompactedLedgers(data / f"{TOPIC}-0")
    in_progress = ledgers.folder / (COMPACTION_STATUS + TEMP_SUFFIX)
    with Child("holder.py", ledgers.folder / COMPACTION_LOCK) as holder:
        holder.expect_line("locked")
        in_progress.write_bytes(b"{}")
        Store.open(data).close()
        assert in_progress.exists()
    Store.open(data).close()
    assert not in_progress.exists()
