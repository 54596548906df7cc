"""What one case's process reports back to the parent (as JSON)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Measurement:
    seconds: list[float]
    """One per timed repetition."""
    messages: int
    """Messages written or read (the same every repetition)."""
    rss_before_bytes: int
    """Resident set size before the case's work: after imports and, for a timed writer, loading its input."""
    peak_rss_bytes: int
    """Peak resident set size of the process (VmHWM), including what the case read from memory maps."""
    peak_anon_bytes: int = 0
    """Largest anonymous resident set (RssAnon: heap and anonymous maps, no file pages) sampled every
    ANON_SAMPLE_SECONDS during the timed repetitions; 0 if not sampled."""
    children_peak_rss_bytes: int = 0
    """Sum of the peak RSS (VmHWM) of the process's descendants still alive at the end (Spark's JVM)."""
    kept: int | None = None
    """Messages in a job's result (compaction workloads)."""
    passes: int | None = None
    """Phase-one passes of ledgerview's compactor."""
    output_bytes: int | None = None
    """Bytes of a job's result on disk (ledgerview: the ledger file)."""
    index_bytes: int | None = None
    """Bytes of ledgerview's key index beside the ledger."""
    digest: str | None = None
    """compaction.view_digest of a job's result."""
    notes: str = ""
    """What the case's process adds to the row's notes."""


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
