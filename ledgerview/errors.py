"""Errors of the command line and the service, under the package's error root; each message says what was wrong,
what is allowed and what to do."""

from __future__ import annotations

from storage.errors import LedgerviewError


class UsageError(LedgerviewError):
    """A combination of command-line options that does not make sense."""


class MalformedInputError(LedgerviewError):
    """A line given to ``produce`` (or read by a file source) that is not a message in the chosen format."""

    def __init__(self, source: str, line_number: int, line: bytes, reason: str, *, consequence: str) -> None:
        self.source, self.line_number = source, line_number
        shown = line[:80].decode("utf-8", "backslashreplace") + ("..." if len(line) > 80 else "")
        super().__init__(f"{source} line {line_number}: {reason}: {shown!r}. {consequence}")


class ServiceConfigError(LedgerviewError):
    """A service config file that cannot be used; the service did not start."""

    def __init__(self, path: str, where: str, reason: str) -> None:
        self.path, self.where = path, where
        super().__init__(f"Service config {path}: {where}: {reason}. See conf/ledgerview.toml for every key.")


class ServiceRunningError(LedgerviewError):
    """A second service on one data folder would ingest every source twice."""

    def __init__(self, data: str, lock: str) -> None:
        super().__init__(f"Another ledgerview service runs on the data folder {data} (it holds {lock}); stop it "
                         "first, or give this one another data folder.")


class SourceReplayError(LedgerviewError):
    """After a crash, the source no longer gives back what the topic shows it gave."""

    def __init__(self, source: str, position: object, highest_sequence: int) -> None:
        super().__init__(
            f"Source {source!r} cannot replay from {position}: the topic holds its messages up to sequence "
            f"{highest_sequence}, but the source ends before. Its input changed since they were appended (a file "
            "rewritten or removed); restore the input, or remove the source's checkpoint to start it afresh.")


class ListenError(LedgerviewError):
    """The service cannot listen where its config says; it stopped before changing anything."""

    def __init__(self, section: str, host: str, port: int, reason: str) -> None:
        self.section, self.host, self.port = section, host, port
        super().__init__(f"Cannot listen on {host}:{port} ([{section}] host and port): {reason}. Choose another "
                         "port (0 picks a free one) or stop what listens there; the service did not start.")

