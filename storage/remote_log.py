"""One partition's log on the remote tier, and who may change it: Kafka's RemoteLogMetadataManager reduced to
numbered manifests that are created once, as Delta Lake commits its log.

Layout under the remote URI (docs/FORMAT.md, "Remote tier")::

    <topic>-<partition>/segments/<base offset>-<uuid>.log|.index|.timeindex   uploaded segments, never rewritten
    <topic>-<partition>/manifests/<version>.json                              the remote log, one record per change

A manifest lists every uploaded segment still in the remote log, in offset order, and the remote log start
offset. The manifest with the highest version is the remote log; a change writes version + 1 with a create-once
write (storage/object_store.py), so of two writers racing for one version exactly one wins. Each manifest carries
the **epoch** of the data folder that wrote it: a folder claims the partition by publishing the same segments under
a higher epoch, and a writer whose epoch is below the latest manifest's is fenced (``RemoteLogFencedError``): a
stale writer or compactor that wakes up late is refused, never merged. The epoch a folder holds is kept in a
record beside its segments (``remote-epoch.json``) with the id of the claim that gave it, which the manifests of
that epoch carry too: a claim is recorded as under way before it is published, so a folder killed between the two
finds its own claim in the remote log instead of being fenced by it.

Uploads go to fresh keys before the manifest that names them is published, so readers never see a segment that is
not whole; an upload that died before its publish leaves objects that no manifest names, which
``remove_unreferenced`` deletes once they are older than a grace period: the long remote.unpublished.delete.delay.ms
on a log no folder owns, whose sweep cannot tell them from uploads a writer still works towards publishing, and
file.delete.delay.ms on a folder's own log, whose uploads and sweeps its lock orders. Objects of segments dropped
from the remote log (retention) are deleted after file.delete.delay.ms, so a reader that planned on an older
manifest can finish.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from storage import faults
from storage.compacted import CompactionCursor
from storage.errors import CorruptDataError, LedgerviewError, WriterConflictError
from storage.fileio import write_atomically
from storage.files import KEY_INDEX_SUFFIX, LEDGER_SUFFIX, REMOTE_EPOCH_RECORD, TEMP_SUFFIX, TOPICS_FOLDER
from storage.key_index import KeyIndex
from storage.ledger import Ledger
from storage.object_store import ObjectInfo, ObjectStore, RemoteObjectMissingError
from storage.records import CorruptRecordError, decode_record, encode_record
from storage.remote_key_index import write_flat_key_index
from storage.remote_ledger import RemoteCompactedView
from storage.remote_segment import RemoteSegmentInfo
from storage.segment import Segment

logger = logging.getLogger(__name__)

MANIFEST_RECORD = "remote-log-manifest"
EPOCH_RECORD = "remote-epoch"
MANIFEST_VERSION = 3
"""Version 2 added segments stored from offset 0 (``offset_shift``), sink commits, and ledgers in pieces; version 3
the compacted view's ``dropped_tombstones``. Earlier versions are still read."""
EPOCH_VERSION = 2
"""Version 2 added the id of the claim that gave the epoch, and the claim under way; version 1 is still read."""
_MANIFEST_NAME = re.compile(r"(\d{20})\.json")
PUBLISH_WITHIN_SHARE = 0.5
"""A writer publishes objects no manifest names yet only while the oldest is younger than this share of its topic's
remote.unpublished.delete.delay.ms, after which ``remove_unreferenced`` may delete them; the rest of that period
is for the publish itself and for clock skew."""
_LAST_SEEN: dict[tuple[str, str, int], RemoteLogManifest] = {}
_LAST_SEEN_LOCK = threading.Lock()


class RemoteSyncRefusal(LedgerviewError):
    """A partition the remote tier will not take this folder's segments for. Store.sync_remote raises the first
    once every other partition of its call is synced: ``synced`` holds their results (RemoteSyncResult) and
    ``also_refused`` the other refusals."""

    synced: list[Any]
    also_refused: list[RemoteSyncRefusal]

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.synced, self.also_refused = [], []


class RemoteLogFencedError(RemoteSyncRefusal):
    def __init__(self, topic: str, partition: int, ours: int | None, theirs: int) -> None:
        self.ours, self.theirs = ours, theirs
        held = "has not claimed it" if ours is None else f"holds epoch {ours}"
        super().__init__(
            f"The remote log of {topic}-{partition} belongs to another writer (epoch {theirs}); this data folder "
            f"{held}, so it uploads nothing and changes nothing there. Appends here go on locally. If this folder "
            f"now owns the partition and its local log continues the remote one, claim it with "
            f"store.claim_remote({topic!r}, {partition})."
        )


class RemoteLogOwnedError(WriterConflictError):
    def __init__(self, topic: str, partition: int, epoch: int) -> None:
        self.epoch = epoch
        super().__init__(
            f"The remote log of {topic}-{partition} belongs to a data folder (epoch {epoch}); writers of the remote "
            f"tier alone (a Spark sink with an object-store path, distributed compaction) change only remote logs "
            f"that no data folder has claimed. Write and compact {topic} through the store of the folder that owns "
            f"it, or keep this tier for writers of the tier alone."
        )


class RemoteManifestDamagedError(CorruptRecordError):
    """The newest manifest of a remote log fails its checks: what the log holds is unknown, so its readers, uploads
    and sweep stop at it. ``older`` is the newest older manifest that reads, if any."""

    def __init__(self, damaged: CorruptRecordError, topic: str, partition: int,
                 older: RemoteLogManifest | None) -> None:
        self.source, self.kind, self.reason, self.older = damaged.source, damaged.kind, damaged.reason, older
        where = f"It is the newest manifest of the remote log of {topic}-{partition}"
        if older is None:
            LedgerviewError.__init__(self, f"{damaged} {where}, and no older one reads: put the object back from a "
                                           "copy (or the bucket's previous version of it).")
            return
        LedgerviewError.__init__(
            self, f"{damaged} {where}. Put the object back from a copy (or the bucket's previous version of it), or "
                  f"delete it: version {older.version} (offsets {older.log_start_offset} to {older.end_offset - 1}, "
                  f"epoch {older.epoch}) is then the remote log again, and `ledgerview remote sync` in the data "
                  f"folder that owns the partition uploads again what it holds above that. Before the sync, check "
                  f"with `ledgerview remote status {topic}` that its local log starts at or below {older.end_offset}: "
                  f"if it does not, the offsets between are only in the damaged manifest's segments, so put the "
                  f"object back instead. If the deleted manifest was the folder's claim, it is fenced then: claim "
                  f"again with `ledgerview remote claim {topic} --partition {partition}`.")


@dataclass(frozen=True)
class RemoteLogManifest:
    version: int
    """Its sequence number; the manifest with the highest one is the remote log."""
    epoch: int
    """The epoch of the writer that published it."""
    log_start_offset: int
    """Reads below it are out of range, on both tiers."""
    segments: tuple[RemoteSegmentInfo, ...]
    published_ms: int
    compacted: RemoteCompactedView | None = None
    """The partition's compacted view on the remote tier; its horizon is below ``end_offset``, so a reader of the
    remote tier alone finds the raw tail above it there."""
    sinks: dict[str, int] = field(default_factory=dict)
    """Per Spark sink writing straight to the tier (streaming/remote_sink.py): the last micro-batch whose rows
    this log holds, published with them, so a replayed batch is never appended twice."""
    claim: str | None = None
    """The id of the claim that began its epoch (None for epoch 0, and in manifests written before claims had
    ids): a folder killed between publishing its claim and recording it finds its claim by it."""

    @property
    def end_offset(self) -> int:
        """The offset after the last uploaded message (the log start offset when nothing is uploaded)."""
        return self.segments[-1].next_offset if self.segments else self.log_start_offset

    @property
    def size_bytes(self) -> int:
        return sum(segment.size_bytes for segment in self.segments)

    @property
    def object_keys(self) -> set[str]:
        """Every object the manifest names."""
        keys = {key for segment in self.segments for key in segment.object_keys}
        return keys | set(self.compacted.object_keys) if self.compacted else keys

    def encode(self) -> bytes:
        body = asdict(self)
        body["segments"] = [asdict(segment) for segment in self.segments]
        body["compacted"] = self.compacted.to_record() if self.compacted else None
        return encode_record(MANIFEST_RECORD, MANIFEST_VERSION, body)

    @classmethod
    def decode(cls, source: str, data: bytes) -> RemoteLogManifest:
        _, body = decode_record(source, data, MANIFEST_RECORD, max_version=MANIFEST_VERSION)
        try:
            compacted = body["compacted"]
            manifest = cls(body["version"], body["epoch"], body["log_start_offset"],
                           tuple(RemoteSegmentInfo(**segment) for segment in body["segments"]), body["published_ms"],
                           RemoteCompactedView.from_record(compacted) if compacted is not None else None,
                           dict(body.get("sinks", {})), body.get("claim"))
        except (KeyError, TypeError, ValueError) as error:
            raise CorruptRecordError(source, MANIFEST_RECORD, f"a field is missing or unknown ({error})") from None
        if manifest.claim is not None and not isinstance(manifest.claim, str):
            raise CorruptRecordError(source, MANIFEST_RECORD, f"its claim {manifest.claim!r} is not a string")
        manifest.check(source)
        return manifest

    def check(self, source: str) -> None:
        """Raise CorruptRecordError unless the segments follow each other without a gap, as a log does."""
        previous = None
        for segment in self.segments:
            if segment.next_offset <= segment.base_offset or segment.size_bytes <= 0:
                raise CorruptRecordError(source, MANIFEST_RECORD, f"segment {segment.stem} is empty or reversed")
            if previous is not None and segment.base_offset != previous.next_offset:
                raise CorruptRecordError(source, MANIFEST_RECORD, f"segment {segment.stem} does not follow "
                                                                  f"{previous.stem} (a gap or an overlap)")
            previous = segment
        if self.segments and not self.segments[0].base_offset <= self.log_start_offset < self.end_offset:
            raise CorruptRecordError(source, MANIFEST_RECORD, f"its log start offset {self.log_start_offset} is "
                                                              "outside its segments")
        if self.compacted is not None and not -1 <= self.compacted.horizon < self.end_offset:
            raise CorruptRecordError(source, MANIFEST_RECORD, f"its compacted view's horizon "
                                                              f"{self.compacted.horizon} is not below its end offset "
                                                              f"{self.end_offset}")


class RemoteLog:
    """The remote log of one partition: read its manifest, upload segments, publish, sweep."""

    def __init__(self, objects: ObjectStore, topic: str, partition: int) -> None:
        self.objects, self.topic, self.partition = objects, topic, partition
        self.prefix = f"{topic}-{partition}"
        self._key = (objects.uri, topic, partition)

    @property
    def last_seen(self) -> RemoteLogManifest | None:
        """The newest manifest any Store of this process read or published (for status, without a request)."""
        return _LAST_SEEN.get(self._key)

    def _saw(self, manifest: RemoteLogManifest) -> None:
        with _LAST_SEEN_LOCK:
            known = _LAST_SEEN.get(self._key)
            if known is None or known.version < manifest.version:
                _LAST_SEEN[self._key] = manifest

    def data_objects(self) -> list[ObjectInfo]:
        """Every segment and compacted-ledger object the tier holds for this partition, named by a manifest or
        not (an upload that died before its publish)."""
        return self.objects.list(f"{self.prefix}/segments") + self.objects.list(f"{self.prefix}/compacted")

    def manifest_key(self, version: int) -> str:
        return f"{self.prefix}/manifests/{version:020d}.json"

    def _manifest_versions(self) -> list[int]:
        return sorted(int(match[1]) for info in self.objects.list(f"{self.prefix}/manifests")
                      if (match := _MANIFEST_NAME.fullmatch(info.key.rsplit("/", 1)[-1])))

    def latest(self) -> RemoteLogManifest | None:
        """The remote log now: its newest manifest (None if nothing was ever published). Raises
        RemoteManifestDamagedError if it fails its checks."""
        for version in reversed(self._manifest_versions()):
            try:
                manifest = self.read_version(version)
            except CorruptRecordError as error:
                raise self._damaged_newest(version, error) from None
            if manifest is not None:
                self._saw(manifest)
                return manifest
        return None

    def _damaged_newest(self, version: int, error: CorruptRecordError) -> RemoteManifestDamagedError:
        """The error for the damaged newest manifest ``version``, naming the newest older one that reads (one more
        listing, and reads until one succeeds, on this path only)."""
        for older in reversed([listed for listed in self._manifest_versions() if listed < version]):
            with contextlib.suppress(CorruptRecordError):
                manifest = self.read_version(older)
                if manifest is not None:
                    return RemoteManifestDamagedError(error, self.topic, self.partition, manifest)
        return RemoteManifestDamagedError(error, self.topic, self.partition, None)

    def kept_manifest_with_ledger(self, ledger_id: int) -> RemoteLogManifest | None:
        """The newest manifest still kept whose compacted view is ledger ``ledger_id`` (a view is replaced by
        newer ledgers only, so the search stops at an older one); None when there is none. A damaged manifest is
        passed over."""
        for version in reversed(self._manifest_versions()):
            try:
                manifest = self.read_version(version)
            except CorruptDataError:
                continue
            if manifest is None or manifest.compacted is None:
                continue
            if manifest.compacted.ledger_id <= ledger_id:
                return manifest if manifest.compacted.ledger_id == ledger_id else None
        return None

    def read_version(self, version: int) -> RemoteLogManifest | None:
        """The manifest of ``version``; None if it was swept since it was listed (a newer one then exists)."""
        key = self.manifest_key(version)
        try:
            data = self.objects.read(key)
        except RemoteObjectMissingError:
            return None
        manifest = RemoteLogManifest.decode(self.objects.url(key), data.to_pybytes())
        if manifest.version != version:
            raise CorruptRecordError(self.objects.url(key), MANIFEST_RECORD,
                                     f"it says it is version {manifest.version}")
        return manifest

    def publish(self, manifest: RemoteLogManifest) -> bool:
        """Create the manifest of ``manifest.version``; False if another writer published that version first."""
        published = self.objects.create(self.manifest_key(manifest.version), manifest.encode())
        if published:
            self._saw(manifest)
        return published

    def upload_compacted(self, cursor: CompactionCursor, ledger: Ledger, paths: tuple[Path, Path]) -> (
        RemoteCompactedView
    ):
        """Copy a ledger and its key index (flattened, storage/remote_key_index.py) to fresh keys; not yet in the
        remote log."""
        stem = f"{self.prefix}/compacted/{cursor.ledger_id:020d}-{uuid.uuid4().hex}"
        ledger_path, key_index_path = paths
        flat = key_index_path.with_name(f"{key_index_path.name}.flat{TEMP_SUFFIX}")
        try:
            assert isinstance(ledger.keys, KeyIndex) and ledger.keys.indexed  # see remote_tier._sync_compacted
            key_index_bytes = write_flat_key_index(ledger.keys.entries(), flat)
            self.objects.upload(flat, stem + KEY_INDEX_SUFFIX)
        finally:
            flat.unlink(missing_ok=True)
        self.objects.upload(ledger_path, stem + LEDGER_SUFFIX)
        return RemoteCompactedView.of(cursor, ledger, ledger_key=stem + LEDGER_SUFFIX,
                                      key_index_key=stem + KEY_INDEX_SUFFIX, key_index_bytes=key_index_bytes)

    def upload(self, segment: Segment) -> RemoteSegmentInfo:
        """Copy a sealed segment and its indexes to fresh keys (the log last); not yet in the remote log."""
        stem = f"{self.prefix}/segments/{segment.base_offset:020d}-{uuid.uuid4().hex}"
        info = RemoteSegmentInfo(segment.base_offset, segment.next_offset, segment.size_bytes,
                                 segment.first_timestamp, segment.max_timestamp, stem)
        self.objects.upload(segment.offset_index.path, info.offset_index_key)
        self.objects.upload(segment.time_index.path, info.time_index_key)
        faults.crash_point("remote.upload.before_log")
        self.objects.upload(segment.log_path, info.log_key)
        return info

    def remove_unreferenced(self, *, now_ms: int, grace_ms: int, unpublished_grace_ms: int) -> list[str]:
        """Sweep what the remote log no longer needs; returns the keys deleted.

        A manifest goes once a newer one has been published for ``grace_ms`` (the latest always stays), and with
        it the segments only it named: dropped by retention, they stay readable for ``grace_ms`` to readers that
        planned on it. Objects that no manifest names go once their last-modified time is
        ``unpublished_grace_ms`` old: an upload that died before its publish, or one whose writer (a Spark sink's
        batch, a Spark compaction run) publishes later, which the sweep cannot tell apart; so where such writers
        may be at work the caller gives a long period. Last-modified times are the object store's clock: the grace
        periods must exceed the skew between it and ours.

        A damaged manifest older than the newest is read by no one (readers read the newest; those that planned
        on it fail its check): it goes once the next readable one has been published for ``grace_ms``, and the
        objects only it named go as unnamed ones do. A damaged newest manifest stops the sweep, as it stops
        readers: what the log holds is unknown.

        On a file:// tier, the temporary files that a create killed before its link left (of a manifest, or of
        the topic's metadata) go too, once ``grace_ms`` old.

        The objects are listed before the manifests are read: an object a writer publishes after the listing is
        not in it, and one published before is named by a manifest read after, so none is taken for unnamed."""
        listed = self.data_objects()
        versions = self._manifest_versions()
        manifests, damaged = [], []
        for version in versions:
            try:
                manifest = self.read_version(version)
            except CorruptRecordError as error:
                if version == versions[-1]:
                    raise self._damaged_newest(version, error) from None
                logger.warning("Sweeping %s, a damaged manifest a newer one replaced: %s", self.manifest_key(version),
                               error)
                damaged.append(version)
                continue
            if manifest is not None:
                manifests.append(manifest)
        kept = manifests[-1:] + [older for older, newer in itertools.pairwise(manifests)
                                 if newer.published_ms + grace_ms > now_ms]
        kept_keys = {key for manifest in kept for key in manifest.object_keys}
        named = {key for manifest in manifests for key in manifest.object_keys}
        doomed = [info.key for info in listed if info.key not in kept_keys
                  and (info.key in named or info.modified_ms + unpublished_grace_ms <= now_ms)]
        doomed += [self.manifest_key(manifest.version) for manifest in manifests if manifest not in kept]
        for version in damaged:  # kept while no readable newer one is known (the newest may be swept since listed)
            newer = next((manifest for manifest in manifests if manifest.version > version), None)
            if newer is not None and newer.published_ms + grace_ms <= now_ms:
                doomed.append(self.manifest_key(version))
        for prefix in (f"{self.prefix}/manifests", f"{TOPICS_FOLDER}/{self.topic}"):
            doomed += self.objects.abandoned_temporaries(prefix, now_ms=now_ms, grace_ms=grace_ms)
        for key in doomed:
            self.objects.delete(key)
        return doomed


@dataclass(frozen=True)
class HeldClaim:
    """A folder's ``remote-epoch.json``: the epoch it holds (None: none yet) with the id of the claim that gave it
    (None in a version 1 record), and a claim it began whose publish may or may not have happened (``claiming``:
    its epoch and id)."""

    epoch: int | None = None
    claim: str | None = None
    claiming: tuple[int, str] | None = None

    def owns(self, manifest: RemoteLogManifest) -> bool:
        """Whether ``manifest`` is of this folder's epoch: the same number, and the same claim id where both have
        one (records and manifests written before claims had ids are matched by the number)."""
        return manifest.epoch == self.epoch and (None in (manifest.claim, self.claim) or manifest.claim == self.claim)

    def encode(self) -> bytes:
        return encode_record(EPOCH_RECORD, EPOCH_VERSION, {"epoch": self.epoch, "claim": self.claim,
                                                           "claiming": list(self.claiming) if self.claiming else None})

    @classmethod
    def decode(cls, source: str, data: bytes) -> HeldClaim:
        version, body = decode_record(source, data, EPOCH_RECORD, max_version=EPOCH_VERSION)
        epoch, claim, claiming = body.get("epoch"), body.get("claim"), body.get("claiming")
        if not (_is_epoch(epoch) or (epoch is None and version > 1)):
            raise CorruptRecordError(source, EPOCH_RECORD, f"its epoch {epoch!r} is not an integer >= 1")
        if not (claim is None or isinstance(claim, str)):
            raise CorruptRecordError(source, EPOCH_RECORD, f"its claim {claim!r} is not a string")
        if claiming is not None and not (isinstance(claiming, list) and len(claiming) == 2 and _is_epoch(claiming[0])
                                         and isinstance(claiming[1], str)):
            raise CorruptRecordError(source, EPOCH_RECORD, f"its claim under way {claiming!r} is not [epoch, id]")
        return cls(epoch, claim, (claiming[0], claiming[1]) if claiming is not None else None)


def _is_epoch(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


class RemoteLogWriter:
    """Changes one partition's remote log on behalf of one data folder, under that folder's epoch."""

    def __init__(self, log: RemoteLog, partition_folder: Path, clock: Callable[[], int]) -> None:
        self.log, self.clock = log, clock
        self.epoch_path = partition_folder / REMOTE_EPOCH_RECORD

    def held(self) -> HeldClaim:
        """What this folder's epoch record says (nothing held when it has none)."""
        try:
            data = self.epoch_path.read_bytes()
        except FileNotFoundError:
            return HeldClaim()
        return HeldClaim.decode(str(self.epoch_path), data)

    def _record(self, held: HeldClaim) -> None:
        write_atomically(self.epoch_path, held.encode())

    def claim(self, *, log_start_offset: int) -> RemoteLogManifest:
        """Take the partition's remote log for this folder: publish it unchanged under an epoch above every
        earlier one (a remote log not yet started begins at ``log_start_offset``), with a fresh claim id that the
        folder records first, so a process killed between the publish and its record finds its claim (see
        ``current``). Writers of lower epochs are fenced from then on."""
        try:
            held = self.held()
        except CorruptRecordError:  # the claim replaces it, as a claim is how a folder takes the partition again
            held = HeldClaim()
        while True:
            latest, claim = self.log.latest(), uuid.uuid4().hex
            manifest = (replace(latest, version=latest.version + 1, epoch=latest.epoch + 1, published_ms=self.clock(),
                                claim=claim)
                        if latest else RemoteLogManifest(1, 1, log_start_offset, (), self.clock(), claim=claim))
            self._record(replace(held, claiming=(manifest.epoch, claim)))
            faults.crash_point("remote.claim.before_publish")
            if self.log.publish(manifest):
                faults.crash_point("remote.claim.before_record")
                self._record(HeldClaim(manifest.epoch, claim))
                return manifest

    def current(self, *, log_start_offset: int) -> RemoteLogManifest:
        """The remote log, checked to be this folder's to change; a partition never uploaded is claimed now. A claim
        the folder recorded as under way that the remote log carries (its epoch and id) is recorded as held."""
        held, latest = self.held(), self.log.latest()
        if latest is not None and held.claiming is not None and (latest.epoch, latest.claim) == held.claiming:
            held = HeldClaim(latest.epoch, latest.claim)
            self._record(held)
        if latest is None and held.epoch is None:
            return self.claim(log_start_offset=log_start_offset)
        if latest is None or not held.owns(latest):
            raise RemoteLogFencedError(self.log.topic, self.log.partition, held.epoch, latest.epoch if latest else 0)
        return latest

    def change(self, edit: Callable[[RemoteLogManifest], RemoteLogManifest], *,
               log_start_offset: int) -> RemoteLogManifest:
        """Publish ``edit(current manifest)`` as the next version; raises RemoteLogFencedError if another
        writer's epoch took over, before or during the change."""
        while True:
            current = self.current(log_start_offset=log_start_offset)
            changed = replace(edit(current), version=current.version + 1, epoch=current.epoch, claim=current.claim,
                              published_ms=self.clock())
            changed.check(self.log.objects.url(self.log.manifest_key(changed.version)))
            if self.log.publish(changed):
                return changed


def may_still_publish(first_write_ms: int, now_ms: int, unpublished_grace_ms: int) -> bool:
    """Whether objects written from ``first_write_ms`` on, named by no manifest yet, are safe to publish at
    ``now_ms``: no sweep may have deleted them (PUBLISH_WITHIN_SHARE)."""
    return now_ms - first_write_ms <= unpublished_grace_ms * PUBLISH_WITHIN_SHARE


def change_unowned(log: RemoteLog, edit: Callable[[RemoteLogManifest], RemoteLogManifest],
                   clock: Callable[[], int]) -> RemoteLogManifest:
    """Publish ``edit(the remote log now)`` as its next version, for a writer of the remote tier alone: such logs
    keep epoch 0 (a log not yet started begins empty at offset 0), and writers race only through the create-once
    publish, re-reading and re-editing when another version won. An edit that returns the manifest it was given
    changes nothing: nothing is published and that manifest is returned. Raises RemoteLogOwnedError once a data
    folder claimed the log (epoch 1 and up): its appends would no longer continue the folder's."""
    while True:
        latest = log.latest() or RemoteLogManifest(0, 0, 0, (), clock())
        if latest.epoch:
            raise RemoteLogOwnedError(log.topic, log.partition, latest.epoch)
        edited = edit(latest)
        if edited is latest:
            return latest
        changed = replace(edited, version=latest.version + 1, epoch=0, published_ms=clock())
        changed.check(log.objects.url(log.manifest_key(changed.version)))
        if log.publish(changed):
            return changed
