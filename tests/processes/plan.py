"""What the helper processes append, so a test can tell exactly which messages each append call wrote.

Imported by the scripts beside it (run as files, so this folder is on their ``sys.path``) and by the tests as
``tests.processes.plan``. Only the standard library: the sizes come from ``random.Random(seed)``, the same in
every process.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

APPENDER_MOST = 50
"""Largest append call of appender.py."""


def append_sizes(seed: int, most: int) -> Iterator[int]:
    """Endless sizes, 1 to ``most``, of the successive append calls of a helper started with ``seed``."""
    rng = random.Random(seed)
    while True:
        yield rng.randint(1, most)


def call_ends_through(seed: int, most: int, through: int) -> list[int]:
    """End offsets (exclusive) of the successive append calls, up to the first at or past ``through``."""
    ends: list[int] = []
    for end in itertools.accumulate(append_sizes(seed, most)):
        ends.append(end)
        if end >= through:
            break
    return ends


def first_call_ends(seed: int, most: int, calls: int) -> list[int]:
    """End offsets (exclusive) of the first ``calls`` append calls."""
    return list(itertools.islice(itertools.accumulate(append_sizes(seed, most)), calls))


def number_value(number: int) -> bytes:
    """appender.py's value for message ``number``."""
    return str(number).encode()


def writer_value(writer: str, sequence: int) -> bytes:
    """writer.py's value for the ``sequence``-th message of ``writer``."""
    return f"{writer}:{sequence}".encode()


def parse_writer_value(value: bytes) -> tuple[str, int]:
    writer, _, sequence = value.decode().partition(":")
    return writer, int(sequence)
