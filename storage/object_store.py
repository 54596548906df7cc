"""The remote tier's objects under one URI: the only module that talks to object storage.

Bulk bytes (segments, indexes) go through ``pyarrow.fs``, which reads any URI pyarrow knows (``s3://``, ``gs://``,
``hdfs://``, ``file://``) and, for S3, takes the endpoint and credentials from the standard AWS variables
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``). What pyarrow lacks is a
conditional write, and publishing on a store without rename or locks needs one: ``create`` writes an object only
if its key is free, with S3's ``If-None-Match: *`` (through boto3, which reads the same variables) or, on a local
or mounted path, an exclusive hard link. Other schemes are readable; writing to them is refused, saying why.

Bulk objects are always written under fresh keys (a UUID per attempt), so a retry never overwrites bytes that a
reader may be reading; the small records that publish them are the only objects ``create`` decides.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import ParseResult, urlparse

import pyarrow as pa
import pyarrow.fs as pafs

from storage import faults
from storage.errors import LedgerviewError
from storage.fileio import fsync_file, fsync_folder, write_durably

WRITABLE_SCHEMES = ("s3", "file")
DEFAULT_TIMEOUT_S = 30.0
"""How long an S3 request may wait for a connection, or for the next bytes of an answer, before it fails (the
SDKs' defaults let one request of a remote that hangs wait about 100 s, with retries after)."""
S3_ATTEMPTS = 3
_TEMPORARY = re.compile(r"\..+\.[0-9a-f]{32}\.tmp")
"""The name of ``_local_create_once``'s temporary file: a dot, the object's name, a UUID, ``.tmp``."""
REFUSED_CREDENTIALS = ("ACCESS_DENIED", "AccessDenied", "INVALID_ACCESS_KEY_ID", "InvalidAccessKeyId",
                       "SIGNATURE_DOES_NOT_MATCH", "SignatureDoesNotMatch", "ExpiredToken", "EXPIRED_TOKEN")
"""What pyarrow's and boto3's errors say when S3 refuses a request's credentials (a HEAD's answer has no body,
so pyarrow's says only ACCESS_DENIED)."""


class RemoteStorageError(LedgerviewError):
    """The remote tier failed or refused a request; what is stored locally is untouched."""

    def __init__(self, url: str, action: str, reason: str) -> None:
        self.url, self.action, self.reason = url, action, reason
        super().__init__(f"Remote tier: could not {action} {url}: {reason}.")


class RemoteEndpointError(RemoteStorageError):
    """The S3 endpoint the environment names (AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL) is no URL: the tier's URI
    may be right."""


class RemoteObjectMissingError(RemoteStorageError):
    def __init__(self, url: str, action: str) -> None:
        super().__init__(url, action, "no such object (deleted by retention, or never uploaded)")


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    """Relative to the store's URI."""
    size: int
    modified_ms: int


class ObjectStore:
    """The objects under one remote URI, keyed by paths relative to it (``prices-0/segments/…``)."""

    def __init__(self, uri: str, filesystem: pafs.FileSystem, base: str,
                 create_once: Callable[[str, bytes], bool] | None) -> None:
        self.uri = uri.rstrip("/")
        self.filesystem = filesystem
        self._base = base.rstrip("/")
        self._create_once = create_once
        self._local = isinstance(filesystem, pafs.LocalFileSystem)
        self._root = self._base if self._local else (
            self._base.split("/", 1)[0] if isinstance(filesystem, pafs.S3FileSystem) else None)
        """The bucket of an S3 tier, the folder of a file:// one: checked when an object is missing."""
        self.requests = 0
        """Requests made so far (reads, lists, writes, deletes), for tests and status."""

    def url(self, key: str) -> str:
        return f"{self.uri}/{key}"

    def _path(self, key: str) -> str:
        return f"{self._base}/{key}"

    # -------------------------------------------------------------------------------------------------- reads
    def read(self, key: str) -> pa.Buffer:
        """The whole object, in one request."""
        with (self._naming_a_missing_root(), self._request(key, "read"),
              self.filesystem.open_input_file(self._path(key)) as source):
            return source.read_buffer()

    def read_range(self, key: str, position: int, length: int) -> pa.Buffer:
        """``length`` bytes from ``position`` (fewer at the object's end), in one ranged request."""
        with (self._naming_a_missing_root(), self._request(key, "read"),
              self.filesystem.open_input_file(self._path(key)) as source):
            return pa.py_buffer(source.read_at(length, position))

    @contextlib.contextmanager
    def _naming_a_missing_root(self) -> Iterator[None]:
        """An object missing because the tier's bucket (or, for a file:// tier, its folder) does not exist is
        that error instead: 'no such object' would send its reader looking for retention, and a reader of the
        tier alone would be told its topic is unknown. One more request, on that path only."""
        try:
            yield
        except RemoteObjectMissingError as missing:
            if self._root is None:
                raise
            self.requests += 1
            try:
                found = self.filesystem.get_file_info(self._root).type != pafs.FileType.NotFound
            except (OSError, pa.ArrowException):
                raise missing from None
            if found:
                raise
            where = (f"the tier's folder {self._root} does not exist (is the shared mount there?)" if self._local
                     else f"the bucket {self._root!r} does not exist at {_s3_endpoint_named()}")
            raise RemoteStorageError(missing.url, missing.action, where) from None

    def create_folder(self) -> None:
        """For a file:// tier, make its folder (and the folders above it): a data folder does so when it is first
        tiered there. Other tiers need nothing."""
        if self._local:
            self.filesystem.create_dir(self._base, recursive=True)

    def check_folder(self) -> None:
        """For a file:// tier, raise RemoteStorageError unless its folder exists: a tier a data folder remembers
        whose folder is gone is a mount that is not there, which would read as an empty tier and be written
        afresh on the local disk. Other tiers: nothing (a missing bucket is named by the request that meets it)."""
        if self._local and self.filesystem.get_file_info(self._base).type != pafs.FileType.Directory:
            raise RemoteStorageError(self.uri, "open", f"the tier's folder {self._base} does not exist (is the shared "
                                     "mount there?); this data folder was tiered there, so its remote segments are "
                                     "there. If the tier is new and empty, create the folder")

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object under ``prefix`` (recursively), sorted by key; none if the prefix does not exist."""
        selector = pafs.FileSelector(self._path(prefix), recursive=True, allow_not_found=True)
        with self._request(prefix, "list"):
            infos = self.filesystem.get_file_info(selector)
        start = len(self._base) + 1
        return sorted((ObjectInfo(info.path[start:], info.size or 0,
                                  int(info.mtime_ns // 1_000_000) if info.mtime_ns is not None else 0)
                       for info in infos if info.type == pafs.FileType.File), key=lambda info: info.key)

    # ------------------------------------------------------------------------------------------------- writes
    def upload(self, local: Path, key: str) -> None:
        """Copy a local file to ``key``, which must be fresh. On S3 the object appears whole or not at all; on a
        mount (file://) a crash may leave it partly written, but under a key that no manifest names yet, so no
        reader sees it and the sweep (``RemoteLog.remove_unreferenced``) deletes it."""
        self._check_writable(key)
        with self._request(key, "upload"):
            self._make_parent(key)
            pafs.copy_files(str(local), self._path(key), source_filesystem=pafs.LocalFileSystem(),
                            destination_filesystem=self.filesystem)
            if self._local:
                fsync_file(Path(self._path(key)))

    def create(self, key: str, data: bytes) -> bool:
        """Write ``data`` to ``key`` only if no object has that key; False if one has (someone else won). On S3,
        True also when the SDK's retry of the write is the one refused and the object holds ``data``: the first
        attempt made it and its answer was lost. A refused first attempt is always False, whatever the object
        holds."""
        self._check_writable(key)
        assert self._create_once is not None
        with self._request(key, "create"):
            self._make_parent(key)
            return self._create_once(self._path(key), data)

    def abandoned_temporaries(self, prefix: str, *, now_ms: int, grace_ms: int) -> tuple[str, ...]:
        """The temporary files under ``prefix`` that ``create`` on a file:// tier left when it was killed before its
        link, once their last-modified time is ``grace_ms`` old (a create in progress is younger), for the sweep
        to delete. Other tiers write none: no request is made."""
        if not self._local:
            return ()
        return tuple(info.key for info in self.list(prefix)
                     if _TEMPORARY.fullmatch(info.key.rsplit("/", 1)[-1]) and info.modified_ms + grace_ms <= now_ms)

    def delete(self, key: str) -> None:
        """Remove ``key``; an object already gone is not an error (deletes are retried after crashes)."""
        self._check_writable(key)
        try:
            with self._request(key, "delete"):
                self.filesystem.delete_file(self._path(key))
        except RemoteObjectMissingError:
            return

    def _make_parent(self, key: str) -> None:
        if self._local:
            self.filesystem.create_dir(self._path(key).rsplit("/", 1)[0], recursive=True)

    def _check_writable(self, key: str) -> None:
        if self._create_once is None:
            writable = ", ".join(f"{scheme}://" for scheme in WRITABLE_SCHEMES)
            raise RemoteStorageError(self.url(key), "write", f"ledgerview writes only to {writable} remote tiers, "
                                     "where it can publish by a conditional write; other pyarrow URIs are read-only")

    def _request(self, key: str, action: str) -> _Translated:
        self.requests += 1
        return _Translated(self.url(key), action)


class _Translated:
    """Turns pyarrow's and boto3's errors into RemoteStorageError, naming the object and the action."""

    def __init__(self, url: str, action: str) -> None:
        self.url, self.action = url, action

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: Any) -> None:
        if error is None or isinstance(error, LedgerviewError):
            return
        if isinstance(error, FileNotFoundError) or "NoSuchKey" in str(error) or "Path does not exist" in str(error):
            raise RemoteObjectMissingError(self.url, self.action) from error
        if isinstance(error, OSError | pa.ArrowException) or type(error).__module__.startswith("botocore"):
            reason = f"{type(error).__name__}: {str(error).rstrip('.')}"
            if type(error).__name__ == "NoCredentialsError" or any(mark in str(error) for mark in REFUSED_CREDENTIALS):
                reason += (" (the credentials were refused or missing: check AWS_ACCESS_KEY_ID and "
                           "AWS_SECRET_ACCESS_KEY, or the profile in use, and that they may use this bucket)")
            raise RemoteStorageError(self.url, self.action, reason) from error


def open_object_store(uri: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> ObjectStore:
    """The remote tier at ``uri``: ``s3://bucket/prefix``, ``file:///mount/prefix``, or any URI pyarrow reads.
    ``timeout_s`` bounds each S3 request's wait for a connection and for its answer's next bytes."""
    try:
        parsed = urlparse(uri)
    except ValueError as error:
        raise RemoteStorageError(uri, "open", f"it is not a URI ({error})") from None
    scheme = parsed.scheme
    if not scheme or (scheme == "s3" and not parsed.netloc):
        raise RemoteStorageError(uri, "open", "a remote tier is a URI such as s3://bucket/prefix or "
                                              "file:///shared/mount/prefix")
    create_once: Callable[[str, bytes], bool] | None = _local_create_once if scheme == "file" else None
    try:
        if scheme == "s3":
            filesystem, base = _s3_filesystem(uri, parsed, timeout_s)
            create_once = _s3_create_once(timeout_s)
        else:
            filesystem, base = pafs.FileSystem.from_uri(uri)
    except (pa.ArrowException, OSError, ValueError) as error:
        raise RemoteStorageError(uri, "open", str(error)) from error
    return ObjectStore(uri, filesystem, base, create_once)


def _s3_filesystem(uri: str, parsed: ParseResult, timeout_s: float) -> tuple[pafs.S3FileSystem, str]:
    """pyarrow's S3 client with time-outs, which its URI form cannot set; the endpoint, region and keys come from
    the AWS variables as boto3 reads them (the constructor, unlike from_uri, does not read the endpoint's). An
    endpoint that is not an http:// or https:// URL with a host is refused, naming its variable."""
    options: dict[str, Any] = {"connect_timeout": timeout_s, "request_timeout": timeout_s,
                               "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=S3_ATTEMPTS)}
    variable = next((name for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL") if os.environ.get(name)), None)
    if variable is not None:
        endpoint = os.environ[variable]
        try:
            where = urlparse(endpoint)
            valid = where.scheme in ("http", "https") and bool(where.hostname) and where.port != 0
        except ValueError:  # a port that is no number
            valid = False
        if not valid:
            raise RemoteEndpointError(uri, "open", f"its endpoint, {variable}={endpoint!r}, is not a URL such as "
                                                  "http://host:port or https://host")
        options.update(endpoint_override=where.netloc, scheme=where.scheme)
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        options["region"] = region
    return pafs.S3FileSystem(**options), f"{parsed.netloc}{parsed.path}".rstrip("/")


def _s3_endpoint_named() -> str:
    """Where S3 requests go, for errors: the endpoint variable that is set, or AWS's own endpoint."""
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        if os.environ.get(name):
            return f"{os.environ[name]} ({name}); check the URI's bucket and that variable"
    return "AWS's endpoint (AWS_ENDPOINT_URL is not set); check the URI's bucket"


def _s3_create_once(timeout_s: float) -> Callable[[str, bytes], bool]:
    import boto3  # only S3 tiers need it
    from botocore.config import Config
    from botocore.exceptions import ClientError

    client = boto3.client("s3", config=Config(connect_timeout=timeout_s, read_timeout=timeout_s,
                                              retries={"max_attempts": S3_ATTEMPTS, "mode": "standard"}))

    def create(path: str, data: bytes) -> bool:
        """A refusal of a retry may answer our own first attempt, which made the write but whose answer was lost
        (the SDK retries a request whose connection dropped): then the object holds ``data``, and the write is
        ours. A refusal of a first attempt is another writer's win, even of the same bytes (two claims made in
        the same millisecond from the same manifest are byte for byte equal, and only one may win)."""
        bucket, key = path.split("/", 1)
        try:
            client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") not in ("PreconditionFailed", "ConditionalRequestConflict"):
                raise
            if not error.response.get("ResponseMetadata", {}).get("RetryAttempts"):
                return False
            try:
                return bool(client.get_object(Bucket=bucket, Key=key)["Body"].read() == data)
            except ClientError as missing:  # another writer's conditional write still in progress
                if missing.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                    return False
                raise
        return True

    return create


def _local_create_once(path: str, data: bytes) -> bool:
    """Write a temporary file, fsync it, and hard-link it to ``path``: link(2) fails if ``path`` exists, so of
    several writers exactly one wins, and the winner's object is complete when it appears."""
    final = Path(path)
    temporary = final.with_name(f".{final.name}.{uuid.uuid4().hex}.tmp")
    write_durably(temporary, data, exclusive=True)
    faults.crash_point("remote.create.before_link")
    try:
        os.link(temporary, final)
    except FileExistsError:
        return False
    finally:
        temporary.unlink()
    fsync_folder(final.parent)
    return True
