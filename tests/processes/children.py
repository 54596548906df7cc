"""Running the helper scripts of this folder as real child processes, for the tests.

A ``Child`` is one ``python <script> args...`` (started through without_pandas.py) with pipes on stdin, stdout
and stderr. The test reads its stdout line by line (with a generous deadline, so a hung child fails the test
instead of hanging it), writes lines to its stdin, and always leaves it killed, reaped and with its pipes closed:
use it as a context manager.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import TracebackType

from storage.faults import CRASH_AT_ENV, CRASH_RECORD_ENV

SCRIPTS = Path(__file__).resolve().parent
DEADLINE_S = 120.0
"""How long a test waits for a child's next line or exit before failing: a guard against hangs, not a timing."""


class Child:
    def __init__(self, script: str, *args: object, crash_at: str | None = None) -> None:
        env = {name: value for name, value in os.environ.items() if name not in (CRASH_AT_ENV, CRASH_RECORD_ENV)}
        self._crash_record: Path | None = None
        if crash_at is not None:
            descriptor, record = tempfile.mkstemp(prefix="ledgerview-crash-record-")
            os.close(descriptor)
            self._crash_record = Path(record)
            env.update({CRASH_AT_ENV: crash_at, CRASH_RECORD_ENV: record})
        self.name = f"{script} {' '.join(map(str, args))}"
        self.process = subprocess.Popen(
            [sys.executable, str(SCRIPTS / "without_pandas.py"), script, *map(str, args)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        )
        self._unread = b""
        self._ended = False
        self.stderr = ""

    @property
    def pid(self) -> int:
        return self.process.pid

    def __enter__(self) -> Child:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def _read_chunk(self, timeout_s: float) -> bool:
        """Take in what the child writes within ``timeout_s``; False if nothing came and stdout is still open."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        if self._ended or not select.select([fd], [], [], timeout_s)[0]:
            return False
        chunk = os.read(fd, 65536)
        self._unread += chunk
        self._ended = not chunk
        return True

    def line_ready(self) -> bool:
        """True when read_line would return at once: a whole line is waiting, or stdout was closed."""
        while b"\n" not in self._unread and self._read_chunk(0):
            pass
        return b"\n" in self._unread or self._ended

    def read_line(self) -> str | None:
        """The child's next stdout line (without its newline); None once it closed stdout with no whole line."""
        while b"\n" not in self._unread:
            if self._ended:
                return None
            if not self._read_chunk(DEADLINE_S):
                raise AssertionError(f"{self.name} wrote no line within {DEADLINE_S} s")
        line, _, self._unread = self._unread.partition(b"\n")
        return line.decode()

    def expect_line(self, expected: str) -> None:
        line = self.read_line()
        if line != expected:
            self.kill()
            raise AssertionError(f"{self.name} wrote {line!r}, expected {expected!r}; stderr:\n{self.finish()[2]}")

    def send_line(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{line}\n".encode())
        self.process.stdin.flush()

    def kill(self) -> None:
        """SIGKILL, as ``kill -9`` would; the caller then reaps the child with ``finish``."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)

    def finish(self) -> tuple[int, list[str], str]:
        """Close stdin, wait for the child to exit; its return code, its remaining whole stdout lines, stderr.

        A return code of -9 means the child died by SIGKILL. A trailing line without a newline (written when the
        child died) is not returned.
        """
        try:
            out, err = self.process.communicate(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.kill()
            out, err = self.process.communicate()
            raise AssertionError(f"{self.name} did not exit within {DEADLINE_S} s; stderr:\n{err.decode()}") from None
        self.stderr = err.decode()
        lines = (self._unread + out).decode().split("\n")[:-1]
        self._unread = b""
        return self.process.returncode, lines, self.stderr

    def crash_point_reached(self) -> str | None:
        """The crash point the child (or a process it started) reached and died at; None if none (storage/faults.py:
        the point writes its name before the kill)."""
        assert self._crash_record is not None, f"{self.name} was started without a crash point"
        reached = self._crash_record.read_text().split()
        return reached[0] if reached else None

    def close(self) -> None:
        """Kill the child if it still runs, reap it and close its pipes (Popen's own exit does the last two)."""
        self.kill()
        with self.process:
            pass
        if self._crash_record is not None:
            self._crash_record.unlink(missing_ok=True)


def assert_killed_at(child: Child, point: str) -> str:
    """Wait for ``child``, armed with the crash point ``point``: it, or a process it started (a Spark driver's
    Python worker, which kills the JVM), must have reached the point, and the child must have ended without a
    whole line. Returns its stderr, which a failure shows: a child that failed in any other way is not this."""
    code, lines, errors = child.finish()
    reached = child.crash_point_reached()
    assert reached == point and code != 0 and not lines, (
        f"{child.name} should have died at {point}: reached {reached}, exit status {code}, lines {lines}, stderr:\n"
        f"{errors[-3000:]}")
    return errors
