"""Validate one video and record its media facts. Runs inside the sandboxed worker.

Counting is from packets (container frame counts lie); for MP4/MOV the sample table
(``index_entries``) gives packet sizes and positions without reading media data. Exactly one
frame is decoded (the first), to prove the decoder can produce a picture and to read the display
rotation; everything else is demux-level.

A still image (``media_type: image`` in the spec) is sniffed and its header size checked first
(``vidassets.media.image``); it is one frame with no duration, frame rate or audio.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from vidassets.media import image
from vidassets.media.source import image_head, open_container

VERSION = "probe-v1"

MP4_FAMILY = {"mov", "mp4", "m4a", "3gp", "3g2", "mj2"}


def _fps(rate: Fraction | None) -> float | None:
    return float(rate) if rate else None


def _source_size(spec: Mapping[str, Any]) -> int:
    return int(spec["size"]) if spec.get("offset") is not None else os.stat(spec["path"]).st_size


def _quarantine(facts: dict, reason: str, retryable: bool = False) -> dict:
    return {**facts, "status": "quarantined", "reason": reason, "retryable": retryable}


def probe_source(spec: Mapping[str, Any], limits: Mapping[str, Any], safe_mode: bool = False) -> dict[str, Any]:
    """Facts and a verdict (status ok / salvaged / quarantined + reason) for one source."""
    facts: dict[str, Any] = {"safe_mode": safe_mode, "frames_decoded": 0}
    mode = os.stat(spec["path"]).st_mode
    if not stat.S_ISREG(mode):
        return _quarantine(facts, "not a regular file (FIFO, device or socket); refused before opening")
    size = _source_size(spec)
    if size == 0:
        return _quarantine(facts, "empty file (0 bytes)")
    still = image.is_image(spec)
    facts["media_type"] = "image" if still else "video"
    head = image_head(spec)
    refused = _image_refusal(head, limits) if still else (
        f"the bytes are a {kind.upper()} image, the name says video; refused (name it as an image or add its "
        "extension to ingest.image_extensions)" if (kind := image.sniff(head)) else None)
    if refused:
        return _quarantine(facts, refused)
    try:
        container = open_container(spec)
    except Exception as exc:  # noqa: BLE001
        return _quarantine(facts, f"not a readable video container: {_short(exc)}")
    with container:
        facts["container"] = container.format.name
        facts["bitrate"] = int(container.bit_rate or 0) or None
        audio = container.streams.audio
        facts["has_audio"] = bool(audio)
        facts["audio_codec"] = audio[0].codec_context.name if audio else None
        if not container.streams.video:
            return _quarantine(facts, "no video stream")
        vs = container.streams.video[0]
        cc = vs.codec_context
        facts.update(
            codec=cc.name,
            profile=cc.profile or None,
            pix_fmt=cc.pix_fmt,
            width=int(cc.width or 0),
            height=int(cc.height or 0),
            fps_avg=_fps(vs.average_rate),
            fps_base=_fps(vs.base_rate),
            time_base=str(vs.time_base) if vs.time_base else None,
            declared_frames=int(vs.frames or 0),
        )
        if facts["width"] <= 0 or facts["height"] <= 0:
            return _quarantine(facts, "video stream has no frame size")
        if max(facts["width"], facts["height"]) > limits["max_side"]:
            return _quarantine(facts, f"frame size {facts['width']}x{facts['height']} above the limit of {limits['max_side']} px; refused before decoding")
        if min(facts["width"], facts["height"]) < limits["min_side"]:
            return _quarantine(facts, f"frame size {facts['width']}x{facts['height']} below the minimum of {limits['min_side']} px")
        packets = _count_packets(container, vs, size)
        facts.update({k: v for k, v in packets.items() if k != "pts"})
        counted = packets["counted_frames"]
        if counted == 0:
            return _quarantine(facts, "no video packets" + (f" ({packets['demux_error']})" if packets["demux_error"] else ""))
        pixel_frames = facts["width"] * facts["height"] * counted
        if pixel_frames > limits["max_pixel_frames"]:
            return _quarantine(facts, f"width x height x frames = {pixel_frames:.3g} above the limit {limits['max_pixel_frames']:.3g}; refused before decoding")
        _timing(facts, packets["pts"], vs.time_base)
    first = _decode_first_frame(spec, safe_mode)
    facts["frames_decoded"] = first["frames_decoded"]
    if first["error"]:
        return _quarantine(facts, f"decoder produced no picture: {first['error']}", retryable=True)
    facts["rotation"] = first["rotation"]
    facts["display_width"], facts["display_height"] = (
        (facts["height"], facts["width"]) if first["rotation"] in (90, 270) else (facts["width"], facts["height"])
    )
    if still:
        return {**facts, "status": "ok", "reason": None, "retryable": False, "duration_s": None, "fps_avg": None,
                "fps_base": None, "vfr": False, "has_audio": False, "audio_codec": None}
    if counted < limits["min_frames"]:
        return _quarantine(facts, f"too short: {counted} frame(s), minimum {limits['min_frames']}")
    if packets["truncated"]:
        duration = facts.get("duration_s") or 0.0
        if duration >= limits["min_salvage_seconds"]:
            return {**facts, "status": "salvaged", "retryable": False,
                    "reason": f"truncated ({packets['truncated']}); clean prefix of {counted} frames / {duration:.2f} s kept"}
        return _quarantine(facts, f"truncated ({packets['truncated']}); clean prefix {duration:.2f} s is below {limits['min_salvage_seconds']} s")
    return {**facts, "status": "ok", "reason": None, "retryable": False}


def _image_refusal(head: bytes, limits: Mapping[str, Any]) -> str | None:
    """Why an image (its first bytes: ``head``) is refused before FFmpeg opens it, which decodes it; or None."""
    kind = image.sniff(head)
    if kind is None:
        return "not a JPEG, PNG or WebP image (its first bytes carry no image signature)"
    size = image.header_size(head)
    if size is None:
        return f"{kind.upper()} header gives no image size in its first {image.HEADER_BYTES} bytes; refused before decoding"
    width, height = size
    if max(width, height) > limits["max_side"]:
        return f"image size {width}x{height} above the limit of {limits['max_side']} px; refused before decoding"
    if width * height > limits["max_image_pixels"]:
        return (f"image size {width}x{height} = {width * height / 1e6:.1f} MP above the limit of "
                f"{limits['max_image_pixels'] / 1e6:.1f} MP; refused before decoding")
    return None


def _count_packets(container, vs, size: int) -> dict[str, Any]:
    """Video packets (size > 0) that lie wholly inside the file; stops at the first that does not."""
    pts: list[int] = []
    keyframes = 0
    truncated = None
    demux_error = None
    if container.format.name.split(",")[0] in MP4_FAMILY or set(container.format.name.split(",")) & MP4_FAMILY:
        entries = vs.index_entries
        if entries is not None and len(entries) > 0:
            for entry in entries:
                if entry.is_discard or entry.size <= 0:
                    continue
                if entry.pos + entry.size > size:
                    truncated = f"sample table points past the end of the file at sample {len(pts)}"
                    break
                pts.append(entry.timestamp)
                keyframes += bool(entry.is_keyframe)
            return {"counted_frames": len(pts), "keyframes": keyframes, "truncated": truncated,
                    "demux_error": None, "pts": pts, "count_method": "sample_table"}
    try:
        for packet in container.demux(vs):
            if packet.size <= 0:
                continue
            if packet.pos is not None and packet.pos >= 0 and packet.pos + packet.size > size:
                truncated = f"packet {len(pts)} extends past the end of the file"
                break
            pts.append(packet.pts if packet.pts is not None else (packet.dts if packet.dts is not None else len(pts)))
            keyframes += bool(packet.is_keyframe)
    except Exception as exc:  # noqa: BLE001 - a demux error ends the clean prefix
        demux_error = _short(exc)
        truncated = f"demux error after {len(pts)} packets: {demux_error}"
    return {"counted_frames": len(pts), "keyframes": keyframes, "truncated": truncated,
            "demux_error": demux_error, "pts": pts, "count_method": "demux"}


def _timing(facts: dict, pts: list[int], time_base) -> None:
    if not pts or not time_base:
        facts.update(duration_s=None, vfr=False)
        return
    tb = float(time_base)
    ordered = sorted(pts)
    deltas = [b - a for a, b in zip(ordered, ordered[1:], strict=False) if b > a]
    fps = facts.get("fps_avg") or facts.get("fps_base")
    frame_s = (sum(deltas) / len(deltas) * tb) if deltas else (1 / fps if fps else 0.0)
    facts["duration_s"] = round((ordered[-1] - ordered[0]) * tb + frame_s, 6)
    if len(deltas) >= 2:
        lo, hi = min(deltas), max(deltas)
        facts["vfr"] = bool(hi > lo * 1.5 and hi - lo > 1)
    else:
        facts["vfr"] = False
    if not facts.get("fps_avg") and facts["duration_s"]:
        facts["fps_avg"] = len(pts) / facts["duration_s"]


def _decode_first_frame(spec: Mapping[str, Any], safe_mode: bool) -> dict[str, Any]:
    try:
        container = open_container(spec)
    except Exception as exc:  # noqa: BLE001
        return {"frames_decoded": 0, "rotation": 0, "error": _short(exc)}
    with container:
        return _first_frame(container, safe_mode)


def _first_frame(container, safe_mode: bool) -> dict[str, Any]:
    vs = container.streams.video[0]
    if safe_mode:
        vs.codec_context.thread_count = 1
        vs.codec_context.thread_type = "SLICE"
    decoded = 0
    error = None
    try:
        for packet in container.demux(vs):
            try:
                frames = packet.decode()
            except Exception as exc:  # noqa: BLE001 - try the next packet; report if none decodes
                error = _short(exc)
                continue
            for frame in frames:
                decoded += 1
                rotation = int(round(-(frame.rotation or 0))) % 360 if _finite(frame.rotation) else 0
                return {"frames_decoded": decoded, "rotation": rotation, "error": None}
            if packet.size == 0:
                break
    except Exception as exc:  # noqa: BLE001
        error = _short(exc)
    return {"frames_decoded": decoded, "rotation": 0, "error": error or "no frame decoded"}


def _finite(value: Any) -> bool:
    try:
        return value is not None and math.isfinite(float(value)) and abs(float(value)) <= 360
    except (TypeError, ValueError):
        return False


def _short(exc: BaseException) -> str:
    text = str(exc).replace("\n", " ")
    return f"{exc.__class__.__name__}: {text[:300]}"
