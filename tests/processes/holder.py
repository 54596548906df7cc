"""Hold a partition's writer lock the way another writer process would, until told to let go.

Usage: python holder.py LOCK_FILE

Takes ``flock(LOCK_EX)`` on LOCK_FILE (``<data>/<topic>-<partition>/.writer.lock``), writes "locked" to stdout,
then waits for a line (or end of file) on stdin, releases the lock and exits 0. Killing it releases the lock too.
"""

from __future__ import annotations

import fcntl
import os
import sys


def main() -> int:
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        sys.stdout.write("locked\n")
        sys.stdout.flush()
        sys.stdin.readline()
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
