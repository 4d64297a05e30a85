"""Packet index and encode profile of one video: demux only, no pixel decode. Runs in the worker.

For every video packet: pts, dts, duration, byte position, size, keyframe flag, and where the
bitstream makes it cheap (a few header bytes per packet), the frame type and whether other frames
may reference it:

- H.264: ``nal_ref_idc`` (0 = non-reference) and ``slice_type`` from the first slice header;
- HEVC: the NAL unit type (IRAP = I; even types below 16 = sub-layer non-reference);
- MPEG-1/2: ``picture_coding_type`` (B pictures are never referenced);
- intra-only codecs (MJPEG, ProRes, …): every frame is I; others: keyframe flag only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from vidassets.media.source import open_container

VERSION = "packet-index-v1"

_INTRA_ONLY = {"mjpeg", "prores", "dnxhd", "ffv1", "huffyuv", "png", "rawvideo", "jpeg2000", "utvideo", "qtrle"}


def _ue(data: bytes, bitpos: int) -> tuple[int, int]:
    """Exp-Golomb unsigned value at bit ``bitpos``; returns (value, new bitpos)."""
    zeros = 0
    while True:
        byte = bitpos >> 3
        if byte >= len(data):
            raise ValueError("truncated exp-golomb")
        if (data[byte] >> (7 - (bitpos & 7))) & 1:
            break
        zeros += 1
        bitpos += 1
        if zeros > 31:
            raise ValueError("bad exp-golomb")
    bitpos += 1
    value = 0
    for _ in range(zeros):
        byte = bitpos >> 3
        if byte >= len(data):
            raise ValueError("truncated exp-golomb")
        value = (value << 1) | ((data[byte] >> (7 - (bitpos & 7))) & 1)
        bitpos += 1
    return (1 << zeros) - 1 + value, bitpos


def _nal_units(data: bytes, length_size: int | None):
    """NAL unit payloads of a packet: length-prefixed (MP4/MKV) or Annex-B start codes (TS, raw)."""
    if length_size:
        pos = 0
        while pos + length_size <= len(data):
            n = int.from_bytes(data[pos : pos + length_size], "big")
            pos += length_size
            if n <= 0 or pos + n > len(data):
                return
            yield data[pos : pos + n]
            pos += n
        return
    start = data.find(b"\x00\x00\x01")
    while start != -1:
        begin = start + 3
        nxt = data.find(b"\x00\x00\x01", begin)
        end = len(data) if nxt == -1 else nxt
        unit = data[begin:end].rstrip(b"\x00")
        if unit:
            yield unit
        start = nxt


def _h264(data: bytes, length_size: int | None) -> tuple[int, int]:
    for nal in _nal_units(data, length_size):
        nal_type = nal[0] & 0x1F
        if nal_type in (1, 5):
            ref = 1 if (nal[0] >> 5) & 3 else 0
            if nal_type == 5:
                return 1, 1
            try:
                payload = nal[1:16].replace(b"\x00\x00\x03", b"\x00\x00")
                _, pos = _ue(payload, 0)  # first_mb_in_slice
                slice_type, _ = _ue(payload, pos)
            except ValueError:
                return 0, ref
            return {0: 2, 1: 3, 2: 1, 3: 2, 4: 1}[slice_type % 5], ref
    return 0, -1


def _hevc(data: bytes, length_size: int | None) -> tuple[int, int]:
    for nal in _nal_units(data, length_size):
        nal_type = (nal[0] >> 1) & 0x3F
        if nal_type <= 31:  # VCL
            if 16 <= nal_type <= 23:
                return 1, 1
            ref = 0 if (nal_type <= 14 and nal_type % 2 == 0) else 1
            return 0, ref
    return 0, -1


def _mpeg12(data: bytes) -> tuple[int, int]:
    at = data.find(b"\x00\x00\x01\x00")
    if at == -1 or at + 6 > len(data):
        return 0, -1
    coding_type = (data[at + 5] >> 3) & 0x7
    kind = {1: 1, 2: 2, 3: 3}.get(coding_type, 0)
    return kind, (0 if kind == 3 else 1) if kind else -1


def _length_size(codec: str, extradata: bytes | None) -> int | None:
    if not extradata:
        return None
    if codec == "h264" and extradata[0] == 1 and len(extradata) > 4:
        return (extradata[4] & 3) + 1
    if codec == "hevc" and len(extradata) > 22 and extradata[0] == 1:
        return (extradata[21] & 3) + 1
    return None


def index_source(spec: Mapping[str, Any], max_packets: int = 5_000_000) -> dict[str, Any]:
    """The packet index (numpy arrays) and the encode profile of the first video stream."""
    with open_container(spec) as container:
        vs = container.streams.video[0]
        cc = vs.codec_context
        codec = cc.name
        length_size = _length_size(codec, bytes(cc.extradata) if cc.extradata else None)
        cols: dict[str, list] = {k: [] for k in ("pts", "dts", "duration", "pos", "size", "keyframe", "frame_type", "is_ref")}
        error = None
        try:
            for packet in container.demux(vs):
                if packet.size <= 0:
                    continue
                if len(cols["pts"]) >= max_packets:
                    error = f"stopped at {max_packets} packets"
                    break
                key = bool(packet.is_keyframe)
                if codec == "h264":
                    ftype, ref = _h264(bytes(packet), length_size)
                elif codec == "hevc":
                    ftype, ref = _hevc(bytes(packet), length_size)
                elif codec in ("mpeg2video", "mpeg1video"):
                    ftype, ref = _mpeg12(bytes(packet))
                elif codec in _INTRA_ONLY:
                    ftype, ref = 1, 1
                else:
                    ftype, ref = (1 if key else 0), (1 if key else -1)
                if ftype == 0 and key:
                    ftype = 1
                cols["pts"].append(packet.pts if packet.pts is not None else -1)
                cols["dts"].append(packet.dts if packet.dts is not None else -1)
                cols["duration"].append(packet.duration or 0)
                cols["pos"].append(packet.pos if packet.pos is not None else -1)
                cols["size"].append(packet.size)
                cols["keyframe"].append(key)
                cols["frame_type"].append(ftype)
                cols["is_ref"].append(ref)
        except Exception as exc:  # noqa: BLE001 - the clean prefix is still an index
            error = f"{exc.__class__.__name__}: {str(exc)[:200]}"
        arrays = {
            "pts": np.asarray(cols["pts"], dtype=np.int64),
            "dts": np.asarray(cols["dts"], dtype=np.int64),
            "duration": np.asarray(cols["duration"], dtype=np.int64),
            "pos": np.asarray(cols["pos"], dtype=np.int64),
            "size": np.asarray(cols["size"], dtype=np.int64),
            "keyframe": np.asarray(cols["keyframe"], dtype=np.bool_),
            "frame_type": np.asarray(cols["frame_type"], dtype=np.int8),
            "is_ref": np.asarray(cols["is_ref"], dtype=np.int8),
        }
        time_base = float(vs.time_base) if vs.time_base else None
        fps = float(vs.average_rate) if vs.average_rate else None
        profile = encode_profile(arrays, codec, int(cc.width or 0), int(cc.height or 0), fps, time_base)
        return {"arrays": arrays, "profile": profile, "codec": codec, "time_base": str(vs.time_base), "error": error}


def encode_profile(arrays: Mapping[str, np.ndarray], codec: str, width: int, height: int,
                   fps: float | None, time_base: float | None) -> dict[str, Any]:
    """GOP stats, frame-type shares, VFR and bits per pixel from the packet index alone."""
    n = len(arrays["size"])
    key_idx = np.flatnonzero(arrays["keyframe"])
    gops = np.diff(np.append(key_idx, n)) if len(key_idx) else np.array([n])
    known_type = arrays["frame_type"] > 0
    known_ref = arrays["is_ref"] >= 0
    types_known = bool(n) and bool(known_type.mean() >= 0.99)
    pts = np.sort(arrays["pts"][arrays["pts"] >= 0])
    deltas = np.diff(pts)
    deltas = deltas[deltas > 0]
    vfr = bool(len(deltas) >= 2 and deltas.max() > 1.5 * deltas.min() and deltas.max() - deltas.min() > 1)
    duration_s = None
    if time_base and len(pts):
        step = float(np.median(deltas)) if len(deltas) else 0.0
        duration_s = float((pts[-1] - pts[0] + step) * time_base)
    if (not fps) and duration_s:
        fps = n / duration_s
    total_bits = float(arrays["size"].sum()) * 8
    bpp = None
    if width and height and fps and duration_s:
        bpp = total_bits / duration_s / (width * height * fps)
    return {
        "packets": int(n),
        "keyframes": int(len(key_idx)),
        "gop_mean": float(gops.mean()) if len(gops) else None,
        "gop_max": int(gops.max()) if len(gops) else None,
        "keyframe_interval_s": float(gops.mean() / fps) if (fps and len(gops)) else None,
        # I frames are always known (keyframes at least); P/B shares only where the bitstream told us
        "i_share": float((arrays["frame_type"] == 1).sum() / n) if n else None,
        "p_share": float((arrays["frame_type"] == 2).sum() / n) if types_known else None,
        "b_share": float((arrays["frame_type"] == 3).sum() / n) if types_known else None,
        "frame_types_known": float(known_type.mean()) if n else 0.0,
        "nonref_share": float((arrays["is_ref"] == 0).sum() / max(known_ref.sum(), 1)) if known_ref.any() else None,
        "vfr": vfr,
        "duration_s": duration_s,
        "bitrate_bps": total_bits / duration_s if duration_s else None,
        "bits_per_pixel": bpp,
        "codec": codec,
    }


def nonref_between(packets: Any, first_pts: int, last_pts: int) -> list[int]:
    """pts of the non-reference frames a reader of [first_pts, last_pts] will demux (from the keyframe
    at or before first_pts), from a stored packet index (a DataFrame): skippable unless wanted."""
    if packets is None or not len(packets) or "is_ref" not in packets:
        return []
    keys = packets.loc[packets.keyframe.astype(bool) & (packets.pts <= first_pts), "pts"]
    start = int(keys.max()) if len(keys) else int(packets.pts.min())
    inside = packets[(packets.pts >= start) & (packets.pts <= last_pts) & (packets.is_ref == 0)]
    return [int(p) for p in inside.pts]
