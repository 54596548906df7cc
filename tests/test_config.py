"""Topic config: Kafka's names and defaults, strict parsing with helpful errors, and the cross-key rules.

Invariant 10 of DESIGN.md: unknown or invalid config keys get a clear error naming what is allowed.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from storage import Store
from storage.config import (
    CONFIG_KEYS,
    ConfigError,
    InvalidConfigError,
    RawValue,
    TopicConfig,
    UnknownConfigError,
    render_defaults_properties,
)
from storage.errors import LedgerviewError

DEFAULTS = TopicConfig.from_overrides({})
ALL_KEYS = ", ".join(key.name for key in CONFIG_KEYS)


def test_defaults_are_kafkas_documented_defaults() -> None:
    properties = DEFAULTS.as_properties()
    assert properties["cleanup.policy"] == "delete"
    assert properties["retention.ms"] == "604800000"
    assert properties["segment.bytes"] == "1073741824"
    assert properties["delete.retention.ms"] == "86400000"
    assert properties["max.message.bytes"] == "1048588"
    assert properties["max.compaction.lag.ms"] == str(2**63 - 1)  # Long.MAX_VALUE
    assert properties["min.cleanable.dirty.ratio"] == "0.5"


def test_every_key_has_exactly_one_attribute_and_every_property() -> None:
    assert [field.name for field in dataclasses.fields(TopicConfig)] == [key.attribute for key in CONFIG_KEYS]
    assert list(DEFAULTS.as_properties()) == [key.name for key in CONFIG_KEYS]
    assert DEFAULTS.to_overrides() == {}


@pytest.mark.parametrize(("key", "raw", "attribute", "expected"), [
    ("segment.bytes", "2048", "segment_bytes", 2048),
    ("segment.bytes", " 2048 ", "segment_bytes", 2048),
    ("segment.bytes", 2048, "segment_bytes", 2048),
    ("retention.ms", "-1", "retention_ms", -1),
    ("min.cleanable.dirty.ratio", "0.25", "min_cleanable_dirty_ratio", 0.25),
    ("min.cleanable.dirty.ratio", 1, "min_cleanable_dirty_ratio", 1.0),
    ("compaction.retain.null.key", "TRUE", "compaction_retain_null_key", True),
    ("compaction.retain.null.key", False, "compaction_retain_null_key", False),
    ("message.timestamp.type", "LogAppendTime", "message_timestamp_type", "LogAppendTime"),
    ("cleanup.policy", "delete, compact", "cleanup_policy", frozenset({"compact", "delete"})),
    ("compaction.memory.bytes", 1024, "compaction_memory_bytes", 1024),
])
def test_string_and_native_values_parse(key: str, raw: RawValue, attribute: str, expected: object) -> None:
    assert getattr(TopicConfig.from_overrides({key: raw}), attribute) == expected


@pytest.mark.parametrize(("key", "raw", "allowed"), [
    ("segment.ms", "0", "an integer from 1 to 9223372036854775807"),
    ("segment.ms", "1.5", "an integer from 1 to 9223372036854775807"),
    ("segment.ms", 1.0, "an integer from 1 to 9223372036854775807"),
    ("segment.bytes", "13", "an integer from 14 to 2147483647"),
    ("segment.bytes", True, "an integer from 14 to 2147483647"),
    ("index.interval.bytes", 2**31, "an integer from 0 to 2147483647"),
    ("retention.ms", "-2", "an integer from -1 to 9223372036854775807"),
    ("max.compaction.lag.ms", 2**63, "an integer from 1 to 9223372036854775807"),
    ("compaction.memory.bytes", "1023", "an integer from 1024 to 9223372036854775807"),
    ("min.cleanable.dirty.ratio", "1.5", "a number from 0.0 to 1.0"),
    ("min.cleanable.dirty.ratio", "nan", "a number from 0.0 to 1.0"),
    ("min.cleanable.dirty.ratio", "half", "a number from 0.0 to 1.0"),
    ("compaction.retain.null.key", "yes", "true or false"),
    ("compaction.retain.null.key", 1, "true or false"),
    ("message.timestamp.type", "createtime", "one of: CreateTime, LogAppendTime"),
    ("cleanup.policy", "", "a comma-separated list of distinct values from: compact, delete"),
    ("cleanup.policy", "compact,compact", "a comma-separated list of distinct values from: compact, delete"),
    ("cleanup.policy", "delete,archive", "a comma-separated list of distinct values from: compact, delete"),
])
def test_a_bad_value_is_refused_naming_key_value_and_allowed(key: str, raw: RawValue, allowed: str) -> None:
    message = f"Invalid value {str(raw)!r} for topic config {key!r}: expected {allowed}."
    with pytest.raises(InvalidConfigError, match=re.escape(message)) as caught:
        TopicConfig.from_overrides({key: raw})
    assert (caught.value.key, caught.value.allowed) == (key, allowed)


@pytest.mark.parametrize("codec", ["gzip", "snappy"])
def test_kafka_codecs_we_do_not_support_are_refused_with_the_supported_ones(codec: str) -> None:
    allowed = "'compression.type': expected one of: producer, uncompressed, lz4, zstd."
    with pytest.raises(InvalidConfigError, match=re.escape(allowed)):
        TopicConfig.from_overrides({"compression.type": codec})


@pytest.mark.parametrize(("typo", "suggestion"), [
    ("segment.byte", "segment.bytes"),
    ("Retention.MS", "retention.ms"),
    ("compaction.retain.nullkey", "compaction.retain.null.key"),
])
def test_an_unknown_key_is_refused_with_the_closest_and_every_valid_key(typo: str, suggestion: str) -> None:
    message = f"Unknown topic config {typo!r}. Did you mean {suggestion!r}? Valid keys: {ALL_KEYS}."
    with pytest.raises(UnknownConfigError, match=re.escape(message)):
        TopicConfig.from_overrides({typo: "1"})


def test_an_unknown_key_with_nothing_close_lists_the_valid_keys_only() -> None:
    message = f"Unknown topic config 'zzz'. Valid keys: {ALL_KEYS}."
    with pytest.raises(UnknownConfigError, match=re.escape(message)):
        TopicConfig.from_overrides({"zzz": "1"})


def test_a_key_that_is_not_a_string_is_an_unknown_key() -> None:
    with pytest.raises(UnknownConfigError, match=re.escape(f"Unknown topic config 3. Valid keys: {ALL_KEYS}.")):
        TopicConfig.from_overrides({3: "1"})  # type: ignore[dict-item]


def test_config_errors_share_the_ledgerview_root() -> None:
    assert issubclass(ConfigError, LedgerviewError)
    assert issubclass(UnknownConfigError, ConfigError)
    assert issubclass(InvalidConfigError, ConfigError)


@pytest.mark.parametrize(("policy", "is_compact", "is_delete"), [
    ("delete", False, True),
    ("compact", True, False),
    ("compact,delete", True, True),
    ("delete,compact", True, True),
])
def test_cleanup_policy_combinations(policy: str, is_compact: bool, is_delete: bool) -> None:
    config = TopicConfig.from_overrides({"cleanup.policy": policy})
    assert (config.is_compact, config.is_delete) == (is_compact, is_delete)


def test_min_compaction_lag_above_max_is_refused_and_equal_is_allowed() -> None:
    message = ("Invalid value '5000' for topic config 'min.compaction.lag.ms': expected at most "
               "max.compaction.lag.ms (1000).")
    with pytest.raises(InvalidConfigError, match=re.escape(message)):
        TopicConfig.from_overrides({"min.compaction.lag.ms": 5000, "max.compaction.lag.ms": "1000"})
    equal = TopicConfig.from_overrides({"min.compaction.lag.ms": 1000, "max.compaction.lag.ms": 1000})
    assert equal.min_compaction_lag_ms == equal.max_compaction_lag_ms == 1000


@pytest.mark.parametrize(("policy", "segment_roll_ms"), [
    ("compact", 1000),
    ("compact,delete", 1000),
    ("delete", 5000),
])
def test_a_compacted_topic_rolls_by_max_compaction_lag_too(policy: str, segment_roll_ms: int) -> None:
    lags = {"segment.ms": 5000, "max.compaction.lag.ms": 1000}
    config = TopicConfig.from_overrides({"cleanup.policy": policy, **lags})
    assert config.segment_roll_ms == segment_roll_ms
    assert TopicConfig.from_overrides({"cleanup.policy": policy, "segment.ms": 500}).segment_roll_ms == 500


def test_to_overrides_keeps_only_non_defaults_canonically_and_round_trips() -> None:
    config = TopicConfig.from_overrides({
        "cleanup.policy": " delete , compact",
        "compaction.retain.null.key": True,
        "min.cleanable.dirty.ratio": 1,
        "segment.bytes": " 2048",
        "retention.ms": "604800000",
        "compression.type": "zstd",
    })
    overrides = config.to_overrides()
    assert overrides == {
        "cleanup.policy": "compact,delete",
        "compaction.retain.null.key": "true",
        "compression.type": "zstd",
        "min.cleanable.dirty.ratio": "1.0",
        "segment.bytes": "2048",
    }
    assert TopicConfig.from_overrides(overrides) == config


def test_with_overrides_returns_a_new_validated_config_on_top_of_the_old_overrides() -> None:
    config = TopicConfig.from_overrides({"segment.bytes": "2048"})
    altered = config.with_overrides({"retention.ms": "1000"})
    assert altered.to_overrides() == {"segment.bytes": "2048", "retention.ms": "1000"}
    assert config.retention_ms == 604800000
    with pytest.raises(InvalidConfigError, match=re.escape("value '1' for topic config 'segment.bytes'")):
        config.with_overrides({"segment.bytes": "1"})


def test_a_config_built_directly_is_checked_too() -> None:
    with pytest.raises(InvalidConfigError, match=re.escape("value '0' for topic config 'segment.ms'")):
        dataclasses.replace(DEFAULTS, segment_ms=0)
    with pytest.raises(InvalidConfigError, match=re.escape("value '' for topic config 'cleanup.policy'")):
        dataclasses.replace(DEFAULTS, cleanup_policy=frozenset())


def test_the_defaults_file_is_generated_from_the_keys() -> None:
    path = Path(__file__).resolve().parents[1] / "conf" / "topic-defaults.properties"
    assert path.read_text(encoding="utf-8") == render_defaults_properties(), (
        "conf/topic-defaults.properties is stale; regenerate it with: python -c \"from storage.config import "
        "render_defaults_properties as r; print(r(), end='')\" > conf/topic-defaults.properties")


def test_a_store_without_a_remote_tier_refuses_to_tier_a_topic(tmp_path: Path) -> None:
    """As Kafka refuses remote.storage.enable while the broker's tiered storage is off: nothing would upload."""
    with Store.open(tmp_path / "data") as store:
        with pytest.raises(InvalidConfigError, match="This store has no remote tier"):
            store.create_topic("tiered", config={"remote.storage.enable": "true"})
        assert store.list_topics() == []
        store.create_topic("t", config={"remote.storage.enable": "false"})
        with pytest.raises(InvalidConfigError, match="This store has no remote tier"):
            store.alter_topic_config("t", set={"remote.storage.enable": True})
        assert not store.topic_metadata("t").config.remote_storage_enable
