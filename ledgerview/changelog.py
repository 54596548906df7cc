"""Deterministic synthetic changelogs, built columnar: the demo's price ticks and the benchmark datasets.

A changelog here is N messages over K distinct keys, keys drawn uniformly or by a Zipf law (hot keys clustered
at the low key ids, or scattered over them), fixed-size values,
and a share of tombstones (null values). The same seed gives the same bytes on every machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True)
class ChangelogSpec:
    messages: int
    keys: int
    value_bytes: int = 100
    distribution: str = "uniform"
    """"uniform", "zipf" (exponent ``zipf_exponent``, key 0 the hottest) or "zipf-scattered" (the same law, each
    rank mapped to a random key id, so the hot keys are spread over the key space and its sort order)."""
    tombstone_share: float = 0.0
    zipf_exponent: float = 1.1
    seed: int = 7
    start_timestamp_ms: int = 1_700_000_000_000


def key_names(count: int, prefix: str = "key") -> pa.Array:
    """Fixed-width key names ``key0000001``...; width grows with the count so they sort as numbers do."""
    width = max(6, len(str(count - 1)))
    return pa.array([f"{prefix}{i:0{width}d}".encode() for i in range(count)], pa.binary())


def key_indices(spec: ChangelogSpec, rng: np.random.Generator) -> np.ndarray:
    if spec.distribution == "uniform":
        return rng.integers(0, spec.keys, spec.messages, dtype=np.int64)
    if spec.distribution in ("zipf", "zipf-scattered"):
        ranks = np.arange(1, spec.keys + 1, dtype=np.float64)
        weights = ranks ** -spec.zipf_exponent
        cumulative = np.cumsum(weights / weights.sum())
        indices = np.minimum(np.searchsorted(cumulative, rng.random(spec.messages)), spec.keys - 1)
        return rng.permutation(spec.keys)[indices] if spec.distribution == "zipf-scattered" else indices
    raise ValueError(f"distribution {spec.distribution!r}; allowed: uniform, zipf, zipf-scattered")


VALUE_CHUNK_BYTES = 1 << 30
"""Values are made in arrays of at most this many bytes: a binary array's 32-bit offsets stop at 2 GiB."""


def random_values(count: int, value_bytes: int, rng: np.random.Generator,
                  null_mask: np.ndarray | None) -> pa.ChunkedArray:
    rows = max(1, VALUE_CHUNK_BYTES // max(1, value_bytes))
    return pa.chunked_array([
        _random_value_array(min(rows, count - start), value_bytes, rng,
                            None if null_mask is None else null_mask[start : start + rows])
        for start in range(0, count, rows)
    ], pa.binary())


def _random_value_array(count: int, value_bytes: int, rng: np.random.Generator,
                        null_mask: np.ndarray | None) -> pa.Array:
    data = rng.integers(0, 256, count * value_bytes, dtype=np.uint8)
    offsets = np.arange(0, (count + 1) * value_bytes, value_bytes, dtype=np.int32)
    validity = None
    if null_mask is not None and null_mask.any():
        validity = pa.array(~null_mask).buffers()[1]
    return pa.Array.from_buffers(
        pa.binary(), count, [validity, pa.py_buffer(offsets), pa.py_buffer(data)],
        null_count=int(null_mask.sum()) if null_mask is not None else 0,
    )


def generate(spec: ChangelogSpec) -> pa.Table:
    """Columns key, value, timestamp (one millisecond apart)."""
    rng = np.random.default_rng(spec.seed)
    indices = key_indices(spec, rng)
    keys = key_names(spec.keys).take(pa.array(indices))
    tombstones = rng.random(spec.messages) < spec.tombstone_share if spec.tombstone_share else None
    values = random_values(spec.messages, spec.value_bytes, rng, tombstones)
    timestamps = pa.array(spec.start_timestamp_ms + np.arange(spec.messages, dtype=np.int64))
    return pa.table({"key": keys, "value": values, "timestamp": timestamps})


def price_ticks(symbols: int, ticks: int, *, delisted_share: float = 0.05, seed: int = 11,
                start_timestamp_ms: int = 1_700_000_000_000) -> pa.Table:
    """Price ticks for ``symbols`` symbols (``SYM0001``...), a random walk each; the last tick of
    ``delisted_share`` of the symbols is a tombstone that delists it. Values are UTF-8 decimal prices."""
    rng = np.random.default_rng(seed)
    symbol = rng.integers(0, symbols, ticks)
    prices = 100 + np.round(rng.normal(0, 1, ticks).cumsum() % 50, 2)
    delisted_symbols = rng.choice(symbols, size=int(symbols * delisted_share), replace=False)
    _, last_from_end = np.unique(symbol[::-1], return_index=True)
    last_tick = ticks - 1 - last_from_end  # indexed by the symbols that ticked, in sorted order
    ticked = np.unique(symbol)
    delisted = np.zeros(ticks, dtype=bool)
    delisted[last_tick[np.isin(ticked, delisted_symbols)]] = True
    text = pc.cast(pa.array(prices), pa.string()).cast(pa.binary())
    values = pc.if_else(pa.array(delisted), pa.scalar(None, pa.binary()), text)
    names = pa.array([f"SYM{i:04d}".encode() for i in range(symbols)], pa.binary())
    return pa.table({
        "key": names.take(pa.array(symbol)),
        "value": values,
        "timestamp": pa.array(start_timestamp_ms + np.arange(ticks, dtype=np.int64) * 10),
    })
