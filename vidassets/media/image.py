"""Still images (JPEG, PNG, WebP) as 1-frame sources.

An image is opened by FFmpeg's single-image demuxer for the format its *bytes* carry (never the
extension's, never the ``image2`` demuxer, which can expand a file name into a sequence of other
files). Its size is read from the header here, before FFmpeg sees it: ``av.open`` decodes the
first frame to fill in the stream parameters, so a decompression bomb has to be refused before
the open, not after.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any, BinaryIO

FORMATS = {"jpeg": "jpeg_pipe", "png": "png_pipe", "webp": "webp_pipe"}
"""Image format -> the FFmpeg demuxer that reads exactly one such image from a byte stream."""
HEADER_BYTES = 64 * 1024
"""Enough of the file to find the size of any JPEG whose frame header follows ordinary metadata
(EXIF thumbnails, ICC profiles larger than this are rare; such a file reports no size)."""


def is_image(row: Mapping[str, Any]) -> bool:
    """Whether a row (inventory, source spec, probe, analysis or clip row) is a still image: a
    1-frame sample. Rows without ``media_type`` (written before images existed) are videos."""
    return row.get("media_type") == "image"


def sniff(head: bytes) -> str | None:
    """The image format the first bytes announce ("jpeg", "png", "webp"), or None."""
    if head[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if head[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    return None


def header_size(head: bytes) -> tuple[int, int] | None:
    """(width, height) from the image header, without decoding; None when not found."""
    kind = sniff(head)
    if kind == "png" and len(head) >= 24 and head[12:16] == b"IHDR":
        return struct.unpack(">II", head[16:24])
    if kind == "webp":
        return _webp_size(head)
    if kind == "jpeg":
        return _jpeg_size(head)
    return None


def _webp_size(head: bytes) -> tuple[int, int] | None:
    chunk = head[12:16]
    if chunk == b"VP8X" and len(head) >= 30:
        w = int.from_bytes(head[24:27], "little") + 1
        h = int.from_bytes(head[27:30], "little") + 1
        return w, h
    if chunk == b"VP8L" and len(head) >= 25 and head[20] == 0x2F:
        bits = int.from_bytes(head[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8 " and len(head) >= 30 and head[23:26] == b"\x9d\x01\x2a":
        w, h = struct.unpack("<HH", head[26:30])
        return w & 0x3FFF, h & 0x3FFF
    return None


_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _jpeg_size(head: bytes) -> tuple[int, int] | None:
    pos = 2
    while pos + 4 <= len(head):
        if head[pos] != 0xFF:
            return None
        marker = head[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # markers without a length
            pos += 2
            continue
        length = struct.unpack(">H", head[pos + 2 : pos + 4])[0]
        if marker in _SOF:
            if pos + 9 > len(head):
                return None
            h, w = struct.unpack(">HH", head[pos + 5 : pos + 9])
            return w, h
        if marker == 0xDA:  # start of scan before any frame header
            return None
        pos += 2 + length
    return None


def read_head(stream: BinaryIO) -> bytes:
    """The first ``HEADER_BYTES`` of a stream, which is left positioned at the start."""
    stream.seek(0)
    head = stream.read(HEADER_BYTES)
    stream.seek(0)
    return head
