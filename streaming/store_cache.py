"""One open Store per data folder (or RemoteStore per remote tier) per Python worker process: a writing one for the
sink, a read-only one for the scan and the source (a read never takes a writer lock, creates a file or recovers)."""

from __future__ import annotations

import os

from storage import Store
from storage.readable import ReadableStore
from storage.remote_store import RemoteStore, is_remote_location

_STORES: dict[tuple[str, bool], tuple[int, Store]] = {}
_REMOTE_STORES: dict[str, RemoteStore] = {}


def cached_readable_store(location: str) -> ReadableStore:
    """The store to read at ``location``: a data folder's (``cached_store``), or a remote tier read alone
    (``s3://bucket/prefix``: no data folder on this machine)."""
    if not is_remote_location(location):
        return cached_store(location, read_only=True)
    return cached_remote_store(location)


def cached_remote_store(uri: str) -> RemoteStore:
    """One RemoteStore per remote tier per Python worker: what reads of the tier alone use, and the object handle
    its writers (the Spark sink with an object-store path, distributed compaction) upload and publish through."""
    store = _REMOTE_STORES.get(uri)
    if store is None:
        store = _REMOTE_STORES[uri] = RemoteStore.open(uri)
    return store


def cached_store(path: str, *, read_only: bool = False) -> Store:
    """One Store per data folder per Python worker: workers are reused across tasks, and a Store follows other
    processes' appends and compactions by itself (PartitionLog.refresh). A folder removed and created again at
    the same path (a new inode) gets a new Store."""
    try:
        identity = os.stat(path).st_ino
    except FileNotFoundError:
        identity = -1
    cached = _STORES.get((path, read_only))
    if cached is not None and cached[0] == identity:
        return cached[1]
    if cached is not None:
        cached[1].close()
    store = Store.open(path, read_only=read_only)
    _STORES[(path, read_only)] = (os.stat(path).st_ino, store)
    return store
