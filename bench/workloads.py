"""The workload registry: each workload is a list of cases, one per system, run side by side.

A case times one of three things:

- its writer (``reader`` and ``job`` are None): a fresh target for every repetition;
- its reader, over what its writer (or its ``preparer``) left: that runs untimed in a separate process first, and
  one untimed read warms the page cache;
- its job (bench/compaction.py): the ``preparer`` leaves the input on disk untimed in a separate process, with a
  small copy of the first messages that the job runs on once, untimed, to warm imports and first calls.

The first case of a workload is the baseline its ratios are computed against.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

from bench import cleaning, compaction, kafka, remote, spark_jobs, systems

DEFAULT_MESSAGES = 10_000_000
"""The dataset's size when neither --messages nor the workload says otherwise."""
MEMORY_BUDGET_BYTES = 64 * compaction.MiB
BUDGET_CONFIG = {"compaction.memory.bytes": MEMORY_BUDGET_BYTES}
BUDGET = f"{MEMORY_BUDGET_BYTES // compaction.MiB} MiB"
LARGE_BUDGET_CONFIG = {"compaction.memory.bytes": 1 << 30}
NO_KEY_INDEX_CONFIG = {"compaction.key.index": False}
KAFKA_PRODUCER_BATCH_MESSAGES = 100
"""About what a Kafka producer's batch holds of the datasets' messages at its default batch.size (16 KiB)."""
SMALL_BATCHES_STORE = compaction.ledgerview_store(append_messages=KAFKA_PRODUCER_BATCH_MESSAGES)
"""The dataset in a store appended KAFKA_PRODUCER_BATCH_MESSAGES at a time, as a Kafka producer leaves a topic."""
SYSTEM_ALLOCATOR = (("ARROW_DEFAULT_MEMORY_POOL", "system"),)
CODECS = ("lz4", "zstd")
"""The compression.type values the append and read workloads measure beside the default (producer: uncompressed)."""
SEALED = remote.sealed_store()
"""The remote workloads' input: the dataset in sealed segments of remote.SEGMENT_BYTES."""
SEALED_COMPACTED = remote.sealed_store(compacted_head=True)
"""The same with its first 90% compacted before the rest is appended (a ledger, then a raw tail)."""


@dataclass(frozen=True)
class Case:
    system: str
    writer: systems.Writer | None = None
    reader: systems.Reader | None = None
    note: str = ""
    preparer: compaction.Preparer | None = None
    job: compaction.Job | None = None
    env: tuple[tuple[str, str], ...] = ()
    """Environment variables of the case's processes."""

    @property
    def timed(self) -> str:
        return "job" if self.job is not None else "write" if self.reader is None else "read"

    @property
    def prepared(self) -> bool:
        """Whether an untimed prepare step runs first, in its own process."""
        return self.reader is not None or self.job is not None


@dataclass(frozen=True)
class Goal:
    """One row's time against the sum of other rows' times, reported in a row of its own (when every named row
    ran): e.g. issue 16's remote compaction <= 1.2 x (local compaction + a plain read of the same remote bytes)."""

    system: str
    parts: tuple[str, ...]
    factor: float | None = None
    """The most the ratio may be; None: the ratio is only reported."""


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    cases: tuple[Case, ...]
    whole_dataset: bool = True
    """Every case handles exactly the dataset's messages (checked)."""
    same_result: bool = False
    """Every case keeps the same number of messages (checked: a warning row when not)."""
    time_vs_first: bool = False
    """Notes give each row's time as a multiple of the first row's."""
    goals: tuple[Goal, ...] = ()
    """Rows of notes only, each a row's time against the sum of others' (see Goal)."""
    default_messages: int = DEFAULT_MESSAGES
    """The dataset's size when --messages is not given (a run groups its workloads by it)."""


def _ledgerview(system: str, note: str, *, config: Mapping[str, object] | None = None, compact: bool = False,
                new_messages: bool = False, env: tuple[tuple[str, str], ...] = (),
                append_messages: int = systems.APPEND_ROWS) -> Case:
    """A ledgerview compaction case over a store prepared with ``compaction.ledgerview_store``."""
    preparer = compaction.ledgerview_store(config, compact=compact, new_messages=new_messages,
                                           append_messages=append_messages)
    return Case(system, note=note, preparer=preparer, job=compaction.ledgerview_compact, env=env)


COMPACT_CASES = (
    _ledgerview("ledgerview", "Store.open, Compactor(store).compact(topic), default config (memory 256 MiB)"),
    _ledgerview("ledgerview 1 GiB", "the same with compaction.memory.bytes = 1 GiB (docs/compaction.md: phase one "
                "reduces and spills less often)", config=LARGE_BUDGET_CONFIG),
    _ledgerview("ledgerview no key index", "the same with compaction.key.index = false (no point-lookup index, as "
                "the peers build none)", config=NO_KEY_INDEX_CONFIG),
    _ledgerview("ledgerview small batches", "the same over a log appended 100 messages at a time (about a "
                "Kafka producer's batch at its default batch.size, 16 KiB)",
                append_messages=KAFKA_PRODUCER_BATCH_MESSAGES),
    Case("mmap scan (floor)", preparer=compaction.ledgerview_store(), job=compaction.mmap_scan,
         note="memory-map each raw segment file, sum it as uint64 words"),
    Case("duckdb semi-join", preparer=compaction.ipc_input, job=compaction.duckdb_job(compaction.DUCKDB_SEMI_JOIN),
         note="offset IN (SELECT max(offset) GROUP BY key), value NOT NULL, ORDER BY offset; IPC in, IPC out"),
    Case("duckdb qualify", preparer=compaction.ipc_input, job=compaction.duckdb_job(compaction.DUCKDB_QUALIFY),
         note="QUALIFY row_number() OVER (PARTITION BY key ORDER BY offset DESC) = 1, then value NOT NULL, "
              "ORDER BY offset"),
    Case("duckdb arg_max", preparer=compaction.ipc_input, job=compaction.duckdb_job(compaction.DUCKDB_ARG_MAX),
         note="GROUP BY key: max(offset), arg_max_null(value, offset), arg_max(timestamp, offset); value NOT NULL, "
              "ORDER BY offset"),
    Case("polars", preparer=compaction.ipc_input, job=compaction.polars_job,
         note="scan_ipc.unique(key, keep=last, maintain_order).filter(value not null).sink_ipc"),
    Case("pyarrow", preparer=compaction.ipc_input, job=compaction.pyarrow_job,
         note="group_by(key) max(offset), sort, take per batch (offset = row), filter live, write IPC"),
    Case("spark sql", preparer=compaction.parquet_input, job=compaction.spark_job,
         note=f"local[2], driver {compaction.SPARK_DRIVER_MEMORY}: row_number() window over a Parquet copy, "
              "ORDER BY offset, Parquet out; session start untimed"),
)


WORKLOADS: dict[str, Workload] = {
    workload.name: workload
    for workload in (
        Workload(
            "append",
            "append in 10k-message slices to a fresh 1-partition topic, then flush (fsync)",
            (
                Case("ledgerview", systems.ledgerview_write, note="store.append x 10k rows, store.flush()"),
                *(Case(f"ledgerview {codec}", systems.ledgerview_writer(codec),
                       note=f"the same into a topic with compression.type={codec}") for codec in CODECS),
                Case("arrow ipc file", systems.ipc_write, note="RecordBatchFileWriter, 10k-row batches, fsync"),
                Case("parquet", systems.parquet_write, note="ParquetWriter, 1M-row groups, snappy, fsync"),
            ),
        ),
        Workload(
            "read",
            "read the whole partition back as Arrow, page cache warm",
            (
                Case("ledgerview", systems.ledgerview_write, systems.ledgerview_read, note="store.read(topic, 0)"),
                Case("ledgerview unverified", systems.ledgerview_write, systems.ledgerview_read_unverified,
                     note="Store.open(verify_reads=False), store.read(topic, 0): no CRC-32C check"),
                Case("ledgerview batches", systems.ledgerview_write, systems.ledgerview_read_batches,
                     note="sum of num_rows over store.read_batches"),
                *(Case(f"ledgerview {codec}", systems.ledgerview_writer(codec), systems.ledgerview_read,
                       note=f"store.read(topic, 0) of a topic with compression.type={codec}") for codec in CODECS),
                Case("arrow ipc file", systems.ipc_write, systems.ipc_read,
                     note="open_file(memory_map).read_all()"),
                Case("parquet", systems.parquet_write, systems.parquet_read, note="pq.read_table"),
            ),
        ),
        Workload(
            "open",
            "a writer's open of the topic's partition after a clean close (recovered from its recovery point), "
            "page cache warm",
            (
                Case("ledgerview", preparer=compaction.ledgerview_store(), job=compaction.ledgerview_open,
                     note="Store.open, store.partition_log(topic, 0), close; appended 10k messages at a time"),
                Case("ledgerview small batches",
                     preparer=SMALL_BATCHES_STORE,
                     job=compaction.ledgerview_open, note="the same over a log appended 100 messages at a time"),
            ),
        ),
        Workload(
            "compact",
            "keep the latest live message per key, from the log on disk to the result on disk, side by side",
            COMPACT_CASES,
            same_result=True,
        ),
        Workload(
            "compact-incremental",
            f"a second compaction after {compaction.NEW_MESSAGES_SHARE:.0%} new messages, against the first and "
            "against compacting everything from scratch",
            (
                _ledgerview("ledgerview first", "the first compaction of the dataset"),
                _ledgerview("ledgerview second", f"after the first, {compaction.NEW_MESSAGES_SHARE:.0%} new "
                            "messages appended (fresh seed): reads the previous view + the new messages, writes "
                            "a layered view", compact=True, new_messages=True),
                _ledgerview("ledgerview second, whole", "the same, with compaction.max.layers 1: writes the whole "
                            "view again (Pulsar's way)", compact=True, new_messages=True,
                            config={"compaction.max.layers": 1}),
                _ledgerview("ledgerview from scratch", "the same log (dataset + new messages), never compacted",
                            new_messages=True),
                _ledgerview("ledgerview first, no key index", "the first compaction, compaction.key.index = false",
                            config=NO_KEY_INDEX_CONFIG),
                _ledgerview("ledgerview second, no key index", "the layered second run, compaction.key.index = "
                            "false", compact=True, new_messages=True, config=NO_KEY_INDEX_CONFIG),
            ),
            whole_dataset=False,
            time_vs_first=True,
        ),
        Workload(
            "compact-budget",
            f"compaction.memory.bytes = {BUDGET}, against the default (use with many keys, e.g. --keys 10000000)",
            (
                _ledgerview(f"ledgerview {BUDGET}", f"compaction.memory.bytes {BUDGET}; pyarrow's default pool "
                            "(mimalloc)", config=BUDGET_CONFIG),
                _ledgerview(f"ledgerview {BUDGET} system", f"compaction.memory.bytes {BUDGET}; "
                            "ARROW_DEFAULT_MEMORY_POOL=system", config=BUDGET_CONFIG, env=SYSTEM_ALLOCATOR),
                _ledgerview("ledgerview 256 MiB", "default config"),
            ),
            same_result=True,
        ),
        Workload(
            "clean",
            "Kafka-style in-place cleaning of a compacted topic (one pass, whole log dirty), beside copying its "
            "segment files once",
            (
                Case("ledgerview", preparer=cleaning.cleanable_store, job=cleaning.ledgerview_clean(),
                     note="Store.open, store.clean(topic) (default: 128 MiB key map), close"),
                Case(f"ledgerview {cleaning.SMALL_BUDGET_MIB} MiB", preparer=cleaning.cleanable_store,
                     job=cleaning.ledgerview_clean(cleaning.SMALL_BUDGET_MIB * compaction.MiB),
                     note=f"dedupe_buffer_bytes {cleaning.SMALL_BUDGET_MIB} MiB: store.clean(topic) until nothing is "
                          "left (the map holds fewer keys than the log has: several passes)"),
                Case("file copy (floor)", preparer=cleaning.cleanable_store, job=cleaning.copy_floor,
                     note="read each segment file and write it once, fsync"),
            ),
        ),
        Workload(
            "scan-compacted",
            "read the whole compacted ledger back as Arrow, page cache warm",
            (
                Case("ledgerview", reader=compaction.scan_compacted, preparer=compaction.ledgerview_store(compact=True),
                     note="CompactedLedgers(folder).open_current(), sum of num_rows over ledger.read_batches()"),
                *(Case(f"ledgerview {shape} after +10%", reader=compaction.scan_compacted,
                       preparer=compaction.ledgerview_store({"compaction.max.layers": layers}, compact=True,
                                                            new_messages=True, compact_again=True),
                       note=f"the same, after {compaction.NEW_MESSAGES_SHARE:.0%} new messages and a second "
                            f"compaction: {note}")
                  for shape, layers, note in (("whole", 1, "the view rewritten whole"),
                                              ("layered", 4, "a ledger over the first, whose replaced rows the "
                                                             "scan reads and drops"))),
            ),
            whole_dataset=False,
        ),
        Workload(
            "remote-upload",
            "upload a topic's sealed segments to the remote tier (moto's S3 server on 127.0.0.1), beside a plain "
            "pyarrow copy of the same files to the same kind of server",
            (
                Case("ledgerview sync_remote", preparer=SEALED, job=remote.ledgerview_upload,
                     note=f"store.sync_remote(topic): {remote.SEGMENT_BYTES // compaction.MiB} MiB segments, "
                          "each its 2 indexes then its log to fresh keys, a manifest published after each"),
                Case("pyarrow copy_files", preparer=SEALED, job=remote.copy_files_floor,
                     note="pyarrow.fs.copy_files of the same files, one call per file, to fresh keys"),
            ),
            default_messages=remote.REMOTE_MESSAGES,
        ),
        Workload(
            "remote-compact",
            "the first compaction with every sealed segment on the remote tier (fresh Store: nothing fetched yet), "
            "beside the same on local segments and plain pyarrow transfers of the same bytes",
            (
                Case("ledgerview remote", preparer=SEALED,
                     job=remote.on_remote(compaction.ledgerview_compact),
                     note="Store.open, Compactor(store).compact(topic), close; every segment remote (moto S3), so "
                          "compact also uploads the new ledger and its key index (sync_remote)"),
                Case("ledgerview local", preparer=SEALED, job=compaction.ledgerview_compact,
                     note="the same on the same segments, local, untiered (page cache warm)"),
                Case("pyarrow read (floor)", preparer=SEALED, job=remote.remote_read_floor,
                     note="open_input_file(key).read_buffer() of every uploaded segment log object"),
                Case("pyarrow copy result (floor)", preparer=SEALED, job=remote.result_copy_floor,
                     note="copy_files of what the remote row uploads: the ledger and its flattened key index"),
            ),
            same_result=True,
            goals=(
                Goal("ledgerview remote", ("ledgerview local", "pyarrow read (floor)"), 1.2),
                Goal("ledgerview remote", ("ledgerview local", "pyarrow read (floor)", "pyarrow copy result (floor)")),
            ),
            default_messages=remote.REMOTE_MESSAGES,
        ),
        Workload(
            "remote-scan",
            f"full reads with every sealed segment on the remote tier (fresh Store), beside the same on local "
            f"segments: the raw log, and the compacted view (a ledger of the first "
            f"{1 - remote.SCAN_TAIL_SHARE:.0%}, then a raw tail of {remote.SCAN_TAIL_SHARE:.0%})",
            (
                Case("ledgerview remote raw", preparer=SEALED_COMPACTED,
                     job=remote.on_remote(remote.raw_scan),
                     note="Store.open, sum of num_rows over store.read_batches of every partition, close"),
                Case("ledgerview local raw", preparer=SEALED_COMPACTED, job=remote.raw_scan,
                     note="the same on local segments (page cache warm)"),
                Case("ledgerview remote compacted", preparer=SEALED_COMPACTED,
                     job=remote.on_remote(remote.compacted_view_scan),
                     note="Store.open, sum of num_rows over Reader(store, topic, read_compacted=True).batches(), "
                          "close: the ledger from the data folder, the raw tail remote"),
                Case("ledgerview remote-only compacted", preparer=SEALED_COMPACTED,
                     job=remote.on_remote(remote.remote_tier_compacted_scan),
                     note="Reader('s3://…', topic, read_compacted=True).batches(): the ledger and the tail both "
                          "from the remote tier, no data folder"),
                Case("ledgerview local compacted", preparer=SEALED_COMPACTED,
                     job=remote.compacted_view_scan, note="the same on local segments (page cache warm)"),
                Case("pyarrow read (floor)", preparer=SEALED_COMPACTED,
                     job=remote.remote_read_floor,
                     note="open_input_file(key).read_buffer() of every uploaded segment log object"),
            ),
            whole_dataset=False,
            goals=(Goal("ledgerview remote raw", ("ledgerview local raw", "pyarrow read (floor)")),),
            default_messages=remote.REMOTE_MESSAGES,
        ),
        Workload(
            "spark-sink",
            f"a Structured Streaming query (availableNow, {spark_jobs.SINK_FILES} Parquet files, one per "
            "micro-batch) into each sink, checkpoint and commit included",
            (
                Case("ledgerview sink", preparer=spark_jobs.sink_input, job=spark_jobs.ledgerview_sink,
                     note="writeStream.format('ledgerview'), 1-partition topic, exactly-once commit"),
                Case("parquet file sink", preparer=spark_jobs.sink_input, job=spark_jobs.parquet_sink,
                     note="writeStream.format('parquet'), Spark's built-in file sink"),
            ),
        ),
        *(
            Workload(
                f"spark-sql-{name}",
                f"Spark SQL {what} over the store (compacted once, then 10% more appended), beside the same query "
                "over a Parquet copy of the same rows",
                tuple(
                    Case(source, preparer=spark_jobs.parquet_copies, job=spark_jobs.sql_job(source, query, view),
                         note=note.format(view=view))
                    for source, note in (("ledgerview", "spark.read.format('ledgerview'), view={view}"),
                                         ("parquet", "spark.read.parquet of the {view} view's rows"))
                ) + ((Case("ledgerview small batches", job=spark_jobs.sql_job("ledgerview", query, view),
                           preparer=functools.partial(spark_jobs.parquet_copies,
                                                      append_messages=KAFKA_PRODUCER_BATCH_MESSAGES),
                           note=f"the same over a log appended {KAFKA_PRODUCER_BATCH_MESSAGES} messages at a time"),)
                     if view == "raw" else ()),
                whole_dataset=False,
            )
            for name, what, query, view in (
                ("scan", "full scan of the table view", spark_jobs.FULL_SCAN, "compacted"),
                ("filter", "scan of the table view's upper half of offsets", spark_jobs.FILTERED_SCAN, "compacted"),
                ("point", "point query of the table view", spark_jobs.POINT_QUERY, "compacted"),
                ("raw-scan", "full scan of the raw log", spark_jobs.FULL_SCAN, "raw"),
            )
        ),
        *(
            Workload(
                f"spark-write-{when}",
                f"the {when} df.write of a session: the dataset from one Parquet file into each sink",
                tuple(
                    Case(sink, preparer=spark_jobs.write_input, job=spark_jobs.write_job(sink, first=when == "first"),
                         note=note)
                    for sink, note in (("ledgerview", "df.write.format('ledgerview') into a 1-partition topic"),
                                       ("parquet", "df.write.parquet"))
                ),
            )
            for when in ("first", "warm")
        ),
        Workload(
            "get",
            "point lookups of random existing keys of the compacted view; seconds is the sum of their latencies",
            tuple(
                Case(f"ledgerview {path}", preparer=compaction.ledgerview_store(compact=True),
                     job=compaction.get_job(path), note="page cache warm, key index block cache cold")
                for path in compaction.GET_PATHS
            ),
            whole_dataset=False,
        ),
        Workload(
            "kafka-produce",
            "produce through the Kafka endpoint (its own process, loopback), one partition, until every message "
            "is acknowledged (acks=all)",
            (
                Case("confluent-kafka", preparer=kafka.produce_input, job=kafka.confluent_produce,
                     note="Producer.produce_batch of 10k messages, linger.ms 20, batch.size 1 MB, then flush"),
                Case("kafka-python", preparer=kafka.produce_input, job=kafka.kafka_python_produce,
                     note="KafkaProducer.send per message (idempotent), linger_ms 20, batch_size 1 MB, then flush"),
                Case("kcat", preparer=kafka.kcat_produce_input, job=kafka.kcat_produce,
                     note="kcat -P -l of key<TAB>value lines (native librdkafka), linger.ms 20, batch.size 1 MB"),
                Case("kcat with glibc keeping freed memory", preparer=kafka.kcat_produce_input,
                     job=kafka.kcat_produce_keeping_freed_memory,
                     note="the same, the endpoint run with MALLOC_TOP_PAD_=64 MiB"),
                Case("kcat small batches", preparer=kafka.kcat_produce_input, job=kafka.kcat_produce_small_batches,
                     note="the same with the Java producer's defaults: batch.size 16 KiB, linger.ms 5"),
            ),
        ),
        Workload(
            "kafka-consume",
            "consume one partition from offset 0 through the Kafka endpoint (its own process, loopback)",
            (
                Case("confluent-kafka", preparer=kafka.consume_input, job=kafka.confluent_consume,
                     note="Consumer.assign at offset 0, consume(10k) until every message; default fetch sizes"),
                Case("kafka-python", preparer=kafka.consume_input, job=kafka.kafka_python_consume,
                     note="KafkaConsumer.assign + seek 0, poll(max_records=10k) until every message"),
                Case("kcat", preparer=kafka.consume_input, job=kafka.kcat_consume,
                     note="kcat -C -o beginning -c N -f '%o\\n' (native librdkafka); default fetch sizes"),
                Case("kcat with glibc keeping freed memory", preparer=kafka.consume_input,
                     job=kafka.kcat_consume_keeping_freed_memory,
                     note="the same, the endpoint run with MALLOC_TOP_PAD_=64 MiB"),
                Case("kcat small batches",
                     preparer=SMALL_BATCHES_STORE,
                     job=kafka.kcat_consume, note="kcat as above, the topic appended 100 messages at a time (about "
                     "a Kafka producer's batch at its default batch.size, 16 KiB)"),
            ),
        ),
    )
}


def find(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise KeyError(f"unknown workload {name!r}; valid workloads: {', '.join(WORKLOADS)}") from None
