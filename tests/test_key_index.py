"""The key index (storage/key_index.py) answers every key of every run with its offset and nothing else: keys of
any length, runs whose keys interleave (phase one's passes split keys by hash), groups of GROUP_KEYS keys whose
bounds a lookup must respect."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rocksdict import Options, Rdict

from storage.key_index import GROUP_KEYS, CorruptKeyIndexError, KeyIndex, KeyIndexWriter

keys_and_runs = st.lists(st.binary(max_size=6), unique=True, max_size=400).flatmap(
    lambda keys: st.tuples(st.just(keys), st.lists(st.integers(0, 3), min_size=len(keys), max_size=len(keys))))
"""Unique keys (the empty key and zero bytes among them) and the run each one goes to."""


def write_index(folder: Path, runs: list[list[bytes]], offset_of: dict[bytes, int]) -> KeyIndex:
    writer = KeyIndexWriter(folder)
    for run in runs:
        keys = sorted(run)
        writer.add_sorted_run(pa.array(keys, pa.binary()), np.array([offset_of[key] for key in keys], np.int64))
    writer.finish()
    return KeyIndex(folder)


@settings(max_examples=60, deadline=None)
@given(keys_and_runs, st.lists(st.binary(max_size=7), max_size=50))
def test_every_key_of_every_run_is_found_and_no_other(tmp_path_factory: pytest.TempPathFactory,
                                                      drawn: tuple[list[bytes], list[int]],
                                                      probes: list[bytes]) -> None:
    keys, run_of = drawn
    offset_of = {key: 3 * row + 1 for row, key in enumerate(keys)}
    runs = [[key for key, run in zip(keys, run_of, strict=True) if run == number] for number in range(4)]
    index = write_index(tmp_path_factory.mktemp("index") / "keys", runs, offset_of)
    try:
        for key in keys:
            assert index.locate(key) == offset_of[key]
        for probe in probes:
            assert index.locate(probe) == offset_of.get(probe)
        assert sorted(index.keys()) == sorted(keys)
    finally:
        index.close()


def test_lookups_at_group_bounds(tmp_path: Path) -> None:
    """The first and last key of each group, and absent keys just before, between and after groups."""
    keys = [b"k%05d" % (2 * i) for i in range(3 * GROUP_KEYS + 5)]
    index = write_index(tmp_path / "keys", [keys], {key: row for row, key in enumerate(keys)})
    try:
        for row in [0, GROUP_KEYS - 1, GROUP_KEYS, 2 * GROUP_KEYS, len(keys) - 1]:
            assert index.locate(keys[row]) == row
            assert index.locate(b"k%05d" % (2 * row + 1)) is None  # between this key and the next
        assert index.locate(b"k") is None and index.locate(b"a") is None and index.locate(b"z") is None
    finally:
        index.close()


def test_a_damaged_group_is_reported_not_misread(tmp_path: Path) -> None:
    keys = [b"a", b"b", b"c"]
    write_index(tmp_path / "keys", [keys], {b"a": 1, b"b": 2, b"c": 3}).close()
    raw = Rdict(str(tmp_path / "keys"), Options(raw_mode=True))
    try:
        [(entry, group)] = list(raw.items())
        raw[entry] = group[:-3]  # the last offset cut short
    finally:
        raw.close()
    index = KeyIndex(tmp_path / "keys")
    try:
        with pytest.raises(CorruptKeyIndexError,
                           match=r"a group of 44 bytes is not what its 3 keys take \(looking up key b'b'\)"):
            index.locate(b"b")
    finally:
        index.close()
