"""The topic catalogue: which topics a data folder holds, their metadata and their partition folders.

A topic exists while its metadata file ``__topics/<topic>/topic.json`` does (storage/topics.py): creating writes
it last, after the partition folders; deleting renames it first (to ``topic.json.deleting``, which says the folders
are to go), then removes the folders, then the partitions' checkpoint entries, then that marker. A crash in between
leaves folders without a topic, which ``remove_leftovers`` removes at the next open: those of a deletion (its marker
is there) and those of a creation (they hold no data yet). A folder without a topic that holds data and no marker
(its metadata file was lost, or someone put it there) is kept, and named in a warning: never deleted unasked.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from storage.checkpoints import read_checkpoint, update_checkpoint
from storage.config import CONFIG_KEYS, InvalidConfigError, TopicConfig, UnknownConfigError
from storage.errors import (
    CorruptDataError,
    OrphanPartitionFolderError,
    TopicExistsError,
    UnknownTopicError,
)
from storage.fileio import fsync_folder, remove_stray_temporary_files
from storage.files import (
    CLEANER_OFFSET_CHECKPOINT,
    DELETED_FOLDER_SUFFIX,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    TOPIC_DELETION_MARKER,
    TOPIC_METADATA,
    TOPICS_FOLDER,
    folder_to_delete,
    parse_partition_folder,
    partition_folder,
    partitions_on_disk,
    topic_metadata_file,
    topic_sinks_folder,
    validate_partition_count,
    validate_topic_name,
)
from storage.locks import FileLock
from storage.partition_log import Clock
from storage.topics import TopicMetadata

CONFIG_KEY_NAMES = frozenset(key.name for key in CONFIG_KEYS)
logger = logging.getLogger(__name__)
_CHECKPOINTS = (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT, CLEANER_OFFSET_CHECKPOINT)
"""The store's checkpoint files, each with an entry per partition."""


class TopicCatalogue:
    """The topics of the data folder ``root``; changes to them hold ``store_lock``.

    ``on_read``: called with a topic's metadata each time it is read from its file (first use, or after another
    process or this one changed it), so the caller can pass a new config on to the topic's open partitions.
    """

    def __init__(self, root: Path, store_lock: FileLock, clock: Clock, *,
                 on_read: Callable[[TopicMetadata], None]) -> None:
        self.root = root
        self._store_lock = store_lock
        self._clock = clock
        self._on_read = on_read
        self._topics: dict[str, tuple[tuple[int, int], TopicMetadata]] = {}
        self._metadata_paths: dict[str, Path] = {}

    def create(self, topic: str, partitions: int = 1, config: Mapping[str, Any] | None = None) -> None:
        validate_topic_name(topic)
        validate_partition_count(partitions)
        topic_config = TopicConfig.from_overrides(config or {})
        metadata = TopicMetadata(topic, partitions, topic_config.to_overrides(), self._clock())
        with self._store_lock:
            if topic_metadata_file(self.root, topic).exists():
                raise TopicExistsError(topic)
            folders = [partition_folder(self.root, topic, partition) for partition in range(partitions)]
            being_deleted = self._being_deleted(topic)
            # a deletion a crash interrupted is finished first, beyond the new topic's partitions too: the folders it
            # left and the checkpoint entries of every partition it had (it forgets them last)
            unfinished = (set(partitions_on_disk(self.root, topic)) | self._checkpointed_partitions(topic)) - set(
                range(partitions)) if being_deleted else set()
            if not being_deleted:
                for folder in folders:
                    if folder.is_dir() and _holds_data(folder):
                        raise OrphanPartitionFolderError(topic, str(folder), str(_topic_folder(self.root, topic)))
            for partition in sorted(unfinished):
                leftover = partition_folder(self.root, topic, partition)
                if leftover.exists():  # a partition known only from the checkpoints has no folder left
                    shutil.rmtree(leftover)
            for folder in folders:
                if folder.exists():
                    shutil.rmtree(folder)  # left by a creation or deletion that crashed half-way
                folder.mkdir()
            shutil.rmtree(topic_sinks_folder(self.root, topic), ignore_errors=True)  # and its sinks' records
            # and the checkpoint entries such a deletion left: the new log starts at 0 with nothing fsynced (a
            # recovery point inherited from the old one would take a batch still being written for damage)
            self._forget_checkpoints(topic, [*range(partitions), *unfinished])
            (_topic_folder(self.root, topic) / TOPIC_DELETION_MARKER).unlink(missing_ok=True)
            metadata.write(topic_metadata_file(self.root, topic))

    def names(self) -> list[str]:
        return sorted(path.parent.name for path in (self.root / TOPICS_FOLDER).glob(f"*/{TOPIC_METADATA}"))

    def metadata(self, topic: str) -> TopicMetadata:
        """The topic's metadata, re-read when another process has changed it."""
        path = self._metadata_paths.get(topic)
        if path is None:
            path = self._metadata_paths[topic] = topic_metadata_file(self.root, topic)
        try:
            stat = path.stat()
        except FileNotFoundError:
            self._topics.pop(topic, None)
            raise UnknownTopicError(topic, self.names()) from None
        identity = (stat.st_ino, stat.st_mtime_ns)  # replaced by rename: a new inode even within one clock tick
        cached = self._topics.get(topic)
        if cached is None or cached[0] != identity:
            metadata = TopicMetadata.decode(path, path.read_bytes())
            self._topics[topic] = (identity, metadata)
            self._on_read(metadata)
            return metadata
        return cached[1]

    def alter_config(self, topic: str, set: Mapping[str, Any] | None = None,
                     delete: Iterable[str] = ()) -> TopicConfig:
        """Set and remove config overrides; validated as a whole before anything is stored."""
        with self._store_lock:
            metadata = self.metadata(topic)
            overrides: dict[str, Any] = dict(metadata.overrides)
            for key in delete:
                if key not in CONFIG_KEY_NAMES:
                    raise UnknownConfigError(key)
                overrides.pop(key, None)
            overrides.update(set or {})
            config = TopicConfig.from_overrides(overrides)
            if metadata.config.remote_storage_enable and not config.remote_storage_enable:
                raise InvalidConfigError("remote.storage.enable", "false", "true once a topic is tiered: its older "
                                         "segments are on the remote tier only (Kafka refused this too until 3.9)")
            new = TopicMetadata(topic, metadata.partitions, config.to_overrides(), metadata.created_ms)
            new.write(topic_metadata_file(self.root, topic))
            self.metadata(topic)
            return config

    def delete(self, topic: str) -> None:
        """Delete the topic: its metadata renamed to the deletion marker first (it is gone at once), then its
        folders and its sinks' records (a sink's committed batch id belongs to the log deleted), then its checkpoint
        entries, then the marker. Its partition logs must be closed. A topic whose metadata record is damaged is
        deleted too, with the partition folders it has."""
        with self._store_lock:
            try:
                partitions: Iterable[int] = range(self.metadata(topic).partitions)
            except CorruptDataError:  # a damaged record says not how many: the folders it has
                partitions = partitions_on_disk(self.root, topic)
            metadata_file = topic_metadata_file(self.root, topic)
            marker = metadata_file.with_name(TOPIC_DELETION_MARKER)
            os.replace(metadata_file, marker)  # the topic is gone; its folders go next, after a crash too
            fsync_folder(marker.parent)
            self._topics.pop(topic, None)
            folders = [partition_folder(self.root, topic, partition) for partition in partitions]
            for folder in [*folders, topic_sinks_folder(self.root, topic)]:
                if folder.exists():  # a topic's sinks folder is made by its first sink
                    doomed = folder_to_delete(self.root)
                    folder.rename(doomed)
                    shutil.rmtree(doomed)
            self._forget_checkpoints(topic, partitions)
            marker.unlink()
            marker.parent.rmdir()

    def _checkpointed_partitions(self, topic: str) -> set[int]:
        """The partitions of ``topic`` with an entry in one of the store's checkpoints."""
        return {partition for name in _CHECKPOINTS for (named, partition) in read_checkpoint(self.root / name)
                if named == topic}

    def _forget_checkpoints(self, topic: str, partitions: Iterable[int]) -> None:
        """Remove the partitions' entries from the store's checkpoints; the caller holds the store lock."""
        changes: dict[tuple[str, int], int | None] = {(topic, partition): None for partition in partitions}
        for name in _CHECKPOINTS:
            update_checkpoint(self.root / name, self._store_lock, changes)

    def remove_leftovers(self) -> None:
        """Finish what a crash interrupted: deletions and creations of topics, writes of their metadata and of the
        store's checkpoints. Run when the store opens."""
        self._remove_deleted_folders()
        self._remove_stray_temporary_files()

    def _remove_stray_temporary_files(self) -> None:
        """Checkpoint and topic-metadata writes a crash interrupted; under the store lock, which those writes
        hold, so no write in progress loses its temporary file."""
        with self._store_lock:
            remove_stray_temporary_files(self.root)
            for topic_folder in (self.root / TOPICS_FOLDER).iterdir():
                if topic_folder.is_dir():
                    remove_stray_temporary_files(topic_folder)

    def _remove_deleted_folders(self) -> None:
        """Finish deletions and creations a crash interrupted: folders renamed for deletion, and folders without
        a topic that a deletion left (its marker says so) or a creation left (they hold no data). A folder without
        a topic that holds data and no deletion marker is kept, with a warning: its topic's metadata file went
        missing (or it is no partition folder at all), and removing it would lose the only copy of its messages."""
        topics = set(self.names())
        for entry in self.root.iterdir():
            if not entry.is_dir() or entry.name == TOPICS_FOLDER:
                continue
            parsed = parse_partition_folder(entry.name)
            if entry.name.endswith(DELETED_FOLDER_SUFFIX) or (parsed is not None and parsed[0] not in topics):
                with self._store_lock:
                    if parsed is None:
                        shutil.rmtree(entry, ignore_errors=True)
                    elif parsed[0] not in set(self.names()):
                        if self._being_deleted(parsed[0]) or not _holds_data(entry):
                            shutil.rmtree(entry, ignore_errors=True)
                        else:
                            logger.warning(_ORPHAN_WARNING, entry, _topic_folder(self.root, parsed[0]))
        for marker in (self.root / TOPICS_FOLDER).glob(f"*/{TOPIC_DELETION_MARKER}"):
            topic = marker.parent.name
            with self._store_lock:
                if topic not in set(self.names()) and not partitions_on_disk(self.root, topic):
                    marker.unlink(missing_ok=True)
                    with contextlib.suppress(OSError):  # a write's temporary file, removed at the next open
                        marker.parent.rmdir()

    def _being_deleted(self, topic: str) -> bool:
        """Whether a deletion of ``topic`` began (and did not finish): its metadata file was renamed to the marker."""
        return (_topic_folder(self.root, topic) / TOPIC_DELETION_MARKER).exists()


_ORPHAN_WARNING = ("%s holds data, but no topic of that name exists (%s has no topic.json) and no deletion of one "
                   "began: left as it is. Restore that topic.json to serve the topic again, or move the folder out "
                   "of the data folder.")


def _topic_folder(root: Path, topic: str) -> Path:
    """``__topics/<topic>`` for a name read from a folder's (not checked as a topic name: it names no new file)."""
    return root / TOPICS_FOLDER / topic


def _holds_data(folder: Path) -> bool:
    """Whether any file under ``folder`` has bytes: a creation that crashed left its partition folders empty (or
    with the empty files of a first open), a deletion or a lost metadata file leaves messages."""
    for path in folder.rglob("*"):
        with contextlib.suppress(FileNotFoundError):  # removed meanwhile
            if path.is_file() and path.stat().st_size > 0:
                return True
    return False
