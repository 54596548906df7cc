"""One open Store per data folder per Python worker process, shared by the Spark source, scan and sink."""

from __future__ import annotations

import os

from storage import Store

_STORES: dict[str, tuple[int, Store]] = {}


def cached_store(path: str) -> Store:
    """One Store per data folder per Python worker: workers are reused across tasks, and a Store follows other
    processes' appends and compactions by itself (PartitionLog.refresh). A folder removed and created again at
    the same path (a new inode) gets a new Store."""
    try:
        identity = os.stat(path).st_ino
    except FileNotFoundError:
        identity = -1
    cached = _STORES.get(path)
    if cached is not None and cached[0] == identity:
        return cached[1]
    if cached is not None:
        cached[1].close()
    store = Store.open(path)
    _STORES[path] = (os.stat(path).st_ino, store)
    return store
