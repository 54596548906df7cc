"""The engine's key fingerprint (storage/fingerprint.py): equal keys agree whichever way they are given, distinct
keys of the kinds that trip simple hashes differ, and the hash is keyed per process, so that a client cannot
compute a key with someone else's key's fingerprint and have the cleaner remove that key's latest message."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import storage.fingerprint
from storage import Store
from storage.fingerprint import fingerprint_rows, fingerprints, wide_fingerprints

KEYS = [b"", b"a", b"a\x00", b"a\x00\x00\x00\x00", b"user-123", b"user-124", b"\x00" * 8, b"x" * 9, b"k" * 70]


def test_equal_keys_agree_however_they_are_given_and_distinct_keys_differ() -> None:
    mixed = fingerprints(pa.array(KEYS, pa.binary()))
    assert len(set(mixed.tolist())) == len(KEYS)  # trailing zero bytes and the empty key included
    one_by_one = [int(fingerprints(pa.array([key], pa.binary()))[0]) for key in KEYS]
    assert mixed.tolist() == one_by_one
    sliced = pa.array([b"zz", *KEYS], pa.binary()).slice(1)
    assert fingerprints(sliced).tolist() == mixed.tolist()
    fixed = np.frombuffer(b"".join(key.ljust(8, b"-")[:8] for key in KEYS), np.uint8).reshape(len(KEYS), 8)
    as_array = pa.array([bytes(row) for row in fixed], pa.binary())
    assert fingerprint_rows(fixed).tolist() == fingerprints(as_array).tolist()


@pytest.mark.slow  # two more Python processes
def test_each_process_has_its_own_hash() -> None:
    here = fingerprints(pa.array(KEYS, pa.binary())).tolist()
    script = ("import pyarrow as pa; from storage.fingerprint import fingerprints; "
              f"print(fingerprints(pa.array({KEYS!r}, pa.binary())).tolist())")
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                           cwd=Path(__file__).parent.parent).stdout for _ in range(2)]
    there = [json.loads(run) for run in runs]
    assert here != there[0] and there[0] != there[1]
    assert all(not set(here) & set(other) for other in there)


def _collision_under_the_former_fixed_hash(victim: bytes) -> bytes:
    """A 16-byte key that the fingerprint of releases before this one (a fixed multiply-rotate hash, its constants
    public) gave the fingerprint of ``victim``: every step of that hash could be inverted."""
    mask, seed, multiply, word_multiply = 2**64 - 1, 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB

    def mixed(word: int) -> int:
        product = word * word_multiply & mask
        return (product << 31 | product >> 33) & mask

    def state(key: bytes, words: int) -> int:
        value = (len(key) + seed) * multiply & mask
        for j in range(words):
            value = (value ^ mixed(int.from_bytes(key[8 * j : 8 * j + 8].ljust(8, b"\0"), "little"))) * multiply & mask
        return value

    prefix = b"attacker"
    before_last = state(prefix.ljust(16, b"\0"), 1)  # the chosen key's state after its first word
    wanted = state(victim, -(-len(victim) // 8)) * pow(multiply, -1, 2**64) & mask
    rotated = before_last ^ wanted
    last = ((rotated >> 31 | rotated << 33) & mask) * pow(word_multiply, -1, 2**64) & mask
    return prefix + last.to_bytes(8, "little")


def test_a_key_chosen_to_collide_does_not_make_the_cleaner_remove_another_key(data_dir: Path) -> None:
    chosen = _collision_under_the_former_fixed_hash(b"user-123")
    with Store.open(data_dir) as store:
        store.create_topic("accounts", config={"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"})
        store.append("accounts", [(b"user-123", b"balance=100")])
        store.roll("accounts", 0)
        store.append("accounts", [(chosen, b"anything")])
        store.roll("accounts", 0)
        store.append("accounts", [(b"other", b"active segment")])
        [stats] = store.clean("accounts")
        assert stats.messages_read == 2
        kept = store.read("accounts", 0).select(["key", "value"]).to_pylist()
    assert kept == [{"key": b"user-123", "value": b"balance=100"}, {"key": chosen, "value": b"anything"},
                    {"key": b"other", "value": b"active segment"}]


def test_long_keys_are_told_apart_by_any_byte_and_by_their_length() -> None:
    """Keys longer than a block are hashed as a tree of blocks."""
    base = bytes(range(256)) * 4 + b"tail"
    variants = [base, base[:-1], base + b"\x00", base[:200], base[:200] + b"\x00" * 56, b"\x00" * len(base),
                *(base[:at] + bytes([base[at] ^ 1]) + base[at + 1 :] for at in (0, 127, 128, 700, len(base) - 1))]
    hashes = fingerprints(pa.array(variants, pa.binary())).tolist()
    assert len(set(hashes)) == len(variants)
    assert hashes[0] == int(fingerprints(pa.array([base], pa.binary()))[0])


@pytest.mark.parametrize(("dirty", "kept"), [
    ([(b"user-1", b"a2")], [(b"user-2", b"b"), (b"user-1", b"a2")]),
    ([(b"user-3", b"c"), (b"user-1", b"a2")], [(b"user-1", b"a"), (b"user-2", b"b"), (b"user-3", b"c"),
                                                (b"user-1", b"a2")]),
], ids=["one dirty key", "two dirty keys sharing the high half"])
def test_the_cleaner_takes_keys_for_one_only_when_all_128_bits_of_their_fingerprints_match(
        data_dir: Path, monkeypatch: pytest.MonkeyPatch, dirty: list[tuple[bytes, bytes]],
        kept: list[tuple[bytes, bytes]]) -> None:
    """With 64-bit fingerprints, a key of the log colliding with a key of the map (1 pair in 2**64, so a few times
    a year over large logs) lost its latest message. Here the high lanes' multipliers are zero, a member of the
    hash family under which every key's high 64 bits collide."""
    degenerate = storage.fingerprint._MULTIPLIERS.copy()
    degenerate[:2] = 0
    monkeypatch.setattr(storage.fingerprint, "_MULTIPLIERS", degenerate)
    wide = wide_fingerprints(pa.array([b"user-1", b"user-2", b"user-3"], pa.binary()))
    assert len(set(wide[:, 0].tolist())) == 1 and len(set(wide[:, 1].tolist())) == 3
    with Store.open(data_dir) as store:
        store.create_topic("accounts", config={"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"})
        store.append("accounts", [(b"user-1", b"a"), (b"user-2", b"b")])
        store.roll("accounts", 0)
        [first] = store.clean("accounts")  # two keys sharing the high half in one pass: both kept
        assert first.messages_written == 2
        store.append("accounts", dirty)
        store.roll("accounts", 0)
        [stats] = store.clean("accounts")  # user-1 and user-2 are its clean section
        assert stats.messages_read == 2 + len(dirty)
        rows = store.read("accounts", 0).select(["key", "value"]).to_pylist()
    assert [(row["key"], row["value"]) for row in rows] == kept
