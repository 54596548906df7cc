"""The Spark data source's options (streaming/options.py) as Spark hands them over: names without case, unknown
names refused with the valid list, Kafka's startingOffsets / endingOffsets JSON checked, each error saying what
is allowed. The Spark runs of the same options are in tests/spark/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from streaming.options import InvalidOptionError, UnknownOptionError, options_table, resolve_offsets
from streaming.scan import ScanOptions
from streaming.sink import SinkOptions
from streaming.source import SourceOptions

BASE = {"path": "data", "topic": "prices"}


def test_names_are_matched_without_case_as_spark_lowercases_them() -> None:
    parsed = SourceOptions.parse({**BASE, "maxoffsetspertrigger": "400", "VIEW": "compacted"})
    assert parsed.max_offsets == 400 and parsed.compacted


@pytest.mark.parametrize(("parse", "name"), [
    (ScanOptions.parse, "maxOffsetsPerTrigger"),
    (ScanOptions.parse, "startingOffset"),
    (SourceOptions.parse, "endingOffsets"),
    (SourceOptions.parse, "minPartitions"),
])
def test_an_option_the_read_does_not_take_is_refused_with_the_valid_ones(parse: object, name: str) -> None:
    with pytest.raises(UnknownOptionError, match=rf"Unknown option {name.lower()} .*Valid options: path, topic, view"):
        parse({**BASE, name.lower(): "1"})  # type: ignore[operator]


def test_the_old_rate_limit_name_says_what_replaced_it() -> None:
    with pytest.raises(UnknownOptionError, match="maxrecordspertrigger is now maxOffsetsPerTrigger"):
        SourceOptions.parse({**BASE, "maxrecordspertrigger": "5"})


def test_the_sink_takes_only_its_options() -> None:
    from pyspark.sql.types import BinaryType, StructField, StructType
    schema = StructType([StructField("value", BinaryType())])
    with pytest.raises(UnknownOptionError, match=r"Unknown option view .*Valid options: path, topic, "
                                                 "checkpointLocation, queryName"):
        SinkOptions.parse({**BASE, "view": "raw"}, schema, False)


def test_the_sink_checks_the_headers_type_when_the_write_is_planned(tmp_path: Path) -> None:
    """Any array passed here, and a wrong one failed later, inside each task (the store's InvalidMessagesError in
    an executor's traceback), or was taken (binary header keys)."""
    from pyspark.sql.types import ArrayType, BinaryType, StringType, StructField, StructType

    from storage import Store
    from streaming.sink import InvalidSinkError
    with Store.open(tmp_path) as store:
        store.create_topic("prices")

    def schema(headers: ArrayType) -> StructType:
        return StructType([StructField("value", BinaryType()), StructField("headers", headers)])

    def pair(key: object, value: object) -> ArrayType:
        return ArrayType(StructType([StructField("key", key), StructField("value", value)]))  # type: ignore[arg-type]

    options = {"path": str(tmp_path), "topic": "prices"}
    for wrong in (ArrayType(StringType()), pair(BinaryType(), BinaryType()),
                  ArrayType(StructType([StructField("name", StringType()), StructField("value", BinaryType())]))):
        with pytest.raises(InvalidSinkError, match=rf"column 'headers' has type {re.escape(wrong.simpleString())}\. "
                                                   r".*headers \(array<struct<key:string,value:binary or string>>\)"):
            SinkOptions.parse(options, schema(wrong), False)
    for right in (pair(StringType(), BinaryType()), pair(StringType(), StringType())):
        assert SinkOptions.parse(options, schema(right), False).topic == "prices"


def test_the_sink_takes_the_options_spark_passes_on_by_itself(tmp_path: Path) -> None:
    """writeStream.queryName(...) and the checkpoint reach a sink as options (lowercased, as Spark hands them)."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    from storage import Store
    with Store.open(tmp_path) as store:
        store.create_topic("prices")
    schema = StructType([StructField("value", BinaryType())])
    parsed = SinkOptions.parse({"path": str(tmp_path), "topic": "prices", "checkpointlocation": "ck",
                                "queryname": "copy"}, schema, False)
    assert parsed.topic == "prices"


@pytest.mark.parametrize(("options", "message"), [
    ({"view": "latest"}, r"Option view='latest' is not valid .*allowed: compacted or read_compacted or raw"),
    ({"view": "raw", "startingOffsets": '{"0": 5}'}, r"startingOffsets='\{\"0\": 5\}'.*JSON such as \{\"prices\""),
    ({"view": "raw", "startingOffsets": '{"quotes": {"0": 5}}'}, r"JSON naming topic 'prices' only"),
    ({"view": "raw", "startingOffsets": '{"prices": {"0": "x"}}'}, r"startingOffsets=.*allowed: earliest"),
    ({"view": "raw", "endingOffsets": "earliest"}, r"endingOffsets='earliest'.*allowed: latest, or JSON"),
    ({"startingOffsets": "earliest"}, r"no offset bounds with view=compacted"),
    ({"view": "raw", "failOnDataLoss": "yes"}, r"failOnDataLoss='yes'.*allowed: true or false"),
    ({"view": "raw", "maxPartitionBytes": "-1"}, r"maxPartitionBytes='-1'.*a positive number of bytes"),
])
def test_bad_batch_read_options_say_what_is_allowed(options: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidOptionError, match=message):
        ScanOptions.parse({**BASE, **options})


def test_stream_options_parse_kafkas_names() -> None:
    parsed = SourceOptions.parse({**BASE, "startingOffsets": '{"prices": {"0": 5, "1": -2}}',
                                  "minOffsetsPerTrigger": "10", "maxTriggerDelay": "30s", "failOnDataLoss": "false"})
    assert parsed.starting == {0: 5, 1: -2}
    assert (parsed.min_offsets, parsed.max_trigger_delay_ms, parsed.fail_on_data_loss) == (10, 30_000, False)
    with pytest.raises(InvalidOptionError, match=r"maxTriggerDelay='soon'.*a duration such as 15m"):
        SourceOptions.parse({**BASE, "maxTriggerDelay": "soon"})
    with pytest.raises(InvalidOptionError, match=r"view='read_compacted'.*allowed: raw or compacted"):
        SourceOptions.parse({**BASE, "view": "read_compacted"})


def test_a_minimum_per_trigger_above_the_maximum_is_refused_as_kafkas_is() -> None:
    """No micro-batch could hold the minimum: Spark's Kafka source refuses the pair, and so does this one."""
    with pytest.raises(InvalidOptionError, match=r"minOffsetsPerTrigger=11 .*no greater than maxOffsetsPerTrigger "
                                                 r"\(10\)"):
        SourceOptions.parse({**BASE, "maxOffsetsPerTrigger": "10", "minOffsetsPerTrigger": "11"})
    assert SourceOptions.parse({**BASE, "maxOffsetsPerTrigger": "10", "minOffsetsPerTrigger": "10"}).min_offsets == 10


def test_json_offsets_must_name_every_partition_as_kafkas_do() -> None:
    ends, starts = {0: 10, 1: 20, 2: 30}, {0: 0, 1: 0, 2: 5}
    with pytest.raises(InvalidOptionError, match=r"an offset for every partition of prices \(0, 1, 2; missing \[2\]"):
        resolve_offsets("a read", "startingOffsets", {0: 1, 1: -1}, "prices", earliest=starts, latest=ends,
                        allowed_codes=(-2, -1))
    assert resolve_offsets("a read", "startingOffsets", {0: 1, 1: -1, 2: -2}, "prices", earliest=starts,
                           latest=ends, allowed_codes=(-2, -1)) == {0: 1, 1: 20, 2: 5}
    with pytest.raises(InvalidOptionError, match=r"offsets >= 0 or the codes \[-1\]"):
        resolve_offsets("a read", "endingOffsets", {0: -2, 1: 3, 2: 4}, "prices", earliest=starts, latest=ends,
                        allowed_codes=(-1,))


def test_json_offsets_past_a_partition_s_end_are_refused_with_the_caller_s_error() -> None:
    """One check for the stream, the scan and the Kafka source, each raising the error its API has."""
    from storage.errors import OffsetOutOfRangeError

    ends, starts = {0: 10, 1: 20}, {0: 0, 1: 5}
    with pytest.raises(OffsetOutOfRangeError, match=r"Offset 21 is outside prices-1, which holds offsets 5 to 20"):
        resolve_offsets("a read", "startingOffsets", {0: 10, 1: 21}, "prices", earliest=starts, latest=ends,
                        allowed_codes=(-2, -1))
    with pytest.raises(InvalidOptionError, match=r"startingOffsets=11 .*up to 10"):
        resolve_offsets("a read", "startingOffsets", {0: 11, 1: -1}, "prices", earliest=starts, latest=ends,
                        allowed_codes=(-2, -1), past_end=lambda partition, offset: InvalidOptionError(
                            "a read", "startingOffsets", offset, f"up to {ends[partition]}"))
    assert resolve_offsets("a read", "startingOffsets", {0: 10, 1: 3}, "prices", earliest=starts, latest=ends,
                           allowed_codes=(-2, -1)) == {0: 10, 1: 3}


def test_the_docs_list_every_option_as_it_is_defined() -> None:
    docs = (Path(__file__).resolve().parent.parent / "docs" / "SPARK.md").read_text()
    assert options_table() in docs
