"""Compact every partition of a topic: compact.py DATA_DIR TOPIC (fault tests set LEDGERVIEW_CRASH_AT)."""

from __future__ import annotations

import sys

from compactor import Compactor
from storage import Store

if __name__ == "__main__":
    with Store.open(sys.argv[1]) as store:
        Compactor(store).compact(sys.argv[2])
