"""Topic configuration: every key defined once, parsed and validated in one place.

Users know Kafka's topic configs, so names, types and defaults are Kafka's (``LogConfig``), plus Pulsar's
two-phase compaction keys in the same dotted style. Each key is one ``ConfigKey`` row in ``CONFIG_KEYS``:
parsing, error text, the ``TopicConfig`` attribute and ``conf/topic-defaults.properties`` all come from that
row, so a key cannot be documented one way and enforced another. Values arrive as strings (command line, JSON
metadata) or native Python values and are checked before anything is stored: a typo or an out-of-range value
is refused with what is allowed, never ignored. Rules involving two keys live in
``TopicConfig.__post_init__``, so no ``TopicConfig`` can break them.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from storage.errors import LedgerviewError

Kind = Literal["boolean", "double", "int", "list", "long", "string"]
"""Kafka ``ConfigDef`` types: ``int`` is 32-bit (it bounds file positions), ``long`` 64-bit."""
Value = bool | int | float | str | frozenset[str]
RawValue = str | int | float | bool

_INT_MAX = 2**31 - 1
_LONG_MAX = 2**63 - 1
_INTEGER = re.compile(r"[+-]?[0-9]+")


class ConfigError(LedgerviewError):
    """A topic config that ledgerview refuses; nothing was stored."""


class UnknownConfigError(ConfigError):
    def __init__(self, key: object) -> None:
        self.key = key
        names = [config_key.name for config_key in CONFIG_KEYS]
        close = difflib.get_close_matches(key.lower(), names, n=1) if isinstance(key, str) else []
        hint = f" Did you mean {close[0]!r}?" if close else ""
        super().__init__(f"Unknown topic config {key!r}.{hint} Valid keys: {', '.join(names)}.")


class InvalidConfigError(ConfigError):
    def __init__(self, key: str, value: object, allowed: str, reason: str = "") -> None:
        self.key, self.value, self.allowed, self.reason = key, value, allowed, reason
        super().__init__(f"Invalid value {str(value)!r} for topic config {key!r}: expected {allowed}."
                         + (f" {reason}" if reason else ""))


@dataclass(frozen=True)
class ConfigKey:
    """One topic config key: the single definition its parsing, error text and documentation come from."""

    name: str
    """Dotted Kafka-style name, as in a properties file or on a command line."""
    kind: Kind
    """How a value is parsed; ``list`` is a comma-separated set of ``choices``."""
    default: Value
    """The value when a topic does not override the key (Kafka's where the key is Kafka's)."""
    doc: str
    """One line for users: what the key controls and what its special values mean."""
    minimum: int | float = 0
    """Smallest accepted number, for numeric kinds."""
    maximum: int | float | None = None
    """Largest accepted number, for numeric kinds; None means the largest value of the kind."""
    choices: tuple[str, ...] = ()
    """Accepted values, for ``string`` and ``list`` kinds."""
    refused: tuple[tuple[str, str], ...] = ()
    """Values Kafka accepts for this key that ledgerview refuses, each with why and what to use instead."""

    @property
    def attribute(self) -> str:
        """The ``TopicConfig`` attribute holding this key's value."""
        return self.name.replace(".", "_")

    @property
    def allowed(self) -> str:
        """What a valid value looks like, in words, for error messages and documentation."""
        if self.kind == "boolean":
            return "true or false"
        if self.kind == "string":
            return f"one of: {', '.join(self.choices)}"
        if self.kind == "list":
            return f"a comma-separated list of distinct values from: {', '.join(self.choices)}"
        number = "a number" if self.kind == "double" else "an integer"
        return f"{number} from {self.minimum} to {self._maximum}"

    @property
    def _maximum(self) -> int | float:
        return self.maximum if self.maximum is not None else _INT_MAX if self.kind == "int" else _LONG_MAX

    def parse(self, raw: RawValue) -> Value:
        """A string or native value converted to this key's type and checked, so errors show the input."""
        text = raw.strip() if isinstance(raw, str) else None
        value: Value | None = None
        if self.kind == "boolean":
            value = raw if isinstance(raw, bool) else {"true": True, "false": False}.get((text or "").lower())
        elif isinstance(raw, bool):
            value = None  # bool is an int in Python; only boolean keys take it
        elif self.kind in ("int", "long"):
            value = raw if isinstance(raw, int) else int(text) if text and _INTEGER.fullmatch(text) else None
        elif self.kind == "double":
            value = _float_or_none(raw)
        elif text is not None and self.kind == "list":
            parts = [part.strip() for part in text.split(",")]
            value = frozenset(parts) if len(set(parts)) == len(parts) else None
        elif text is not None:
            value = text
        if value is None or not self.accepts(value):
            reason = dict(self.refused).get(text.lower(), "") if text is not None else ""
            raise InvalidConfigError(self.name, raw, self.allowed, reason)
        return value

    def accepts(self, value: Value) -> bool:
        """Whether a value of this key's type is in range or among the choices."""
        if self.kind == "boolean":
            return isinstance(value, bool)
        if self.kind == "string":
            return isinstance(value, str) and value in self.choices
        if self.kind == "list":
            return isinstance(value, frozenset) and bool(value) and value <= set(self.choices)
        return isinstance(value, int | float) and not isinstance(value, bool) and (
            self.minimum <= value <= self._maximum)

    def format(self, value: Value) -> str:
        """The canonical text of a value, which ``parse`` reads back to the same value."""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, frozenset):
            return ",".join(sorted(value))
        return str(value)


def _float_or_none(raw: str | int | float) -> float | None:
    try:
        return float(raw)
    except (ValueError, OverflowError):
        return None


CONFIG_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey("cleanup.policy", "list", frozenset({"delete"}),
              "delete drops segments past retention; compact keeps the latest value per key; or both.",
              choices=("compact", "delete")),
    ConfigKey("compaction.key.index", "boolean", True,
              "Whether two-phase compaction writes a key index beside each compacted ledger, for point lookups "
              "(TableView.get, Spark SQL's key = filters). Without it a run takes less time; a TableView then reads "
              "all the ledger's keys once, and Spark's key filters read the ledger's rows. Views on a remote tier "
              "(remote.storage.enable, and compaction as Spark work) always get one."),
    ConfigKey("compaction.max.layers", "int", 4,
              "Ledgers a two-phase compacted view may read: while under half the rows of its ledgers are replaced, "
              "a run writes only what changed, over them, up to this many; 1 = every run rewrites the view whole "
              "(as Pulsar does). Topics with remote.storage.enable are always rewritten whole.",
              minimum=1, maximum=64),
    ConfigKey("compaction.memory.bytes", "long", 268435456,
              "Memory budget of the two-phase compactor's key map before it spills to disk.", minimum=1024),
    ConfigKey("compaction.retain.null.key", "boolean", False,
              "Whether two-phase compaction keeps messages without a key (Pulsar drops them by default)."),
    ConfigKey("compaction.threshold.bytes", "long", 0,
              "Uncompacted backlog in bytes that triggers two-phase compaction; 0 = only when asked."),
    ConfigKey("compression.type", "string", "producer",
              "Codec of stored batches (Arrow IPC buffer compression): producer keeps each append's own "
              "(Store.append's compression, a Kafka producer's lz4 or zstd; uncompressed when it names none or "
              "gzip or snappy). lz4 and zstd batches also store keys and values that repeat as a dictionary. "
              "Kafka's gzip and snappy are refused: Arrow IPC has no such codec.",
              choices=("producer", "uncompressed", "lz4", "zstd"), refused=tuple(
                  (codec, f"Kafka's {codec} has no Arrow IPC buffer codec, so ledgerview cannot store it; zstd "
                          f"compresses better than gzip and lz4 is faster than snappy.")
                  for codec in ("gzip", "snappy"))),
    ConfigKey("delete.retention.ms", "long", 86400000,
              "How long tombstones survive compaction, so readers can see that a key was deleted."),
    ConfigKey("file.delete.delay.ms", "long", 60000,
              "Wait before the files of a deleted segment are removed, so open readers can finish."),
    ConfigKey("flush.messages", "long", _LONG_MAX,
              "Fsync the active segment once this many messages are unflushed.", minimum=1),
    ConfigKey("flush.ms", "long", _LONG_MAX, "Fsync the active segment once this long after the last fsync."),
    ConfigKey("index.interval.bytes", "int", 4096, "Bytes appended between two entries of the sparse index."),
    ConfigKey("local.retention.bytes", "long", -2,
              "With remote.storage.enable, local size above which uploaded segments leave the local folder; "
              "-2 = retention.bytes.", minimum=-2),
    ConfigKey("local.retention.ms", "long", -2,
              "With remote.storage.enable, age after which uploaded segments leave the local folder; "
              "-2 = retention.ms.", minimum=-2),
    ConfigKey("max.compaction.lag.ms", "long", _LONG_MAX,
              "Longest a message may stay uncompacted; also caps segment.ms of compacted topics.", minimum=1),
    ConfigKey("max.message.bytes", "int", 1048588, "Largest message an append accepts, in bytes."),
    ConfigKey("message.timestamp.type", "string", "CreateTime",
              "CreateTime keeps the message's own timestamp; LogAppendTime stamps the append time.",
              choices=("CreateTime", "LogAppendTime")),
    ConfigKey("min.cleanable.dirty.ratio", "double", 0.5,
              "Share of a compacted log not yet cleaned above which the cleaner picks it.",
              minimum=0.0, maximum=1.0),
    ConfigKey("min.compaction.lag.ms", "long", 0, "Shortest time a message stays uncompacted."),
    ConfigKey("remote.storage.enable", "boolean", False,
              "Upload sealed segments to the store's remote tier and read them from there once gone locally."),
    ConfigKey("remote.unpublished.delete.delay.ms", "long", 86400000,
              "On a topic that lives on the remote tier alone, how long an object no manifest has named (an "
              "upload whose publish is still to come, or never will: its writer died) stays before a sweep deletes "
              "it. A Spark sink's batch and a Spark compaction run publish only within half of it, and are refused "
              "after: keep it above twice the longest batch or run."),
    ConfigKey("retention.bytes", "long", -1,
              "Partition size above which the oldest segments are deleted; -1 = no limit.", minimum=-1),
    ConfigKey("retention.ms", "long", 604800000, "Age after which a segment is deleted; -1 = no limit.",
              minimum=-1),
    ConfigKey("segment.bytes", "int", 1073741824, "Size at which the active segment rolls.", minimum=14),
    ConfigKey("segment.ms", "long", 604800000, "Age at which the active segment rolls even if not full.",
              minimum=1),
)
"""Every topic config key, sorted by name; ``TopicConfig`` has one attribute per key, in the same order."""

_KEYS_BY_NAME = {key.name: key for key in CONFIG_KEYS}


@dataclass(frozen=True, kw_only=True)
class TopicConfig:
    """A topic's complete, validated configuration; each attribute's doc is its key's ``doc`` in CONFIG_KEYS.

    Build one with ``from_overrides``; construction checks every key and the cross-key rules.
    """

    cleanup_policy: frozenset[str]
    compaction_key_index: bool
    compaction_max_layers: int
    compaction_memory_bytes: int
    compaction_retain_null_key: bool
    compaction_threshold_bytes: int
    compression_type: str
    delete_retention_ms: int
    file_delete_delay_ms: int
    flush_messages: int
    flush_ms: int
    index_interval_bytes: int
    local_retention_bytes: int
    local_retention_ms: int
    max_compaction_lag_ms: int
    max_message_bytes: int
    message_timestamp_type: str
    min_cleanable_dirty_ratio: float
    min_compaction_lag_ms: int
    remote_storage_enable: bool
    remote_unpublished_delete_delay_ms: int
    retention_bytes: int
    retention_ms: int
    segment_bytes: int
    segment_ms: int

    def __post_init__(self) -> None:
        for key in CONFIG_KEYS:
            value = getattr(self, key.attribute)
            if not key.accepts(value):
                raise InvalidConfigError(key.name, key.format(value), key.allowed)
        if self.min_compaction_lag_ms > self.max_compaction_lag_ms:
            raise InvalidConfigError("min.compaction.lag.ms", self.min_compaction_lag_ms,
                                     f"at most max.compaction.lag.ms ({self.max_compaction_lag_ms})")
        for local, whole in (("local.retention.ms", "retention.ms"), ("local.retention.bytes", "retention.bytes")):
            local_value, whole_value = getattr(self, local.replace(".", "_")), getattr(self, whole.replace(".", "_"))
            if whole_value >= 0 and (local_value == -1 or local_value > whole_value):
                raise InvalidConfigError(local, local_value, f"-2 or at most {whole} ({whole_value}), as in Kafka")
        if self.remote_storage_enable and self.is_compact:
            raise InvalidConfigError(
                "remote.storage.enable", "true",
                "false while cleanup.policy includes compact: in-place cleaning rewrites local segments and stays "
                "local-only, as in Kafka, which refuses compacted topics in tiered storage. Use cleanup.policy=delete "
                "with two-phase compaction (compaction.threshold.bytes, or `ledgerview compact`), which reads both "
                "tiers")

    @classmethod
    def from_overrides(cls, overrides: Mapping[str, RawValue]) -> TopicConfig:
        """The defaults with ``overrides`` applied; raises UnknownConfigError or InvalidConfigError."""
        values: dict[str, Any] = {key.attribute: key.default for key in CONFIG_KEYS}
        for name, raw in overrides.items():
            key = _KEYS_BY_NAME.get(name) if isinstance(name, str) else None
            if key is None:
                raise UnknownConfigError(name)
            values[key.attribute] = key.parse(raw)
        return cls(**values)

    def with_overrides(self, overrides: Mapping[str, RawValue]) -> TopicConfig:
        """A new config: this one's overrides with ``overrides`` applied on top, validated as a whole."""
        return TopicConfig.from_overrides({**self.to_overrides(), **overrides})

    def to_overrides(self) -> dict[str, str]:
        """The keys that differ from their default, as canonical strings ``from_overrides`` reads back."""
        return {key.name: key.format(getattr(self, key.attribute))
                for key in CONFIG_KEYS if getattr(self, key.attribute) != key.default}

    def as_properties(self) -> dict[str, str]:
        """Every key with its value as a canonical string."""
        return {key.name: key.format(getattr(self, key.attribute)) for key in CONFIG_KEYS}

    @property
    def is_compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def is_delete(self) -> bool:
        return "delete" in self.cleanup_policy

    @property
    def effective_local_retention_ms(self) -> int:
        """local.retention.ms with -2 resolved to retention.ms."""
        return self.retention_ms if self.local_retention_ms == -2 else self.local_retention_ms

    @property
    def effective_local_retention_bytes(self) -> int:
        """local.retention.bytes with -2 resolved to retention.bytes."""
        return self.retention_bytes if self.local_retention_bytes == -2 else self.local_retention_bytes

    @property
    def segment_roll_ms(self) -> int:
        """Age at which the active segment rolls: a compacted topic also rolls by max.compaction.lag.ms, as in
        Kafka, so that no message waits in the uncleanable active segment longer than that lag."""
        return min(self.segment_ms, self.max_compaction_lag_ms) if self.is_compact else self.segment_ms


def render_defaults_properties() -> str:
    """The text of ``conf/topic-defaults.properties``: every key, its doc, what it allows and its default."""
    lines = [
        "# Topic config defaults of ledgerview, generated by render_defaults_properties() in",
        "# storage/config.py: edit the keys there, not here. Override them per topic; unknown keys and",
        "# invalid values are refused.",
    ]
    for key in sorted(CONFIG_KEYS, key=lambda config_key: config_key.name):
        lines += ["", f"# {key.doc} Expects {key.allowed}.", f"{key.name}={key.format(key.default)}"]
    return "\n".join(lines) + "\n"
