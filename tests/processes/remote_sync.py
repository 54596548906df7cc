"""Uploads a store's sealed segments to its remote tier (``Store.sync_remote``), for the fault tests that kill it.

Usage: python remote_sync.py DATA_DIR

Writes "synced N" (segments uploaded) when done; with LEDGERVIEW_CRASH_AT set it dies at that point instead.
"""

from __future__ import annotations

import sys

from storage import Store


def main() -> int:
    with Store.open(sys.argv[1]) as store:
        uploaded = sum(len(result.uploaded) for result in store.sync_remote())
    print(f"synced {uploaded}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
