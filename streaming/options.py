"""Every option of the Spark data sources, defined once: its name as Spark's Kafka source spells it where Kafka has
the concept, what it means, and the checks on its value. The error texts and docs/SPARK.md's tables come from here.

Spark hands a Python data source its options in a case-insensitive dict (keys lowercased), as it treats every
data source option; names are matched without case and reported in their canonical spelling. An option that a
read or write does not take is an error listing the ones it does, as a misspelt ``maxOffsetsPerTriger`` silently
ignored would read a whole topic in one batch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from storage.errors import LedgerviewError, OffsetOutOfRangeError
from streaming.source_offsets import EARLIEST, LATEST


@dataclass(frozen=True)
class OptionSpec:
    name: str
    """Canonical spelling (Spark's Kafka source's where it has the option)."""
    allowed: str
    """The values allowed, as the error text and the docs say them."""
    doc: str


SPECS = {spec.name: spec for spec in (
    OptionSpec("path", "a store's data folder, or a remote tier's URI (s3://bucket/prefix)",
               "The store: `.load(path)` or `.option('path', ...)`."),
    OptionSpec("topic", "an existing topic", "The topic to read or write."),
    OptionSpec("view", "compacted, read_compacted or raw (batch); compacted or raw (stream)",
               "Which view: see 'Three views' above."),
    OptionSpec("startingOffsets", 'earliest, latest (streams only), or JSON such as {"prices": {"0": 42, "1": -2}}',
               "Where a read starts: per partition, -2 is earliest and -1 latest; JSON must name every "
               "partition. Batch default earliest; stream default latest (used only when the query first starts; "
               "then its checkpoint decides)."),
    OptionSpec("endingOffsets", 'latest, or JSON such as {"prices": {"0": 420, "1": -1}}',
               "Batch reads of `raw` and `read_compacted`: where the read ends (exclusive), -1 latest."),
    OptionSpec("failOnDataLoss", "true or false",
               "Default true: offsets a read needs that retention deleted fail the query (DataLossError "
               "names the range); false skips to the log start."),
    OptionSpec("maxOffsetsPerTrigger", "a positive integer",
               "Stream: at most this many offsets per micro-batch over all partitions, shared in proportion to "
               "what each has waiting (also under `trigger(availableNow=True)`)."),
    OptionSpec("minOffsetsPerTrigger", "a positive integer, at most maxOffsetsPerTrigger",
               "Stream: wait for at least this many new offsets before a micro-batch, or for maxTriggerDelay "
               "(not under `trigger(availableNow=True)`, which takes what there is)."),
    OptionSpec("maxTriggerDelay", "a duration such as 15m, 30s or 500ms",
               "Stream, with minOffsetsPerTrigger: the longest a micro-batch waits (default 15m)."),
    OptionSpec("maxPartitionBytes", "a positive number of bytes",
               "Batch reads and raw streams: about what a task reads (default 128 MiB); a large partition (or a "
               "micro-batch's share of it) is split into offset ranges along its segments, so a task may read up "
               "to about twice this, and a read_compacted partition or a table's tail is one task whatever its "
               "size."),
    OptionSpec("minPartitions", "a positive integer",
               "Batch reads: split partitions into at least this many tasks (default: the planner's cores); "
               "tasks read at least 4 MiB each unless maxPartitionBytes is smaller."),
    OptionSpec("checkpointLocation", "a folder", "Sink: Spark's query checkpoint (Spark's own option)."),
    OptionSpec("queryName", "a name", "Sink: what `writeStream.queryName(...)` sets (Spark passes it on)."),
    OptionSpec("kafka.bootstrap.servers", "host:port[,host:port...]",
               "`ledgerview-kafka`: the cluster to read (`bootstrap.servers` is taken too)."),
    OptionSpec("bootstrap.servers", "host:port[,host:port...]", "`ledgerview-kafka`: kafka.bootstrap.servers."),
    OptionSpec("subscribe", "one topic or several, comma-separated", "`ledgerview-kafka`: the topics to read."),
)}

BATCH_READ = ("path", "topic", "view", "startingOffsets", "endingOffsets", "failOnDataLoss", "maxPartitionBytes",
              "minPartitions")
STREAM_READ = ("path", "topic", "view", "startingOffsets", "maxOffsetsPerTrigger", "minOffsetsPerTrigger",
               "maxTriggerDelay", "failOnDataLoss", "maxPartitionBytes")
WRITE = ("path", "topic", "checkpointLocation", "queryName")
KAFKA_READ = ("kafka.bootstrap.servers", "bootstrap.servers", "subscribe", "startingOffsets", "maxOffsetsPerTrigger",
              "failOnDataLoss")
RENAMED = {"maxrecordspertrigger": "maxOffsetsPerTrigger"}
"""Names this source once took, with the Kafka name that replaced them (the error says which)."""


class InvalidOptionError(LedgerviewError):
    def __init__(self, where: str, option: str, value: object, allowed: str) -> None:
        self.option = option
        super().__init__(f"Option {option}={value!r} is not valid for {where}; allowed: {allowed}.")


class UnknownOptionError(LedgerviewError):
    def __init__(self, where: str, unknown: Iterable[str], valid: Iterable[str]) -> None:
        names = ", ".join(sorted(unknown))
        renamed = [f"{name} is now {RENAMED[name]}" for name in sorted(unknown) if name in RENAMED]
        hint = f" ({'; '.join(renamed)}, as Spark's Kafka source names it)" if renamed else ""
        super().__init__(f"Unknown option {names} for {where}{hint}. Valid options: {', '.join(valid)}.")


class Options:
    """The options of one read or write, checked by name on construction; ``where`` names it in errors."""

    def __init__(self, options: Mapping[str, str], valid: tuple[str, ...], where: str) -> None:
        canonical = {name.lower(): name for name in valid}
        unknown = [name for name in options if name.lower() not in canonical]
        if unknown:
            raise UnknownOptionError(where, unknown, valid)
        self.values = {canonical[name.lower()]: str(value) for name, value in options.items()}
        self.where = where

    def get(self, name: str, default: str | None = None) -> str | None:
        return self.values.get(name, default)

    def invalid(self, name: str, value: object) -> InvalidOptionError:
        return InvalidOptionError(self.where, name, value, SPECS[name].allowed)

    def required(self, name: str) -> str:
        value = self.values.get(name)
        if not value:
            raise self.invalid(name, value)
        return value

    def choice(self, name: str, choices: tuple[str, ...], default: str) -> str:
        value = self.values.get(name, default)
        if value not in choices:
            raise InvalidOptionError(self.where, name, value, " or ".join(choices))
        return value

    def flag(self, name: str, default: bool) -> bool:
        value = self.values.get(name, str(default).lower()).lower()
        if value not in ("true", "false"):
            raise self.invalid(name, value)
        return value == "true"

    def positive(self, name: str) -> int | None:
        value = self.values.get(name)
        if value is None:
            return None
        if not value.isdigit() or int(value) < 1:
            raise self.invalid(name, value)
        return int(value)

    def duration_ms(self, name: str, default: str) -> int:
        value = self.values.get(name, default)
        matched = re.fullmatch(r"\s*(\d+)\s*(ms|s|m|h|d)\s*", value.lower())
        if matched is None:
            raise self.invalid(name, value)
        return int(matched.group(1)) * {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000,
                                        "d": 86_400_000}[matched.group(2)]

    def offsets(self, name: str, default: str, *, words: tuple[str, ...]) -> str | dict[str, dict[int, int]]:
        """One of ``words`` ("earliest", "latest"), or Kafka's JSON ``{topic: {partition: offset}}``, parsed."""
        value = self.values.get(name, default)
        if value in words:
            return value
        try:
            parsed = json.loads(value)
            if not isinstance(parsed, dict) or not parsed:
                raise ValueError
            return {str(topic): {int(p): _offset(o) for p, o in parts.items()} for topic, parts in parsed.items()}
        except (ValueError, AttributeError, TypeError):
            raise InvalidOptionError(self.where, name, value, SPECS[name].allowed) from None


def _offset(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < EARLIEST:
        raise ValueError(value)
    return value


def resolve_offsets(where: str, option: str, chosen: Mapping[int, int], topic: str, *,
                    earliest: Mapping[int, int], latest: Mapping[int, int], allowed_codes: tuple[int, ...],
                    past_end: Callable[[int, int], LedgerviewError] | None = None) -> dict[int, int]:
    """Kafka's JSON offsets of one topic resolved against its partitions' earliest and latest offsets.

    As Spark's Kafka source requires, the JSON names every partition (-2 earliest, -1 latest where
    ``allowed_codes`` has them). An explicit offset past its partition's end (beyond its next offset)
    raises ``past_end(partition, offset)``, the error of the caller's API: by default OffsetOutOfRangeError, as
    the ledgerview source and scan refuse it. One below the log start is returned as given (reading it is data
    loss, which the caller checks)."""
    partitions = set(latest)
    if set(chosen) != partitions:
        raise InvalidOptionError(
            where, option, {str(p): o for p, o in sorted(chosen.items())},
            f"an offset for every partition of {topic} ({', '.join(map(str, sorted(partitions)))}; missing "
            f"{sorted(partitions - set(chosen))}, unknown {sorted(set(chosen) - partitions)}); use -2 for "
            "earliest and -1 for latest")
    resolved = {}
    for partition, offset in chosen.items():
        if offset < 0 and offset not in allowed_codes:
            raise InvalidOptionError(where, option, offset, f"offsets >= 0 or the codes {list(allowed_codes)}")
        resolved[partition] = (earliest[partition] if offset == EARLIEST else latest[partition]
                               if offset == LATEST else offset)
    beyond = [(partition, offset) for partition, offset in sorted(resolved.items()) if offset > latest[partition]]
    if beyond:
        partition, offset = beyond[0]
        raise (past_end(partition, offset) if past_end is not None else
               OffsetOutOfRangeError(topic, partition, offset, earliest[partition], latest[partition]))
    return resolved


def topic_offsets(where: str, option: str, parsed: Mapping[str, Mapping[int, int]], topic: str) -> dict[int, int]:
    """The JSON's entry for ``topic``; a JSON about other topics is an error."""
    others = sorted(set(parsed) - {topic})
    if others or topic not in parsed:
        raise InvalidOptionError(where, option, dict(parsed),
                                 f'JSON naming topic {topic!r} only, e.g. {{"{topic}": {{"0": 42, "1": -2}}}}')
    return dict(parsed[topic])


def options_table() -> str:
    """The Markdown table of every option, for docs/SPARK.md (a test keeps the two the same)."""
    uses = {"batch read": BATCH_READ, "stream read": STREAM_READ, "write": WRITE}
    lines = ["| option | taken by | allowed | meaning |", "|---|---|---|---|"]
    for name in dict.fromkeys((*BATCH_READ, *STREAM_READ, *WRITE)):
        spec = SPECS[name]
        taken = ", ".join(use for use, names in uses.items() if name in names)
        lines.append(f"| `{name}` | {taken} | {spec.allowed} | {spec.doc} |")
    return "\n".join(lines) + "\n"

