"""One cleaning pass over a topic: clean.py DATA_DIR TOPIC NOW_MS (fault tests set LEDGERVIEW_CRASH_AT)."""

from __future__ import annotations

import sys

from storage import Store

if __name__ == "__main__":
    with Store.open(sys.argv[1], clock=lambda: int(sys.argv[3])) as store:
        print(len(store.clean(sys.argv[2])))
