"""Where a decoder reads an asset's bytes from, and how it opens them safely.

A *source spec* is a plain dict that crosses into the sandboxed worker: ``{"path", "offset",
"size"}``. ``offset``/``size`` address a member inside an uncompressed tar (one ranged read, no
extraction). Objects that are not on a local file system (S3) or sit in a compressed tar are
spooled once to a scratch file by the parent, which holds the credentials; the worker never does.

A spec whose ``media_type`` is ``image`` is opened only by the single-image demuxer of the format
its bytes carry (``vidassets.media.image``); a video spec never reaches an image demuxer.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO

from vidassets.media import image
from vidassets.storage.objects import CHUNK, ReadOnlyBucket

# Containers a decoder may open: nothing that can reference other files or URLs
# (no concat/ffconcat, HLS/DASH playlists, image2 patterns, …).
FORMAT_WHITELIST = "mov,mp4,m4a,3gp,3g2,mj2,matroska,webm,mpegts,avi,mpeg,mpegvideo,flv,asf,mxf,ivf,h264,hevc,yuv4mpegpipe,gif,ogg,rawvideo"
# The second wall: whatever a demuxer tries to open (a playlist entry, a MOV data reference), FFmpeg
# may only use the local-file protocol: no http(s), tcp, udp, rtmp, crypto, data, concat, subfile, …
PROTOCOL_WHITELIST = "file"
# Demuxer switches that would follow references to other files stay off explicitly.
DEMUXER_OPTIONS = {"enable_drefs": "0", "use_absolute_path": "0"}


class RangeFile(io.RawIOBase):
    """A read-only, seekable window [offset, offset+size) of a file: a tar member in place."""

    def __init__(self, path: str, offset: int, size: int):
        super().__init__()
        self._f = open(path, "rb", buffering=0)  # noqa: SIM115 - closed in close()
        self._offset, self._size, self._pos = offset, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self._size - self._pos)
        if n <= 0:
            return 0
        self._f.seek(self._offset + self._pos)
        got = self._f.readinto(memoryview(buffer)[:n])
        self._pos += got or 0
        return got or 0

    def seek(self, pos: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, min(self._size, base + pos))
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        self._f.close()
        super().close()


def open_source(spec: Mapping[str, Any]) -> BinaryIO | str:
    """What ``av.open`` gets: a path for a whole regular file, a RangeFile for a tar member.
    Non-regular files are refused before any open that could block (FIFOs, devices)."""
    path = spec["path"]
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise OSError(f"not a regular file: {path}")
    if spec.get("offset") is None:
        return path
    return RangeFile(path, int(spec["offset"]), int(spec["size"]))


def image_head(spec: Mapping[str, Any]) -> bytes:
    """The first bytes of a source (enough for ``image.sniff`` and ``image.header_size``)."""
    source = open_source(spec)
    if isinstance(source, str):
        with open(source, "rb") as f:
            return image.read_head(f)
    try:
        return image.read_head(source)
    finally:
        source.close()


def open_container(spec: Mapping[str, Any]):
    import av

    if image.is_image(spec):
        kind = image.sniff(image_head(spec))
        if kind is None:
            raise ValueError("not a JPEG, PNG or WebP image (its first bytes carry no image signature)")
        demuxer = image.FORMATS[kind]
        options = {"format_whitelist": demuxer, "protocol_whitelist": PROTOCOL_WHITELIST}
        return av.open(open_source(spec), format=demuxer, options=options, metadata_errors="ignore")
    options = {"format_whitelist": FORMAT_WHITELIST, "protocol_whitelist": PROTOCOL_WHITELIST, **DEMUXER_OPTIONS}
    return av.open(open_source(spec), options=options, metadata_errors="ignore")


@contextlib.contextmanager
def source_spec(bucket: ReadOnlyBucket, row: Mapping[str, Any], scratch_dir: str | None = None) -> Iterator[dict]:
    """A source spec for one inventory row, spooling to a scratch file only when needed."""
    key, member = row["key"], row.get("member")
    local = bucket.local_path(key)
    offset = row.get("member_offset")
    media_type = row.get("media_type") or "video"
    if local is not None and (member is None or offset is not None):
        yield {"path": local, "offset": None if member is None else int(offset),
               "size": None if member is None else int(row["size"]), "media_type": media_type}
        return
    fd, tmp = tempfile.mkstemp(prefix="vidassets-src-", suffix=os.path.splitext(member or key)[1][:8], dir=scratch_dir)
    try:
        with os.fdopen(fd, "wb") as out:
            if member is None:
                with bucket.open_read(key) as stream:
                    shutil.copyfileobj(stream, out, CHUNK)
            elif offset is not None:  # uncompressed tar member on S3: one ranged GET
                out.write(bucket.read_range(key, int(offset), int(row["size"])))
            else:
                _extract_member(bucket, key, member, out)
        yield {"path": tmp, "offset": None, "size": None, "media_type": media_type}
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _extract_member(bucket: ReadOnlyBucket, key: str, member: str, out: BinaryIO) -> None:
    with bucket.open_read(key) as stream, tarfile.open(fileobj=stream, mode="r|*") as tar:
        for info in tar:
            if info.name == member and info.isfile():
                extracted = tar.extractfile(info)
                assert extracted is not None
                shutil.copyfileobj(extracted, out, CHUNK)
                return
    raise FileNotFoundError(f"member {member!r} not found in {key}")


@contextlib.contextmanager
def step_source(step, bucket: ReadOnlyBucket, video: Mapping[str, Any]) -> Iterator[dict]:
    """The video's source spec for a step's sandbox (spooled into the step's scratch directory where
    needed); a source that cannot be read is a transient failure of the step's item."""
    from vidassets.runtime.engine import Failure

    try:
        with source_spec(bucket, video, step.scratch) as spec:
            yield spec
    except OSError as exc:  # the object vanished or cannot be fetched: try again on a later run
        raise Failure(f"cannot read source: {exc}", transient=True) from exc
