"""Every error a user can meet derives from storage.errors.LedgerviewError, so ``except LedgerviewError`` catches
all of them and the CLI prints each as a message, never a traceback. The exceptions that do not are internal:
each is caught where it is raised and turned into a LedgerviewError, a Kafka error code or a control-flow step.
A new exception class outside the root must be added below with the place that converts it, or it fails here."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("storage", "readers", "compactor", "streaming", "ledgerview")
INTERNAL = {
    "BatchFormatError": "storage: turned into CorruptSegmentError / CorruptLedgerError with the file and position",
    "KeysRefused": "compactor/latest_offsets.py: the key coding is widened and phase one starts again",
    "LineError": "ledgerview/commands/produce.py and service/sources.py: reported with the line's number",
    "LineTooLongError": "ledgerview/commands/produce.py: a MalformedInputError with the line's number",
    "_Close": "ledgerview/kafka/server.py: closes one connection",
    "RecordBatchError": "ledgerview/kafka: a produce's error code for its partition",
    "BatchTooLargeError": "ledgerview/kafka: MESSAGE_TOO_LARGE",
    "CorruptBatchError": "ledgerview/kafka: CORRUPT_MESSAGE",
    "InvalidRecordsError": "ledgerview/kafka: INVALID_RECORD",
    "RecordListTooLargeError": "ledgerview/kafka: RECORD_LIST_TOO_LARGE",
    "UnsupportedBatchError": "ledgerview/kafka: UNSUPPORTED_FOR_MESSAGE_FORMAT",
    "DecompressedTooLargeError": "ledgerview/kafka/records.py: RecordListTooLargeError",
    "UnsupportedCompressionError": "ledgerview/kafka: UNSUPPORTED_COMPRESSION_TYPE",
    "MalformedRequestError": "ledgerview/kafka: the connection is closed, as Kafka closes it",
    "VarintError": "ledgerview/kafka/records.py: CorruptBatchError",
}


def exception_classes() -> dict[str, list[str]]:
    """Every class of the packages whose name or a base's name says it is an error: its bases' names."""
    found: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    bases = [ast.unparse(base).split(".")[-1] for base in node.bases]
                    if node.name.endswith(("Error", "Refused")) or any(b.endswith(("Error", "Exception"))
                                                                        for b in bases):
                        found[node.name] = bases
    return found


def test_every_error_a_user_meets_derives_from_the_one_root() -> None:
    classes = exception_classes()

    def rooted(name: str) -> bool:
        return name == "LedgerviewError" or any(rooted(base) for base in classes.get(name, []))

    outside = {name for name in classes if not rooted(name)}
    assert outside == set(INTERNAL), (f"outside the root and not listed as internal: {sorted(outside - set(INTERNAL))};"
                                      f" listed but gone or rooted now: {sorted(set(INTERNAL) - outside)}")
