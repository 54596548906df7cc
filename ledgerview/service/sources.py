"""Ingest sources: where the service's messages come from, behind one small interface.

A source is deterministic given its position: ``read(position)`` returns the same messages every time for the
same position (and config). That is what lets the ingest worker (ledgerview/service/ingest.py) replay after a crash
and append exactly the messages that did not make it. Positions are small JSON-able dicts the worker stores in its
checkpoint.

Built in: the generator (a synthetic keyed changelog at a steady rate) and the directory source (files of text or
JSON lines, read in name order with the produce command's parser). A Spark Structured Streaming query would be a
source of the same shape once the ``ledgerview`` Spark sink is on main.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ledgerview.changelog import key_names
from ledgerview.errors import MalformedInputError
from ledgerview.input_lines import CHUNK_BYTES, LineError, LineFormat, line_number_in, parse_chunk, split_lines
from ledgerview.refusals import line_too_long, max_line_bytes
from ledgerview.service.config import SourceSection
from storage.errors import LedgerviewError

Position = dict[str, Any]


@dataclass(frozen=True)
class SourceBatch:
    messages: pa.Table
    """Columns key, value and optionally timestamp, as Store.append takes them."""
    next_position: Position
    """Where the read after this one starts."""
    more: bool
    """Whether the source has more right now (the worker then reads again without pausing)."""
    origin: Position
    """Where its first message was read (what ``Source.refused`` is given to name a message)."""


class RefusedMessageError(LedgerviewError):
    """A generated message the topic refuses (too large for max.message.bytes)."""

    def __init__(self, source: str, sequence: int, reason: str) -> None:
        super().__init__(f"Source {source!r}: message {sequence}: {reason}. The source stopped before it; change "
                         "the source's or the topic's config and restart the service.")


class SourceFolderMissingError(LedgerviewError):
    """A directory source's folder that is not there (or is not a folder): Spark's file source refuses it too, and
    a source left waiting on a mistyped path would look healthy while reading nothing."""

    def __init__(self, source: str, folder: Path, reason: str) -> None:
        super().__init__(f"Source {source!r}: its path {folder} {reason}. Create the folder or correct the source's "
                         "path in the config, then restart the service.")


class SourceFileChangedError(LedgerviewError):
    """A file the directory source was reading that is now shorter than what it read: it was replaced or cut,
    which breaks the rule that files do not change once they appear, so its new bytes cannot be placed."""

    def __init__(self, source: str, path: Path, size: int, read: int) -> None:
        super().__init__(f"Source {source!r}: {path} is now {size} bytes, but the source had read {read} bytes of "
                         "it: a file must not change once it appears (write it under a hidden name, then rename it). "
                         "The source stopped; to have new lines read, put them in a new file whose name sorts after "
                         "this one and restart the service.")


class Source(Protocol):
    name: str
    topic: str

    def initial_position(self) -> Position: ...

    def read(self, position: Position, max_message_bytes: int | None = None) -> SourceBatch | None:
        """The next messages from ``position``; None when there is nothing new now. ``max_message_bytes``: the
        topic's, which bounds what a source reads for one message (None: no bound)."""

    def refused(self, batch: SourceBatch, row: int, reason: str) -> LedgerviewError:
        """The error naming the ``row``-th message of ``batch`` (from 0), which the topic refuses for ``reason``."""


class GeneratorSource:
    """Message n has key ``key<n mod keys>`` and value ``n=<n>`` padded to value_bytes; every
    ``tombstone_every``-th is a tombstone. ``batch_messages`` per read, until ``limit`` (0: forever)."""

    def __init__(self, section: SourceSection) -> None:
        self.name, self.topic = section.name, section.topic
        self.section = section
        self._keys = key_names(section.keys)

    def initial_position(self) -> Position:
        return {"seq": 0}

    def read(self, position: Position, max_message_bytes: int | None = None) -> SourceBatch | None:
        """``max_message_bytes`` is not needed: a message is value_bytes and a key (the append refuses one too
        large, and ``refused`` names it)."""
        first = int(position["seq"])
        last = first + self.section.batch_messages
        if self.section.limit:
            last = min(last, self.section.limit)
        if last <= first:
            return None
        numbers = np.arange(first, last, dtype=np.int64)
        text = pc.binary_join_element_wise(pa.scalar("n="), pa.array(numbers).cast(pa.string()), pa.scalar(""))
        values = pc.utf8_rpad(text, width=self.section.value_bytes, padding=".").cast(pa.binary())
        if self.section.tombstone_every:
            tombstone = pa.array(numbers % self.section.tombstone_every == self.section.tombstone_every - 1)
            values = pc.if_else(tombstone, pa.scalar(None, pa.binary()), values)
        keys = self._keys.take(pa.array(numbers % self.section.keys))
        return SourceBatch(pa.table({"key": keys, "value": values}), {"seq": last}, more=False,
                           origin={"seq": first})

    def refused(self, batch: SourceBatch, row: int, reason: str) -> LedgerviewError:
        return RefusedMessageError(self.name, int(batch.origin["seq"]) + row, reason)


class DirectorySource:
    """Lines of the regular files in a folder whose names match ``pattern`` and are not hidden (``_hidden``), in
    name order. A file must be complete when it appears (write it under a hidden name, then rename); a file whose
    name sorts before the current one is never read, one removed before it is read is skipped. A malformed line,
    or one the topic refuses (``refused``), stops the source at its chunk, naming the file and line, until the
    file is fixed and the service restarted; so does a missing folder, or the file being read cut shorter than
    what was read of it."""

    def __init__(self, section: SourceSection) -> None:
        self.name, self.topic = section.name, section.topic
        self.folder = Path(section.path)
        self.pattern = section.pattern
        self.line_format = LineFormat(json=section.format == "json", separator=section.separator.encode(),
                                      null_marker=None if section.null_marker is None else section.null_marker.encode())
        self.chunk_bytes = CHUNK_BYTES

    def initial_position(self) -> Position:
        return {"file": "", "offset": 0}

    def read(self, position: Position, max_message_bytes: int | None = None) -> SourceBatch | None:
        """The next chunk of lines; a line longer than ledgerview.refusals.max_line_bytes is refused unread
        (MalformedInputError), since it cannot hold a message the topic takes."""
        current, offset = str(position["file"]), int(position["offset"])
        line_bound = None if max_message_bytes is None else max_line_bytes(max_message_bytes, self.chunk_bytes)
        for name in self._files_from(current):
            path = self.folder / name
            start = offset if name == current else 0
            try:
                size = path.stat().st_size
                if name == current and size < offset:
                    raise SourceFileChangedError(self.name, path, size, offset)
                if start >= size:
                    continue
                chunk, end = self._chunk(path, start, size, line_bound)
            except FileNotFoundError:  # removed since the listing
                continue
            if line_bound is not None and end - start > line_bound:
                assert max_message_bytes is not None
                raise _malformed(path, start, chunk, 1, chunk, line_too_long(line_bound, max_message_bytes)) from None
            try:
                messages = parse_chunk(chunk, self.line_format)
            except LineError as error:
                raise _malformed(path, start, chunk, error.line_index, error.line, error.reason) from None
            return SourceBatch(messages, {"file": name, "offset": end}, more=True,
                               origin={"file": name, "offset": start})
        return None

    def refused(self, batch: SourceBatch, row: int, reason: str) -> LedgerviewError:
        """The MalformedInputError naming the file and line of the refused message, as for a malformed line. The
        batch's chunk is read again from its file (files do not change once they appear): the error path only."""
        path, start = self.folder / str(batch.origin["file"]), int(batch.origin["offset"])
        chunk, _ = self._chunk(path, start, path.stat().st_size, None)
        return _malformed(path, start, chunk, row + 1, split_lines(chunk)[row].as_py(), reason)

    def _files_from(self, current: str) -> list[str]:
        """The names of the files to read from ``current`` on: regular files (or links to one; not folders, FIFOs,
        devices or dangling links, which reading would fail on or block), not hidden, matching the pattern."""
        try:
            with os.scandir(self.folder) as entries:
                return sorted(entry.name for entry in entries if entry.name >= current and not _hidden(entry.name)
                              and fnmatch.fnmatchcase(entry.name, self.pattern) and entry.is_file())
        except FileNotFoundError:
            raise SourceFolderMissingError(self.name, self.folder, "does not exist") from None
        except NotADirectoryError:
            raise SourceFolderMissingError(self.name, self.folder, "is not a folder") from None

    def _chunk(self, path: Path, start: int, size: int, line_bound: int | None) -> tuple[bytes, int]:
        """Whole lines from ``start``, at most chunk_bytes unless one line is longer; the file's last line may
        lack its line end. A first line longer than ``line_bound`` is cut one byte past it (None: never)."""
        with path.open("rb") as file:
            file.seek(start)
            data = file.read(self.chunk_bytes)
            if start + len(data) < size:
                cut = data.rfind(b"\n") + 1
                if cut == 0:
                    data += file.readline(-1 if line_bound is None else line_bound + 1 - len(data))
                    cut = len(data)
                data = data[:cut]
        return data, start + len(data)


def _hidden(name: str) -> bool:
    """Whether Spark's file source leaves a file of this name out (InMemoryFileIndex.shouldFilterOutPathName), as
    the directory source then does on either engine: names starting with ``.`` (editors' and rsync's files being
    written), with ``_`` (``_SUCCESS``, ``_temporary``) unless they hold ``=`` or are Parquet's ``_metadata`` and
    ``_common_metadata``, or ending with ``._COPYING_`` (hdfs dfs -put)."""
    left_out = name.startswith(".") or (name.startswith("_") and "=" not in name) or name.endswith("._COPYING_")
    return left_out and not name.startswith(("_common_metadata", "_metadata"))


def _malformed(path: Path, start: int, chunk: bytes, non_blank_index: int, line: bytes,
               reason: str) -> MalformedInputError:
    """The error for the ``non_blank_index``-th non-blank line (from 1) of the chunk read from byte ``start``."""
    line_number = _lines_before(path, start) + line_number_in(chunk, non_blank_index)
    return MalformedInputError(str(path), line_number, line, reason, consequence=(
        "The source stopped before the chunk holding this line; fix the file and restart the service."))


def _lines_before(path: Path, offset: int) -> int:
    """Lines before byte ``offset`` of the file (on the error path only), counted a chunk at a time."""
    lines = 0
    with path.open("rb") as file:
        while offset > 0 and (block := file.read(min(offset, CHUNK_BYTES))):
            lines += block.count(b"\n")
            offset -= len(block)
    return lines


def open_source(section: SourceSection) -> Source:
    if section.type == "generator":
        return GeneratorSource(section)
    return DirectorySource(section)
