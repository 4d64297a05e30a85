"""Object stores: one interface over a local directory and an S3 prefix.

Everything vidassets reads or writes goes through an :class:`ObjectStore`. Keys are relative,
``/``-separated paths below the store's root URI. Writes are atomic: a reader sees the old object
or the new one, never a torn one (temp file + ``os.replace`` locally, a single PUT on S3).

The input bucket is wrapped in :class:`ReadOnlyBucket`, which exposes no way to write.
"""

from __future__ import annotations

import os
import stat
import tempfile
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

CHUNK = 1 << 20


@dataclass(frozen=True)
class ObjectInfo:
    """One listed object. ``refusal`` is set when the object must not be read (and says why)."""

    key: str
    size: int
    version: str  # cheap identity of the bytes: mtime_ns:size locally, the ETag on S3
    refusal: str | None = None
    mtime: float = 0.0  # seconds since the epoch (LastModified on S3)


class ObjectStore(Protocol):
    uri: str

    def uri_for(self, key: str) -> str: ...
    def local_path(self, key: str) -> str | None: ...
    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]: ...
    def list_dirs(self, prefix: str = "") -> list[str]: ...
    def open_read(self, key: str) -> BinaryIO: ...
    def read_range(self, key: str, start: int, length: int) -> bytes: ...
    def get_bytes(self, key: str) -> bytes: ...
    def exists(self, key: str) -> bool: ...
    def version(self, key: str) -> str | None: ...
    def put_bytes(self, key: str, data: bytes) -> None: ...
    def put_if_absent(self, key: str, data: bytes) -> bool: ...
    def delete(self, key: str) -> None: ...


def _clean_key(key: str) -> str:
    parts = [p for p in key.replace("\\", "/").split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise ValueError(f"object key may not contain '..': {key!r}")
    return "/".join(parts)


class LocalObjectStore:
    """A directory on a local (or mounted) file system."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root).expanduser().absolute()
        self.uri = self.root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root / _clean_key(key)

    def uri_for(self, key: str) -> str:
        return self._path(key).as_uri()

    def local_path(self, key: str) -> str | None:
        """A path a decoder can open directly (after the same safety checks as ``open_read``)."""
        with self.open_read(key):
            pass
        return str(self._path(key))

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        """Every object below ``prefix``, sorted by key (with ``start_after``: only keys after it,
        never stat'ed). Symlinks are never followed out of the root; FIFOs, sockets and devices are
        listed with a refusal instead of being opened."""
        base = self._path(prefix)
        if not base.is_dir():
            return
        real_root = os.path.realpath(self.root)
        found: list[tuple[str, str]] = []
        for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
            rel_dir = os.path.relpath(dirpath, self.root)
            for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                if name.startswith(".") and name.endswith(".tmp"):
                    continue  # an atomic write in progress
                key = name if rel_dir == "." else f"{rel_dir}/{name}".replace(os.sep, "/")
                if start_after is not None and key <= start_after:
                    continue
                found.append((key, os.path.join(dirpath, name)))
        for key, full in sorted(found):  # same order as an S3 listing
            if not _utf8(key):
                yield ObjectInfo(printable_name(key), 0, "", "file name is not valid UTF-8; refused")
                continue
            yield self._info(key, full, real_root)

    def _info(self, key: str, full: str, real_root: str) -> ObjectInfo:
        try:
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                target = os.path.realpath(full)
                if os.path.commonpath([target, real_root]) != real_root:
                    return ObjectInfo(key, 0, "", "symlink points outside the bucket; not followed")
                st = os.stat(full)
                if stat.S_ISDIR(st.st_mode):
                    return ObjectInfo(key, 0, "", "symlinked directory; not followed")
            if not stat.S_ISREG(st.st_mode):
                return ObjectInfo(key, 0, "", f"not a regular file ({_file_type(st.st_mode)})")
            return ObjectInfo(key, st.st_size, f"{st.st_mtime_ns}:{st.st_size}", None, st.st_mtime)
        except OSError as exc:
            return ObjectInfo(key, 0, "", f"cannot stat: {exc.strerror or exc}")

    def list_dirs(self, prefix: str = "") -> list[str]:
        base = self._path(prefix)
        if not base.is_dir():
            return []
        return sorted(e.name for e in os.scandir(base) if e.is_dir(follow_symlinks=False))

    def open_read(self, key: str) -> BinaryIO:
        path = self._path(key)
        # O_NONBLOCK so that a FIFO swapped in after listing cannot block us at open().
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise OSError(f"not a regular file ({_file_type(mode)}): {key}")
            real = os.path.realpath(path)
            real_root = os.path.realpath(self.root)
            if os.path.commonpath([real, real_root]) != real_root:
                raise OSError(f"symlink points outside the store: {key}")
            os.set_blocking(fd, True)
            return os.fdopen(fd, "rb", buffering=0)
        except BaseException:
            os.close(fd)
            raise

    def read_range(self, key: str, start: int, length: int) -> bytes:
        with self.open_read(key) as f:
            f.seek(start)
            return f.read(length)

    def get_bytes(self, key: str) -> bytes:
        with self.open_read(key) as f:
            return f.read()

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def version(self, key: str) -> str | None:
        """Cheap identity of the object's current bytes (None if absent)."""
        try:
            st = self._path(key).stat()
        except FileNotFoundError:
            return None
        return f"{st.st_mtime_ns}:{st.st_size}"

    def put_bytes(self, key: str, data: bytes) -> None:
        self.put_with(key, lambda f: f.write(data))

    def put_with(self, key: str, write: Callable[[BinaryIO], Any]) -> None:
        """Write through ``write(file)`` into a temp file beside the target, then rename it in
        place. If ``write`` raises, the temp file is removed and the target is untouched."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create ``key`` only if nothing is there yet; returns whether this call created it."""
        path = self._path(key)
        if path.exists():
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.link(tmp, path)  # atomic create-if-absent, never overwrites
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            pass


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def printable_name(name: str) -> str:
    """A name that can be stored as text: undecodable bytes shown as \\xNN escapes."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _file_type(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "fifo"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISDIR, "directory"),
    ):
        if test(mode):
            return name
    return "special file"


class S3ObjectStore:
    """An ``s3://bucket/prefix`` location, through a boto3 client."""

    def __init__(self, client: Any, bucket: str, prefix: str = ""):
        self.client = client
        self.bucket = bucket
        self.prefix = _clean_key(prefix)
        self.uri = f"s3://{bucket}/{self.prefix}".rstrip("/")

    def _key(self, key: str) -> str:
        key = _clean_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def __reduce__(self):
        """Sent to another process (a Ray worker): the location and endpoint travel, the client is
        built there from that process's own credential chain (credentials never travel)."""
        return (_s3_store_at, (self.client.meta.endpoint_url, self.bucket, self.prefix))

    def uri_for(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"

    def local_path(self, key: str) -> str | None:
        return None  # objects must be fetched first

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        full = self._key(prefix)
        full = f"{full}/" if full else ""
        cut = len(self.prefix) + 1 if self.prefix else 0
        after = {"StartAfter": self._key(start_after)} if start_after is not None else {}
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full, **after)
        for page in pages:
            for obj in page.get("Contents", []):
                if obj["Key"].endswith("/"):
                    continue  # "directory" placeholder objects
                yield ObjectInfo(
                    obj["Key"][cut:], int(obj["Size"]), obj["ETag"].strip('"'), None,
                    obj["LastModified"].timestamp(),
                )

    def list_dirs(self, prefix: str = "") -> list[str]:
        full = self._key(prefix)
        full = f"{full}/" if full else ""
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=full, Delimiter="/"
        )
        names = []
        for page in pages:
            for cp in page.get("CommonPrefixes", []):
                names.append(cp["Prefix"][len(full) :].rstrip("/"))
        return sorted(names)

    def open_read(self, key: str) -> BinaryIO:
        return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]

    def read_range(self, key: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        rng = f"bytes={start}-{start + length - 1}"
        return self.client.get_object(Bucket=self.bucket, Key=self._key(key), Range=rng)["Body"].read()

    def get_bytes(self, key: str) -> bytes:
        return self.open_read(key).read()

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    def version(self, key: str) -> str | None:
        from botocore.exceptions import ClientError

        try:
            return self.client.head_object(Bucket=self.bucket, Key=self._key(key))["ETag"].strip('"')
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise

    def put_bytes(self, key: str, data: bytes) -> None:
        # A single PUT is atomic on S3: readers see the old object or the whole new one.
        self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*")
            return True
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                return False
            raise

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))


def _s3_store_at(endpoint_url: str | None, bucket: str, prefix: str) -> S3ObjectStore:
    return S3ObjectStore(s3_client(endpoint_url), bucket, prefix)


def s3_client(endpoint_url: str | None = None, region_name: str | None = None) -> Any:
    """A boto3 S3 client. ``endpoint_url`` defaults to ``$VIDASSETS_S3_ENDPOINT_URL`` (then AWS).

    A session of its own: credentials are resolved from the environment now, not from the first
    client boto3's default session ever built in this process (it caches them)."""
    import boto3

    from vidassets.config import aws_region, s3_endpoint_url

    return boto3.session.Session().client("s3", endpoint_url=endpoint_url or s3_endpoint_url(), region_name=region_name or aws_region())


def open_object_store(uri: str, client_factory: Callable[[], Any] | None = None) -> ObjectStore:
    """``file:///abs/dir``, a plain path, or ``s3://bucket/prefix``."""
    if not uri:
        raise ValueError("empty storage URI")
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"S3 URI needs a bucket name: {uri!r}")
        client = (client_factory or s3_client)()
        return S3ObjectStore(client, parsed.netloc, parsed.path.lstrip("/"))
    if parsed.scheme == "file":
        return LocalObjectStore(urllib.parse.unquote(parsed.path))
    if parsed.scheme == "":
        return LocalObjectStore(uri)
    raise ValueError(f"unsupported storage URI scheme {parsed.scheme!r} in {uri!r} (use a path, file:// or s3://)")


class ReadOnlyBucket:
    """The input bucket. Exposes reads only: vidassets never writes, moves or re-encodes raw objects."""

    def __init__(self, objects: ObjectStore):
        self._objects = objects
        self.uri = objects.uri

    def uri_for(self, key: str) -> str:
        return self._objects.uri_for(key)

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        return self._objects.list(prefix, start_after)

    def local_path(self, key: str) -> str | None:
        return self._objects.local_path(key)

    def list_dirs(self, prefix: str = "") -> list[str]:
        return self._objects.list_dirs(prefix)

    def open_read(self, key: str) -> BinaryIO:
        return self._objects.open_read(key)

    def read_range(self, key: str, start: int, length: int) -> bytes:
        return self._objects.read_range(key, start, length)

    def get_bytes(self, key: str) -> bytes:
        return self._objects.get_bytes(key)

    def exists(self, key: str) -> bool:
        return self._objects.exists(key)


def read_uri(uri: str) -> bytes:
    """The bytes of one file named by a local path, ``file://`` or ``s3://bucket/key`` URI (S3 through
    the default credential chain)."""
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme == "":
        return Path(uri).read_bytes()
    parent, _, name = uri.rstrip("/").rpartition("/")
    store = open_object_store(parent if parsed.scheme != "s3" or parent.count("/") > 2 else parent + "/")
    if not store.exists(name):
        raise FileNotFoundError(uri)
    return store.get_bytes(name)
