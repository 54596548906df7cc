"""Benchmark datasets: changelogs from ``ledgerview.changelog.generate``, cached as Arrow IPC files.

A dataset is fully described by its ``ChangelogSpec``; the cache file's name carries a digest of the spec and of
the generator's source, so a changed spec or generator never reuses stale bytes. Files live in bench/data/
(git-ignored) and are written to a temporary name first, then renamed, so an interrupted run leaves no half file.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import inspect
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from ledgerview import changelog
from ledgerview.changelog import ChangelogSpec

DATA_DIR = Path(__file__).resolve().parent / "data"
CHUNK_ROWS = 1_000_000
"""Rows per record batch in the cache file; a multiple of every slice size the workloads use, so their slices
never straddle two chunks."""
PAYLOAD_BYTES_KEY = b"ledgerview.bench.payload_bytes"
SPEC_KEY = b"ledgerview.bench.spec"


def describe(spec: ChangelogSpec) -> str:
    """One line for humans, as in RESULTS.md headings."""
    text = (f"{spec.messages:,} messages, {spec.keys:,} keys, {spec.distribution}"
            f"{f' (exponent {spec.zipf_exponent:g})' if spec.distribution.startswith('zipf') else ''}, "
            f"{spec.value_bytes}-byte values, {spec.tombstone_share:.1%} tombstones, seed {spec.seed}")
    return text


def cache_path(spec: ChangelogSpec) -> Path:
    identity = json.dumps(dataclasses.asdict(spec), sort_keys=True) + inspect.getsource(changelog)
    digest = hashlib.sha256(identity.encode()).hexdigest()[:12]
    name = (f"changelog-{spec.messages}m-{spec.keys}k-{spec.distribution}-{spec.value_bytes}b-"
            f"{spec.tombstone_share:g}t-{digest}.arrow")
    return DATA_DIR / name


def ensure_dataset(spec: ChangelogSpec) -> Path:
    """The cache file of ``spec``, generated first if missing."""
    path = cache_path(spec)
    if path.exists():
        return path
    table = changelog.generate(spec)
    payload = sum(int(pc.sum(pc.binary_length(table[name])).as_py() or 0) for name in ("key", "value"))
    metadata = {SPEC_KEY: json.dumps(dataclasses.asdict(spec)).encode(), PAYLOAD_BYTES_KEY: str(payload).encode()}
    table = table.replace_schema_metadata(metadata)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with pa.OSFile(str(temporary), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=CHUNK_ROWS)
    os.replace(temporary, path)
    return path


def payload_bytes(path: Path) -> int:
    """Key plus value bytes of the dataset (what MB/s is measured in), from the file's metadata."""
    with pa.memory_map(str(path)) as source:
        metadata = pa.ipc.open_file(source).schema.metadata or {}
    return int(metadata[PAYLOAD_BYTES_KEY])


def load(path: Path) -> pa.Table:
    """The dataset read into process memory (not memory-mapped), without the cache's schema metadata."""
    with pa.OSFile(str(path)) as source:
        table = pa.ipc.open_file(source).read_all()
    return table.replace_schema_metadata(None)


def read_spec(path: Path) -> ChangelogSpec:
    """The spec the dataset was generated from, from the file's metadata."""
    with pa.memory_map(str(path)) as source:
        metadata = pa.ipc.open_file(source).schema.metadata or {}
    return ChangelogSpec(**json.loads(metadata[SPEC_KEY]))


def add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    """``--messages``, ``--keys``, ``--distribution`` and ``--tombstones`` of one dataset (``spec_of`` reads them)."""
    parser.add_argument("--messages", type=int, default=10_000_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--distribution", choices=["uniform", "zipf", "zipf-scattered"], default="uniform")
    parser.add_argument("--tombstones", type=float, default=0.01)


def spec_of(args: argparse.Namespace) -> ChangelogSpec:
    """The dataset ``add_spec_arguments``' options name."""
    return ChangelogSpec(messages=args.messages, keys=args.keys, distribution=args.distribution,
                         tombstone_share=args.tombstones)
