"""Read exactly a clip's frames, using the frame pts saved by the analysis pass: seek to the
keyframe at or before the first frame, decode forward, keep frames by pts, stop after the last.
Also an exporter that writes a clip as its own file (stream copy when it starts on a keyframe,
else re-encode)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from vidassets.media.analysis import upright
from vidassets.media.source import open_container


def iter_clip_frames(
    spec: Mapping[str, Any],
    frame_pts: Sequence[int],
    first_frame: int,
    last_frame: int,
    rotation: int = 0,
    size: tuple[int, int] | None = None,
    fmt: str = "rgb24",
) -> Iterator[tuple[int, np.ndarray]]:
    """(frame_index, upright image) for every frame of [first_frame, last_frame]."""
    wanted = {int(frame_pts[i]): i for i in range(first_frame, last_frame + 1)}
    first_pts, last_pts = int(frame_pts[first_frame]), int(frame_pts[last_frame])
    for attempt in ("seek", "from_start"):
        with open_container(spec) as container:
            vs = container.streams.video[0]
            vs.codec_context.thread_type = "FRAME"
            if attempt == "seek" and first_frame > 0:
                container.seek(first_pts, stream=vs, backward=True, any_frame=False)
            seen_first = False
            emitted = 0
            for frame in container.decode(vs):
                pts = frame.pts
                if pts is None:
                    continue
                if not seen_first and pts > first_pts:
                    break  # the seek landed after the clip start: fall back to a full scan
                seen_first = True
                if pts in wanted:
                    kwargs = {"format": fmt}
                    if size:
                        kwargs.update(width=size[0], height=size[1])
                    yield wanted[pts], upright(frame.to_ndarray(**kwargs), rotation)
                    emitted += 1
                if pts >= last_pts:
                    return
            if seen_first:
                return
    raise ValueError(f"frames {first_frame}..{last_frame} not found in the source")


def read_clip_frames(spec: Mapping[str, Any], frame_pts: Sequence[int], first_frame: int, last_frame: int,
                     rotation: int = 0, size: Sequence[int] | None = None) -> dict[str, Any]:
    """Sandbox task form of ``iter_clip_frames``: all frames stacked (T, H, W, 3)."""
    frames = [img for _, img in iter_clip_frames(spec, frame_pts, first_frame, last_frame, rotation,
                                                  tuple(size) if size else None)]
    return {"frames": np.stack(frames) if frames else np.zeros((0, 0, 0, 3), np.uint8)}


def export_clip(spec: Mapping[str, Any], frame_pts: Sequence[int], keyframe_pts: Sequence[int],
                first_frame: int, last_frame: int, out_path: str, rotation: int = 0,
                crf: int = 20, preset: str = "veryfast") -> str:
    """Write a clip as its own MP4. Returns ``"stream_copy"`` or ``"reencode"``."""
    import av

    first_pts, last_pts = int(frame_pts[first_frame]), int(frame_pts[last_frame])
    if first_pts in set(int(p) for p in keyframe_pts):
        with open_container(spec) as src, av.open(out_path, "w") as dst:
            vs = src.streams.video[0]
            out = dst.add_stream_from_template(vs)
            src.seek(first_pts, stream=vs, backward=True, any_frame=False)
            for packet in src.demux(vs):
                if packet.dts is None or packet.pts is None:
                    continue
                if packet.pts > last_pts and packet.is_keyframe:
                    break
                if packet.pts < first_pts or packet.pts > last_pts:
                    continue
                packet.stream = out
                dst.mux(packet)
        return "stream_copy"
    fps = None
    with open_container(spec) as src:
        fps = src.streams.video[0].average_rate or 25
    with av.open(out_path, "w") as dst:
        stream = None
        for _, rgb in iter_clip_frames(spec, frame_pts, first_frame, last_frame, rotation):
            if stream is None:
                stream = dst.add_stream("libx264", rate=fps)
                stream.width, stream.height, stream.pix_fmt = rgb.shape[1] // 2 * 2, rgb.shape[0] // 2 * 2, "yuv420p"
                stream.options = {"crf": str(crf), "preset": preset}
            frame = av.VideoFrame.from_ndarray(rgb[: stream.height, : stream.width], format="rgb24")
            dst.mux(stream.encode(frame))
        if stream is not None:
            dst.mux(stream.encode(None))
    return "reencode"


def read_frames(spec: Mapping[str, Any], frame_pts: Sequence[int], indices: Sequence[int], rotation: int = 0,
                crop: Sequence[int] | None = None, size: Sequence[int] | None = None,
                nonref_pts: Sequence[int] = ()) -> dict[str, Any]:
    """Sandbox task: the frames at ``indices`` (sorted source frame indices), upright, cropped to
    ``crop`` = [x, y, w, h] (upright pixels) and resized to ``size`` = [w, h]. Seeks to the keyframe
    before the first index and decodes forward only to the last one; packets of non-reference frames
    (``nonref_pts``, from the packet index) that are not wanted are never decoded: no other frame
    refers to them, so skipping them is exact. Returns the frames and how many were decoded."""

    wanted = {int(frame_pts[i]): i for i in indices}
    skip = set(int(p) for p in nonref_pts) - set(wanted)
    first_pts, last_pts = int(frame_pts[indices[0]]), int(frame_pts[indices[-1]])
    out: dict[int, np.ndarray] = {}
    decoded = 0
    for attempt in ("seek", "from_start"):
        out.clear()
        with open_container(spec) as container:
            vs = container.streams.video[0]
            vs.codec_context.thread_type = "FRAME"
            if attempt == "seek" and indices[0] > 0:
                container.seek(first_pts, stream=vs, backward=True, any_frame=False)
            landed_late = False
            for frame in decode_skipping(container, vs, skip):
                decoded += 1
                if frame.pts is None:
                    continue
                if not out and frame.pts > first_pts:
                    landed_late = True  # the seek overshot the first frame: scan from the start instead
                    break
                if frame.pts in wanted:
                    out[wanted[frame.pts]] = crop_and_resize(upright(frame.to_ndarray(format="rgb24"), rotation),
                                                             crop, size)
                if frame.pts >= last_pts:
                    break
            if not landed_late and len(out) == len(wanted):
                return {"frames": np.stack([out[i] for i in indices]), "frames_decoded": decoded}
    missing = sorted(set(indices) - set(out))
    raise ValueError(f"{len(missing)} of {len(indices)} frames not found in the source (first: {missing[:5]})")


def read_sequential_frames(spec: Mapping[str, Any], indices: Sequence[int], crop: Sequence[int] | None = None,
                           size: Sequence[int] | None = None) -> dict[str, Any]:
    """Sandbox task: frames ``indices`` (0-based, in presentation order) of a short file written by
    vidassets itself (a ladder rung: upright, one clip, constant rate), cropped and resized like
    ``read_frames``. Decodes from the start and stops after the last wanted frame."""

    wanted = set(int(i) for i in indices)
    last = max(wanted)
    out: dict[int, np.ndarray] = {}
    decoded = 0
    with open_container(spec) as container:
        vs = container.streams.video[0]
        vs.codec_context.thread_type = "FRAME"
        for decoded, frame in enumerate(container.decode(vs), start=1):
            index = decoded - 1
            if index in wanted:
                out[index] = crop_and_resize(frame.to_ndarray(format="rgb24"), crop, size)
            if index >= last:
                break
    if len(out) != len(wanted):
        raise ValueError(f"{len(wanted) - len(out)} of {len(wanted)} frames not found (the file has {decoded})")
    return {"frames": np.stack([out[int(i)] for i in indices]), "frames_decoded": decoded}


def crop_and_resize(image: np.ndarray, crop: Sequence[int] | None, size: Sequence[int] | None) -> np.ndarray:
    """``image`` cut to ``crop`` = [x, y, w, h] and resized to ``size`` = [w, h] (area filter down, cubic up)."""
    import cv2

    if crop:
        x, y, w, h = (int(v) for v in crop)
        image = image[y : y + h, x : x + w]
    if size:
        interp = cv2.INTER_AREA if image.shape[1] > size[0] else cv2.INTER_CUBIC
        image = cv2.resize(image, (int(size[0]), int(size[1])), interpolation=interp)
    return image


def decode_skipping(container, stream, skip: set[int]):
    """Decode ``stream`` from the current position, never sending the packets in ``skip`` to the decoder."""
    for packet in container.demux(stream):
        if packet.pts is not None and packet.pts in skip:
            continue
        yield from packet.decode()
