"""One remote-tier step over a store, for the fault tests that kill it: ``sync`` (Store.sync_remote), ``compact``
(Compactor.compact of every topic, which uploads the new ledgers of tiered ones) or ``retention``
(Store.enforce_retention of every topic).

Usage: python remote_sync.py DATA_DIR sync|compact|retention

Writes "done" when finished; with LEDGERVIEW_CRASH_AT set it dies at that point instead.
"""

from __future__ import annotations

import sys

from compactor import Compactor
from storage import Store


def main() -> int:
    with Store.open(sys.argv[1]) as store:
        for topic in store.list_topics():
            if sys.argv[2] == "sync":
                store.sync_remote(topic)
            elif sys.argv[2] == "compact":
                Compactor(store).compact(topic)
            else:
                store.enforce_retention(topic)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
