"""A data folder on a read-only mount (a bind mount remounted read-only in a private mount namespace, since chmod does
not stop root, who runs these tests): a read-only Store serves raw and compacted reads and point lookups (the key
index, which rocksdict cannot open there, is replaced by a scan of the ledger), verify checks it, and a write is
refused with a message, never a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from compactor import Compactor
from readers import Consumer
from storage import Store

pytestmark = pytest.mark.slow  # each test runs processes in a mount namespace of their own

SCRIPT = textwrap.dedent("""
    import sys
    import pyarrow as pa
    from readers import Reader, TableView
    from storage import Store
    root = sys.argv[1]
    with Store.open(root, read_only=True) as store:
        with Reader(store, "t") as raw, Reader(store, "t", read_compacted=True) as compacted:
            print("raw", sum(batch.num_rows for batch in raw.batches()))
            print("compacted", sum(batch.num_rows for batch in compacted.batches()))
        with TableView(store, "t") as view:
            print("get", view.get(b"k7"), view.get(b"absent"))
""")


def unshare_available(tmp_path: Path) -> str | None:
    """Why a read-only bind mount cannot be made here, or None."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return "needs root and unshare to make a read-only bind mount"
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "mount", "--bind", str(tmp_path),
                            str(tmp_path)], capture_output=True)
    return None if probe.returncode == 0 else f"mount namespaces are not allowed here: {probe.stderr.decode()}"


def run_read_only(source: Path, *command: str) -> subprocess.CompletedProcess[str]:
    """``command`` run with ``source`` bind-mounted read-only over itself, in a mount namespace of its own."""
    quoted = " ".join(f"'{part}'" for part in command)
    shell = (f"mount --bind '{source}' '{source}' && mount -o remount,bind,ro '{source}' && "
             f"touch '{source}/probe' 2>/dev/null && echo WRITABLE; cd '{Path.cwd()}' && {quoted}")
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", shell],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    reason = unshare_available(tmp_path)
    if reason is not None:
        pytest.skip(reason)
    root = tmp_path / "data"
    with Store.open(root) as store:
        store.create_topic("t")
        store.append("t", [(b"k%d" % n, b"v%d" % n) for n in range(100)], partition=0)
        store.append("t", [(b"k%d" % n, b"w%d" % n) for n in range(0, 100, 2)], partition=0)
        Compactor(store).compact("t")
    return root


def test_a_read_only_store_serves_reads_and_lookups(data: Path) -> None:
    result = run_read_only(data, sys.executable, "-c", SCRIPT, str(data))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:3] == ["raw 150", "compacted 100", "get b'v7' None"]


def test_verify_checks_a_read_only_folder_and_produce_is_refused_clearly(data: Path) -> None:
    verify = run_read_only(data, sys.executable, "-m", "ledgerview", "--data", str(data), "verify")
    assert verify.returncode == 0 and "WRITABLE" not in verify.stdout, verify.stdout + verify.stderr
    assert "cannot be opened here" in verify.stdout and ": sound." in verify.stderr
    produce = run_read_only(data, sys.executable, "-m", "ledgerview", "--data", str(data), "produce", "t")
    assert produce.returncode != 0 and "Traceback" not in produce.stderr
    assert "Read-only file system" in produce.stderr


def test_consume_serves_a_read_only_folder(data: Path) -> None:
    consume = run_read_only(data, sys.executable, "-m", "ledgerview", "--data", str(data), "consume", "t",
                            "--from-beginning", "--until-end")
    assert consume.returncode == 0, consume.stderr


@pytest.mark.parametrize(("command", "shown"), [
    (["topics", "list"], "t\n"),
    (["topics", "describe"], "Topic: t\t"),
    (["groups", "list"], "g\n"),
    (["groups", "describe", "g"], "  t          0"),
    (["compaction-status", "t"], "SUCCESS"),
])
def test_the_commands_that_only_read_serve_a_read_only_folder(data: Path, command: list[str], shown: str) -> None:
    """They opened the folder as a writer would, so on a read-only one each failed with 'Read-only file system:
    .../.store.lock' (exit status 5), as consume and verify no longer did."""
    with Store.open(data) as store, Consumer(store, "t", "g", initial_position="earliest") as consumer:
        consumer.acknowledge_cumulative(0, 9)
    result = run_read_only(data, sys.executable, "-m", "ledgerview", "--data", str(data), *command)
    assert result.returncode == 0 and "WRITABLE" not in result.stdout, result.stdout + result.stderr
    assert shown in result.stdout, result.stdout
