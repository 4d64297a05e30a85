"""Read exactly a clip's frames, using the frame pts saved by the analysis pass: seek to the
keyframe at or before the first frame (checked: see ``ClipFrames``), decode forward, keep frames by
pts, stop after the last. ``ClipFrames`` is the one way every reader (clip reader, latents' raw path,
ladder) finds frames in a source. Also an exporter that writes a clip as its own file (stream copy
when it starts on a keyframe, else re-encode)."""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from vidassets.media.analysis import upright
from vidassets.media.source import open_container

# Frame identity. The analysis pass defines frame i as the i-th frame its decoder outputs when the
# whole file is decoded from the start (presentation order), and records its pts. Every reader finds
# a clip's frames again from those pts. Seeking is where that can go wrong: a demuxer's "keyframe at
# or before this timestamp" is not a promise every container keeps. MPEG-TS compares the target with
# packet DTS in a binary search that ignores keyframe flags, so a seek to a keyframe's pts lands one
# packet after it (DTS runs a frame behind PTS) and the decoder's first picture is the NEXT keyframe:
# a whole GOP of the clip is never seen. Landing on a non-keyframe can also hand out pictures whose
# references were never decoded (open-GOP leading frames, HEVC RASL). So a seek is only trusted once
# the decoder has output a keyframe at or before the clip's first frame; otherwise the reader seeks
# again further back (then from the start). Nothing is handed out before that check.

SEEK_BACKOFF_S = (1.0, 4.0, 16.0, 64.0)
"""How far before the first wanted frame to seek again when a seek landed after it (seconds)."""


class ClipFrames:
    """Iterate over the decoded frames at ``indices`` (analysis frame indices) of a source, as
    ``(index, av.VideoFrame)`` in presentation order: the same pictures the analysis pass decoded as
    those indices, for every container. Packets whose pts are in ``skip`` (non-reference frames, from
    the packet index) are never decoded unless wanted.

    - pts strictly increasing (every sane file): frames are matched by pts. The reader seeks to the
      first wanted frame and trusts the landing only when the first keyframe the decoder outputs lies
      at or before it (see above); else it seeks ``SEEK_BACKOFF_S`` further back, finally decodes from
      the start. Frames without pts get the analysis pass's rule (previous pts + 1). Packets that fail
      to decode are passed over, as the analysis pass does; when frames after the last one handed out
      are missing at the end (a frame-threaded decoder can drop the frames in flight at a decode
      error without reporting it), those are read again by a single-threaded decoder.
    - pts not strictly increasing (duplicates, discontinuities, wraps): pts cannot name a frame, so
      the file is decoded from the start without skipping and frames are counted, exactly as the
      analysis pass counted them (checked against every pts the decoder gives).

    After iterating, ``missing`` lists the wanted indices not found, ``decoded`` counts decoder output
    frames (all attempts) and ``attempts`` the times the source was opened."""

    def __init__(self, spec: Mapping[str, Any], frame_pts: Sequence[int], indices: Iterable[int],
                 skip: Iterable[int] = ()) -> None:
        self.spec = spec
        self.pts = np.asarray(frame_pts, dtype=np.int64)
        self.indices = sorted({int(i) for i in indices})
        if self.indices and not (0 <= self.indices[0] and self.indices[-1] < len(self.pts)):
            raise ValueError(f"frames {self.indices[0]}..{self.indices[-1]} outside the {len(self.pts)} analysed")
        self.skip = {int(p) for p in skip} - {int(self.pts[i]) for i in self.indices}
        self.by_pts = len(self.pts) < 2 or bool(np.all(np.diff(self.pts) > 0))
        self.missing: list[int] = []
        self.decoded = 0
        self.attempts = 0

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        found: set[int] = set()
        if self.indices:
            yield from (self._by_pts(found) if self.by_pts else self._by_position(found))
        self.missing = [i for i in self.indices if i not in found]

    # -- pts mode
    def _by_pts(self, found: set[int]) -> Iterator[tuple[int, Any]]:
        threaded = True
        while True:
            after = max(found) if found else -1  # frames are handed out in order: only later ones remain
            todo = [i for i in self.indices if i > after and i not in found]
            if not todo:
                return
            wanted = {int(self.pts[i]): i for i in todo}
            first_pts, last_pts = int(self.pts[todo[0]]), int(self.pts[todo[-1]])
            target: int | None = first_pts if todo[0] > 0 else None
            backoff = iter(SEEK_BACKOFF_S)
            while True:
                self.attempts += 1
                with open_container(self.spec) as container:
                    vs = container.streams.video[0]
                    if threaded:
                        vs.codec_context.thread_type = "FRAME"
                    else:
                        vs.codec_context.thread_count = 1
                    if target is not None:
                        container.seek(target, stream=vs, backward=True, any_frame=False)
                    landed = yield from self._scan(container, vs, wanted, first_pts, last_pts, target is not None, found)
                    tick = float(vs.time_base) if vs.time_base else None
                if landed or target is None:
                    break
                seconds = next(backoff, None)  # the seek landed after the first wanted frame: seek further back
                target = None if seconds is None or not tick else first_pts - int(round(seconds / tick))
                if target is not None and target <= int(self.pts[0]):
                    target = None
            if not threaded or all(i in found for i in todo):
                return
            threaded = False  # frames missing (a frame-threaded decoder may drop them silently at a decode error)

    def _scan(self, container, vs, wanted: dict[int, int], first_pts: int, last_pts: int, seeking: bool,
              found: set[int]) -> Generator[tuple[int, Any], None, bool]:
        """Decode from where the container stands; hand out the wanted frames. False when a seek landed
        after ``first_pts`` (nothing was handed out then)."""
        trusted = not seeking
        previous: int | None = None  # pts of the previous output frame, None when unknown
        first = not seeking  # decoding from the start: no frame out yet
        for frame, after_skip in self._decode(container, vs, self.skip):
            self.decoded += 1
            pts = frame.pts
            if pts is None and not after_skip:  # the analysis pass's rule: previous pts + 1, or 0 for the first
                pts = 0 if first else (previous + 1 if previous is not None else None)
            previous, first = pts, False
            if not trusted:
                if pts is None or not frame.key_frame:
                    if pts is not None and pts > last_pts:
                        return False
                    continue  # lead-in before the first keyframe out of the decoder: never handed out
                if pts > first_pts:
                    return False
                trusted = True
            index = wanted.get(pts) if pts is not None else None
            if index is not None and index not in found:
                found.add(index)
                yield index, frame
            if pts is not None and pts >= last_pts:
                break
        return trusted

    # -- position mode
    def _by_position(self, found: set[int]) -> Iterator[tuple[int, Any]]:
        wanted, last = set(self.indices), self.indices[-1]
        self.attempts += 1
        with open_container(self.spec) as container:
            vs = container.streams.video[0]
            vs.codec_context.thread_count = 1
            for index, (frame, _) in enumerate(self._decode(container, vs, set())):
                self.decoded += 1
                if frame.pts is not None and index < len(self.pts) and int(frame.pts) != int(self.pts[index]):
                    raise ValueError(f"frame {index} has pts {frame.pts}, the analysis pass saw {self.pts[index]}: "
                                     "the source is not the file that was analysed")
                if index in wanted:
                    found.add(index)
                    yield index, frame
                if index >= last:
                    break

    def _decode(self, container, vs, skip: set[int]) -> Iterator[tuple[Any, bool]]:
        """Decoder output frames, each with whether a packet was skipped since the previous one. Like
        the analysis pass, a packet that fails to decode is passed over and a demux failure flushes
        the decoder."""
        import av

        skipped = False
        packets = container.demux(vs)
        while True:
            try:
                packet = next(packets)
            except StopIteration:
                return
            except av.error.FFmpegError:
                try:
                    for frame in vs.codec_context.decode(None):
                        yield frame, skipped
                        skipped = False
                except av.error.FFmpegError:
                    pass
                return
            if skip and packet.pts is not None and int(packet.pts) in skip:
                skipped = True
                continue
            try:
                frames = packet.decode()
            except av.error.FFmpegError:
                continue
            for frame in frames:
                yield frame, skipped
                skipped = False


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
    frames = ClipFrames(spec, frame_pts, range(first_frame, last_frame + 1))
    kwargs: dict[str, Any] = {"format": fmt}
    if size:
        kwargs.update(width=size[0], height=size[1])
    for index, frame in frames:
        yield index, upright(frame.to_ndarray(**kwargs), rotation)
    if frames.missing:
        raise ValueError(f"{len(frames.missing)} of frames {first_frame}..{last_frame} not found in the source "
                         f"(first: {frames.missing[:5]})")


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
        for target in _packet_seek_targets(spec, first_pts, int(frame_pts[0])):
            with open_container(spec) as src, av.open(out_path, "w") as dst:
                vs = src.streams.video[0]
                out = dst.add_stream_from_template(vs)
                if target is not None:
                    src.seek(target, stream=vs, backward=True, any_frame=False)
                started = False
                for packet in src.demux(vs):
                    if packet.dts is None or packet.pts is None:
                        continue
                    if not started:  # copy from the clip's keyframe packet: a seek may land after it (MPEG-TS)
                        if packet.is_keyframe and packet.pts == first_pts:
                            started = True
                        elif packet.is_keyframe and packet.pts > first_pts:
                            break
                        else:
                            continue
                    if packet.pts > last_pts and packet.is_keyframe:
                        break
                    if packet.pts < first_pts or packet.pts > last_pts:
                        continue
                    packet.stream = out
                    dst.mux(packet)
            if started:
                return "stream_copy"
        raise ValueError(f"the keyframe of frame {first_frame} (pts {first_pts}) was not found in the source")
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


def _packet_seek_targets(spec: Mapping[str, Any], first_pts: int, start_pts: int) -> Iterator[int | None]:
    """Seek targets for a packet-level reader: the frame itself, then ``SEEK_BACKOFF_S`` earlier, then
    the start (None)."""
    if first_pts <= start_pts:
        yield None
        return
    yield first_pts
    with open_container(spec) as container:
        time_base = container.streams.video[0].time_base
    for seconds in SEEK_BACKOFF_S if time_base else ():
        target = first_pts - int(round(seconds / float(time_base)))
        if target <= start_pts:
            break
        yield target
    yield None


def read_frames(spec: Mapping[str, Any], frame_pts: Sequence[int], indices: Sequence[int], rotation: int = 0,
                crop: Sequence[int] | None = None, size: Sequence[int] | None = None,
                nonref_pts: Sequence[int] = ()) -> dict[str, Any]:
    """Sandbox task: the frames at ``indices`` (sorted source frame indices), upright, cropped to
    ``crop`` = [x, y, w, h] (upright pixels) and resized to ``size`` = [w, h]. Seeks to the keyframe
    before the first index and decodes forward only to the last one; packets of non-reference frames
    (``nonref_pts``, from the packet index) that are not wanted are never decoded: no other frame
    refers to them, so skipping them is exact. Returns the frames and how many were decoded."""
    frames = ClipFrames(spec, frame_pts, indices, nonref_pts)
    out = {index: crop_and_resize(upright(frame.to_ndarray(format="rgb24"), rotation), crop, size)
           for index, frame in frames}
    if frames.missing:
        raise ValueError(f"{len(frames.missing)} of {len(indices)} frames not found in the source "
                         f"(first: {frames.missing[:5]})")
    return {"frames": np.stack([out[int(i)] for i in indices]), "frames_decoded": frames.decoded}


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
