"""The one format of ledgerview's small persisted records (the remote log's manifests, the remote compaction
cursor, ...): a JSON document that names its kind and version and carries a CRC-32C of its body, so a damaged,
truncated or foreign record is an error that names where it was read, never a silently wrong value.

A record is ``{"record": KIND, "version": N, "crc32c": C, "body": {...}}`` where ``C`` is the CRC-32C of the body
serialised canonically (sorted keys, no spaces). See docs/FORMAT.md, "Records". Records written before this
format (``{"version": 1, ...fields}`` or the bare fields, without a checksum) are still read, as version 1, where
a kind says so; every write uses this format.
"""

from __future__ import annotations

import json
from typing import Any

import crc32c

from storage.errors import CorruptDataError


class CorruptRecordError(CorruptDataError):
    """A record that fails its checks: it cannot be trusted, so nothing was read from it."""

    def __init__(self, source: str, kind: str, reason: str) -> None:
        self.source, self.kind, self.reason = source, kind, reason
        super().__init__(f"The {kind} record {source} is damaged or not a ledgerview {kind} record: {reason}.")


def is_count(value: object) -> bool:
    """Whether a field read from a record is a count or an offset: an integer (JSON's true is not one) >= 0."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def encode_record(kind: str, version: int, body: dict[str, Any]) -> bytes:
    """The bytes of a record of ``kind`` at format ``version``."""
    envelope = {"record": kind, "version": version, "crc32c": crc32c.crc32c(_canonical(body)), "body": body}
    return json.dumps(envelope, sort_keys=True, indent=1, allow_nan=False).encode() + b"\n"


def decode_record(source: object, data: bytes, kind: str, *, max_version: int, legacy: bool = False) -> (
    tuple[int, dict[str, Any]]
):
    """``(version, body)`` of a record of ``kind`` read from ``source`` (a path or URI, for the error), whose
    version this code reads (1 to ``max_version``); raises CorruptRecordError otherwise. ``legacy``: also read the
    unchecksummed ``{"version": 1, ...fields}`` (or bare) records of earlier releases, as version 1."""
    source = str(source)
    try:
        envelope = json.loads(data)
    except (UnicodeDecodeError, ValueError) as error:
        raise CorruptRecordError(source, kind, f"it is not JSON ({error})") from None
    if legacy and isinstance(envelope, dict) and "record" not in envelope and envelope.get("version", 1) == 1:
        return 1, {name: value for name, value in envelope.items() if name != "version"}
    if not isinstance(envelope, dict) or set(envelope) != {"record", "version", "crc32c", "body"}:
        raise CorruptRecordError(source, kind, "it lacks the fields record, version, crc32c and body")
    if envelope["record"] != kind:
        raise CorruptRecordError(source, kind, f"it is a {envelope['record']!r} record")
    version, body = envelope["version"], envelope["body"]
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CorruptRecordError(source, kind, f"its version {version!r} is not an integer >= 1")
    if version > max_version:
        raise CorruptRecordError(source, kind, f"it has format version {version}, and this ledgerview reads "
                                                f"versions up to {max_version}: upgrade ledgerview to read it")
    if not isinstance(body, dict):
        raise CorruptRecordError(source, kind, "its body is not an object")
    if envelope["crc32c"] != crc32c.crc32c(_canonical(body)):
        raise CorruptRecordError(source, kind, "its CRC-32C does not match its body")
    return version, body
