"""A per-video fingerprint cheap enough to take at ingest, before the analysis pass, and the rule
that says when two fingerprints are the same footage.

What is decoded (``sample_plan``, from the stored packet index): every keyframe, plus, where GOPs
are longer than the grid step, the reference frame nearest each point of a ``grid_fps`` grid. A GOP
is decoded from its keyframe only up to its last wanted frame, and frames nothing references are
never decoded unless wanted, so the cost is a few frames per second instead of all of them.

Each sampled frame (upright, black bars cropped) gives two PDQ hashes: the whole picture and its
central square. A copy cropped to another aspect ratio keeps the central square; a letterboxed copy
loses its bars before hashing. The audio track, when there is one, gives a Chromaprint fingerprint
(libchromaprint through pyacoustid: 32-bit sub-fingerprints every ~0.124 s).

Alignment (``align``): frame pairs within ``max_hamming`` vote for a line ``t_b = speed * t_a +
offset`` (speed within ±``max_speed_change``); the best line's inliers give, for each video, the share
of its seconds that the other covers, and the spans. Tolerant to trims and offsets (any offset),
speed changes, re-encodes, rescales, crops, letterbox and overlays.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vidassets.media.analysis import upright
from vidassets.media.source import open_container

VERSION = "vfp-v3"
"""Version of what ``fingerprint_source`` computes (sampling, scaling, bar cropping, the hashes, audio).
v2: frames scaled with area averaging, bars found on every second row and column (cheaper, same
recall on the bench set). v3: budgeted H.264 plans reach their grid points through the I/P chain
(``sample_plan``: the same samples for about half the frames)."""

HASH_SIDE = 256  # frames are shrunk so their long side is this before cropping and hashing
AUDIO_RATE = 11025  # Chromaprint's own working rate: feeding it directly skips its resampler
CHROMAPRINT_ITEM_S = 4096 / 3 / AUDIO_RATE  # seconds per raw sub-fingerprint (~0.1238)


def sample_plan(pts: np.ndarray, keyframe: np.ndarray, is_ref: np.ndarray, time_base: float,
                grid_fps: float, max_decode_share: float | None = None,
                frame_type: np.ndarray | None = None) -> tuple[list[int], list[int], bool]:
    """(target pts to hash, pts of packets to decode, whether that is the whole grid), from a packet
    index in demux order.

    Targets: every keyframe, and for grid points (``grid_fps``) the reference frame nearest each (a
    frame of unknown type counts as one). Decoded: in each GOP, the reference frames up to its last
    target, and the targets. Reaching a frame deep in a long GOP costs every reference frame before
    it, so with ``max_decode_share`` (of the packets) the grid is kept to the same head of every GOP
    (the first seconds after its keyframe), as deep as the budget allows: short GOPs are sampled
    whole, long ones at their heads; keyframes are always taken.

    The budget sets the depth as if every reference frame were decoded. Where ``frame_type`` (the
    packet index's 1 I, 2 P, 3 B, 0 unknown) is given and known for every frame, the same targets
    are then reached through the I and P frames only (about half the reference frames): in x264's
    pyramids a reference B frame is predicted from the P frames around it and predicts only the B
    frames between them, so the I/P chain decodes to the same pixels, and a B target costs one
    frame more. A B target decoded there sits in the reference lists where the encoder's skipped
    ones did: the P frames after it come out a little different (within 4 of 256 hash bits of the
    exact decode on the bench's videos; ``max_hamming`` is 52). Where an encoder's P frames do
    predict from a B frame, the decoder logs the missing reference and ``fingerprint_source`` plans
    again on every reference frame."""
    pts = np.asarray(pts, dtype=np.int64)
    keyframe = np.asarray(keyframe, dtype=bool)
    is_ref = np.asarray(is_ref, dtype=np.int64)
    valid = pts >= 0
    if not valid.any():
        return [], [], True
    start = int(pts[valid].min())
    times = (pts - start) * float(time_base)
    gop = np.cumsum(keyframe) if len(keyframe) else np.zeros(0, np.int64)
    gop_start = {int(g): float(times[np.flatnonzero((gop == g) & valid)].min()) for g in np.unique(gop[valid])}
    keys = set(pts[keyframe & valid].tolist())
    grid: dict[int, float] = {}  # target pts -> its time from its GOP's keyframe
    refs = is_ref != 0
    if grid_fps > 0:
        step = 1.0 / grid_fps
        ref = valid & refs
        order = np.argsort(times[ref])
        ref_times, ref_pts, ref_gop = times[ref][order], pts[ref][order], gop[ref][order]
        end = float(times[valid].max())
        for g in np.arange(0.0, end + 1e-9, step):
            if len(ref_times):
                j = np.searchsorted(ref_times, g)
                best = min((i for i in (j - 1, j) if 0 <= i < len(ref_times)), key=lambda i: abs(ref_times[i] - g))
                grid[int(ref_pts[best])] = float(ref_times[best]) - gop_start[int(ref_gop[best])]

    def plan(depth: float, chain: np.ndarray) -> tuple[set[int], np.ndarray]:
        chosen = keys | {p for p, into in grid.items() if into <= depth}
        is_target = np.fromiter((p in chosen for p in pts.tolist()), dtype=bool, count=len(pts))
        decode = np.zeros(len(pts), dtype=bool)
        for g in np.unique(gop):
            members = np.flatnonzero(gop == g)
            wanted = members[is_target[members]]
            if len(wanted):
                upto = members[members <= wanted.max()]
                decode[upto] = chain[upto] | is_target[upto] | keyframe[upto]
        return chosen, decode & valid

    depths = sorted(set(grid.values()))
    chosen, decode = plan(float("inf"), refs)
    whole_grid = chosen
    if max_decode_share is not None and depths and decode.sum() > max_decode_share * valid.sum():
        lo, hi = -1, len(depths) - 1  # the deepest head within budget (-1: keyframes only)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if plan(depths[mid], refs)[1].sum() <= max_decode_share * valid.sum():
                lo = mid
            else:
                hi = mid - 1
        chain = refs
        if frame_type is not None and len(frame_type) == len(pts):
            types = np.asarray(frame_type)[valid]
            if types.size and (types > 0).all() and (types == 3).any():
                chain = refs & (np.asarray(frame_type) != 3)  # the I/P chain: see the docstring
        chosen, decode = plan(depths[lo] if lo >= 0 else -1.0, chain)
    # a budget that does not bind (short GOPs, all-intra, a still) leaves the whole grid's targets
    return sorted(chosen), pts[decode].tolist(), chosen == whole_grid


def crop_bars(gray: np.ndarray, level: int = 24, spread: float = 10.0) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) rows/columns of near-black uniform bars around a picture."""
    h, w = gray.shape

    def bar(lines: np.ndarray) -> int:
        dark = (lines.mean(axis=1) < level) & (lines.std(axis=1) < spread)
        run = int(np.argmin(dark)) if not dark.all() else len(dark)
        return run

    top, bottom = bar(gray), bar(gray[::-1])
    left, right = bar(gray.T), bar(gray.T[::-1])
    if top + bottom >= h * 0.8 or left + right >= w * 0.8:  # a dark picture, not bars
        return 0, 0, 0, 0
    return top, bottom, left, right


ZOOM = 0.85
"""The inner square's side as a share of the central square's: a copy zoomed in by 5-25% is within
~8% of scale of one of the two squares, close enough for PDQ."""


def frame_hashes(rgb: np.ndarray) -> tuple[bytes, bytes, bytes, int]:
    """(PDQ of the picture without bars, of its central square, of the inner square, PDQ quality
    of the first)."""
    import pdqhash

    top, bottom, left, right = (2 * x for x in crop_bars(rgb[::2, ::2].mean(axis=2)))  # bars: half resolution is plenty
    picture = np.ascontiguousarray(rgb[top: rgb.shape[0] - bottom, left: rgb.shape[1] - right])
    h, w = picture.shape[:2]
    side = min(h, w)
    y, x = (h - side) // 2, (w - side) // 2
    square = np.ascontiguousarray(picture[y: y + side, x: x + side])
    inner_side = max(2, int(side * ZOOM))
    y, x = (h - inner_side) // 2, (w - inner_side) // 2
    inner = np.ascontiguousarray(picture[y: y + inner_side, x: x + inner_side])
    pack = lambda bits: np.packbits(bits.astype(np.uint8)).tobytes()  # noqa: E731
    whole, quality = pdqhash.compute(picture)
    return pack(whole), pack(pdqhash.compute(square)[0]), pack(pdqhash.compute(inner)[0]), int(quality)


def _hash_size(width: int, height: int) -> tuple[int, int]:
    scale = HASH_SIDE / max(width, height)
    return max(2, int(round(width * scale / 2)) * 2), max(2, int(round(height * scale / 2)) * 2)


IP_CHAIN_CODECS = frozenset({"h264"})
"""Codecs whose budgeted plans reach their grid points through the I/P chain (``sample_plan``): in
x264's pyramids P frames predict from I/P frames only. (x265's reference picture sets name the
pyramid's B frames: FFmpeg outputs almost nothing decoded from the I/P chain there; and the packet
index does not type HEVC frames.)"""

MIN_HASHED_SHARE = 0.9
"""An I/P plan is planned again on every reference frame and decoded again when the decoder reports
an error while decoding it (a P frame whose reference is missing: FFmpeg conceals it and outputs the
frame anyway, logging the missing reference) or hashes fewer of its targets than this share."""

UNREF_SKIPPED = "mmco: unref short failure"
"""What FFmpeg's H.264 decoder logs when a slice header drops a reference B frame the I/P plan never
decoded from the reference list: expected, and no frame predicts from it."""


def fingerprint_source(spec: Mapping[str, Any], packets: Mapping[str, Sequence[int]], grid_fps: float,
                       rotation: int = 0, audio: bool = True, max_audio_s: float = 3600.0,
                       max_decode_share: float | None = None) -> dict[str, Any]:
    """Hash the frames ``sample_plan`` picks from the packet index (``packets``: pts, keyframe,
    is_ref and, where stored, frame_type, in demux order), decoding only what it says, and
    fingerprint the audio in the same demux pass. Returns times (s from the first frame), the hash
    arrays (hex), qualities, decoded frame count (both passes where the I/P plan fell back) and the
    raw Chromaprint items (or None without audio)."""
    arrays = [np.asarray(packets[k]) for k in ("pts", "keyframe", "is_ref")]
    with open_container(spec) as container:
        vs = container.streams.video[0]
        time_base = float(vs.time_base) if vs.time_base else 1.0
        codec = vs.codec_context.name
        types = np.asarray(packets["frame_type"]) if codec in IP_CHAIN_CODECS and "frame_type" in packets else None
        targets, decode, whole_grid = sample_plan(*arrays, time_base, grid_fps, max_decode_share, types)
        printer = AudioPrinter.start(container.streams.audio[0], max_audio_s) if audio and container.streams.audio else None
        with _decoder_errors() as complaints:
            rows, decoded, errors = _hash_planned(container, targets, decode, rotation, printer)
        chroma = printer.finish() if printer is not None else None
    if types is not None and (any(name == codec and not message.startswith(UNREF_SKIPPED)
                                  for name, message in complaints)
                              or len(rows) < MIN_HASHED_SHARE * len(targets)):
        again = sample_plan(*arrays, time_base, grid_fps, max_decode_share)
        if again[1] != decode:  # the I/P chain was planned (not a damaged stream's whole grid): plan on every reference
            targets, decode, whole_grid = again
            with open_container(spec) as container:
                rows, more, errors = _hash_planned(container, targets, decode, rotation, None)
            decoded += more
    first_pts = min((p for p in packets["pts"] if p >= 0), default=0)
    return {
        "whole_grid": whole_grid,
        "times": [round((p - first_pts) * time_base, 4) for p, *_ in rows],
        "full": b"".join(r[1] for r in rows).hex(),
        "square": b"".join(r[2] for r in rows).hex(),
        "inner": b"".join(r[3] for r in rows).hex(),
        "quality": [r[4] for r in rows],
        "frames_decoded": decoded,
        "audio": chroma,
        "errors": errors[:5],
    }


@contextlib.contextmanager
def _decoder_errors():
    """The (component, message) errors FFmpeg logs in this thread meanwhile (its logging is off in
    the workers otherwise)."""
    import av.logging

    level = av.logging.get_level()
    av.logging.set_level(av.logging.ERROR)
    try:
        with av.logging.Capture(True) as logs:
            complaints: list[tuple[str, str]] = []
            yield complaints
        complaints.extend((name or "", message) for _, name, message in logs)
    finally:
        av.logging.set_level(level)


def _hash_planned(container, targets: Sequence[int], decode: Sequence[int], rotation: int,
                  printer: AudioPrinter | None) -> tuple[list[tuple[int, bytes, bytes, bytes, int]], int, list[str]]:
    """One demux pass: the planned packets decoded, the targets hashed (sorted by pts), the audio
    fed to ``printer``. Returns (rows, frames decoded, errors)."""
    vs = container.streams.video[0]
    cc = vs.codec_context
    cc.thread_count = 1
    cc.options = {**cc.options, "skip_loop_filter": "all"}  # a 64x64 hash does not see deblocking
    wanted, feed = set(targets), set(decode) | set(targets)
    size = _hash_size(int(cc.width), int(cc.height))
    rows: list[tuple[int, bytes, bytes, bytes, int]] = []
    decoded = 0
    errors: list[str] = []

    def take(frames) -> None:  # count every decoded frame, hash the wanted ones
        nonlocal decoded
        for frame in frames:
            decoded += 1
            if frame.pts is not None and frame.pts in wanted:
                picture = frame.to_ndarray(width=size[0], height=size[1], format="rgb24", interpolation="AREA")
                rows.append((int(frame.pts), *frame_hashes(upright(picture, rotation))))

    for packet in container.demux(*([vs] + ([printer.stream] if printer else []))):
        if printer is not None and packet.stream.index == printer.stream.index:
            printer.feed(packet)
            continue
        if packet.pts is None and packet.size == 0:
            continue
        if packet.size and packet.pts not in feed:
            continue
        try:
            take(cc.decode(packet if packet.size else None))
        except Exception as exc:  # noqa: BLE001 - a damaged packet costs its frame, not the video
            errors.append(f"{exc.__class__.__name__}: {str(exc)[:120]}")
    try:
        take(cc.decode(None))
    except Exception as exc:  # noqa: BLE001
        errors.append(f"{exc.__class__.__name__}: {str(exc)[:120]}")
    rows.sort()
    return rows, decoded, errors


class AudioPrinter:
    """Raw Chromaprint sub-fingerprints of an audio track (mono, 11025 Hz), fed packet by packet from
    the demux pass that also reads the video; None when the track does not decode or libchromaprint
    is missing."""

    def __init__(self, stream, printer, max_seconds: float):
        import av

        self.stream, self._printer, self._limit = stream, printer, max_seconds * AUDIO_RATE
        self._resampler = av.AudioResampler(format="s16", layout="mono", rate=AUDIO_RATE)
        self._fed, self._broken = 0, False

    @classmethod
    def start(cls, stream, max_seconds: float) -> AudioPrinter | None:
        try:
            import chromaprint
        except Exception:  # noqa: BLE001 - libchromaprint1 not installed: no audio fingerprint
            return None
        printer = chromaprint.Fingerprinter()
        printer.start(AUDIO_RATE, 1)
        return cls(stream, printer, max_seconds)

    def _push(self, frames) -> None:
        for out in frames:
            data = out.to_ndarray().tobytes()
            self._printer.feed(data)
            self._fed += len(data) // 2

    def feed(self, packet) -> None:
        if self._broken or self._fed >= self._limit or not packet.size:  # finish() flushes the decoder
            return
        try:
            for frame in self.stream.codec_context.decode(packet):
                self._push(self._resampler.resample(frame))
        except Exception:  # noqa: BLE001 - an undecodable track has no fingerprint
            self._broken = True

    def finish(self) -> list[int] | None:
        if self._broken:
            return None
        try:
            if self._fed < self._limit:  # what the decoder and resampler still hold
                for frame in self.stream.codec_context.decode(None):
                    self._push(self._resampler.resample(frame))
            self._push(self._resampler.resample(None))
        except Exception:  # noqa: BLE001
            return None
        import chromaprint

        raw, _ = chromaprint.decode_fingerprint(self._printer.finish())
        return [int(x) & 0xFFFFFFFF for x in raw] or None


def audio_fingerprint(container, max_seconds: float) -> list[int] | None:
    """Raw Chromaprint items of a container's first audio track, read on its own (an audio-only
    file); a video's track is printed in ``fingerprint_source``'s one demux pass instead."""
    printer = AudioPrinter.start(container.streams.audio[0], max_seconds) if container.streams.audio else None
    if printer is None:
        return None
    for packet in container.demux(printer.stream):
        printer.feed(packet)
    return printer.finish()


# -- matching --------------------------------------------------------------------------------------

def unpack(hex_hashes: str) -> np.ndarray:
    """(n, 32) uint8 from the concatenated hex of n 256-bit hashes."""
    return np.frombuffer(bytes.fromhex(hex_hashes), dtype=np.uint8).reshape(-1, 32)


_POP = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise Hamming distances between (n, 32) and (m, 32) packed hashes: (n, m)."""
    if not len(a) or not len(b):
        return np.zeros((len(a), len(b)), dtype=np.int32)
    return _POP[a[:, None, :] ^ b[None, :, :]].sum(axis=2, dtype=np.int32)


@dataclass(frozen=True)
class Fingerprint:
    times: np.ndarray  # seconds from the first frame
    full: np.ndarray  # (n, 32)
    square: np.ndarray  # (n, 32)
    inner: np.ndarray  # (n, 32)
    duration_s: float
    audio: np.ndarray | None = None  # uint32 Chromaprint items

    @classmethod
    def from_row(cls, times: Sequence[float], full: str, square: str, inner: str, duration_s: float | None,
                 audio: Sequence[int] | None = None) -> Fingerprint:
        t = np.asarray(times, dtype=np.float64)
        end = float(duration_s) if duration_s else (float(t.max()) + 1.0 if len(t) else 0.0)
        return cls(t, unpack(full), unpack(square), unpack(inner), max(end, float(t.max()) if len(t) else 0.0),
                   None if audio is None else np.asarray(audio, dtype=np.uint32))


@dataclass(frozen=True)
class Alignment:
    share_a: float  # share of a's seconds covered by b
    share_b: float
    speed: float  # t_b = speed * t_a + offset
    offset_s: float
    span_a: tuple[float, float]
    span_b: tuple[float, float]
    pairs: int
    audio_share: float | None = None  # share of the shorter track's items matching at the same offset
    overlap_a: float = 1.0  # share of a's duration the line maps inside b
    overlap_b: float = 1.0
    compared: int = 0  # time bins (both videos) the other side could confirm


def _min_distance(a: Fingerprint, b: Fingerprint) -> np.ndarray:
    """(n_a, n_b) smallest Hamming distance over every pair of hash kinds (a crop of one side is the
    other's central square; a zoom, its inner square)."""
    kinds = ("full", "square", "inner")
    return np.minimum.reduce([hamming(getattr(a, x), getattr(b, y)) for x in kinds for y in kinds])


def _comparable_share(times: np.ndarray, mapped: np.ndarray, other: np.ndarray, other_end: float,
                      matched: np.ndarray, compare_s: float, bin_s: float) -> tuple[float, int]:
    """(share, count) of this video's sampled time bins that the other video could confirm (the
    line maps them inside the other and the other was sampled within ``compare_s`` there) and did
    (a matched sample in the bin)."""
    inside = (mapped >= -compare_s) & (mapped <= other_end + compare_s)
    if len(other):
        j = np.clip(np.searchsorted(other, mapped), 1, max(len(other) - 1, 1))
        near = np.minimum(np.abs(other[j - 1] - mapped), np.abs(other[np.minimum(j, len(other) - 1)] - mapped))
        inside &= near <= compare_s
    else:
        inside[:] = False
    bins = np.unique((times[inside] / bin_s).astype(np.int64))
    hit = np.unique((matched / bin_s).astype(np.int64))
    return len(np.intersect1d(hit, bins)) / max(len(bins), 1), len(bins)


def align(a: Fingerprint, b: Fingerprint, max_hamming: int, max_speed_change: float = 0.06,
          tolerance_s: float = 0.35, bin_s: float = 1.0, compare_s: float = 0.5) -> Alignment | None:
    """The best time alignment of two fingerprints, or None when no two frames match."""
    if not len(a.times) or not len(b.times):
        return None
    dist = _min_distance(a, b)
    ia, ib = np.nonzero(dist <= max_hamming)
    if not len(ia):
        return None
    ta, tb = a.times[ia], b.times[ib]
    best = None
    speeds = np.linspace(1 - max_speed_change, 1 + max_speed_change, 13)
    for speed in sorted(speeds, key=lambda s: abs(s - 1)):  # ties go to the speed nearest 1
        offsets = tb - speed * ta
        # vote: the offset with the most pairs within the tolerance (sorted sweep)
        order = np.sort(offsets)
        hi = np.searchsorted(order, order + 2 * tolerance_s, side="right")
        k = int(np.argmax(hi - np.arange(len(order))))
        center = float(np.median(order[k: hi[k]]))
        inlier = np.abs(offsets - center) <= tolerance_s
        # a pair counts once per frame of a: the same picture repeated in b votes only once
        score = len(np.unique(ia[inlier])) + len(np.unique(ib[inlier]))
        if best is None or score > best[0]:
            best = (score, float(speed), center, inlier)
    _, speed, offset, inlier = best
    for _ in range(2):  # refine the line on its inliers (the coarse speed step drifts on long videos)
        if inlier.sum() < 3 or np.ptp(ta[inlier]) <= 0:
            break
        fit_speed, fit_offset = np.polyfit(ta[inlier], tb[inlier], 1)
        if abs(fit_speed - 1) > max_speed_change + 0.01:
            break
        refit = np.abs(tb - (fit_speed * ta + fit_offset)) <= tolerance_s
        if refit.sum() < inlier.sum():
            break
        speed, offset, inlier = float(fit_speed), float(fit_offset), refit
    sa, sb = a.times[ia[inlier]], b.times[ib[inlier]]
    ta_all, tb_all = np.sort(a.times), np.sort(b.times)
    share_a, n_a = _comparable_share(a.times, speed * a.times + offset, tb_all, b.duration_s, sa, compare_s, bin_s)
    share_b, n_b = _comparable_share(b.times, (b.times - offset) / speed, ta_all, a.duration_s, sb, compare_s, bin_s)
    lo, hi = max(0.0, -offset / speed), min(a.duration_s, (b.duration_s - offset) / speed)  # a's span inside b
    overlap = max(0.0, hi - lo)
    return Alignment(
        share_a=share_a, share_b=share_b, compared=n_a + n_b,
        overlap_a=round(min(1.0, overlap / a.duration_s), 4) if a.duration_s else 0.0,
        overlap_b=round(min(1.0, overlap * speed / b.duration_s), 4) if b.duration_s else 0.0,
        speed=round(speed, 4), offset_s=round(offset, 3),
        span_a=(round(float(sa.min()), 3), round(float(sa.max()), 3)),
        span_b=(round(float(sb.min()), 3), round(float(sb.max()), 3)),
        pairs=int(inlier.sum()), audio_share=audio_share(a.audio, b.audio, offset) if abs(speed - 1) < 0.01 else None)


def audio_share(a: np.ndarray | None, b: np.ndarray | None, offset_s: float, max_bit_errors: int = 6,
                search_items: int = 12) -> float | None:
    """Share of the shorter track's Chromaprint items that match (few bit errors) the other's at the
    visual offset (searched ±``search_items`` items around it); None without both tracks."""
    if a is None or b is None or not len(a) or not len(b):
        return None
    shift0 = int(round(offset_s / CHROMAPRINT_ITEM_S))
    best = 0.0
    for shift in range(shift0 - search_items, shift0 + search_items + 1):
        lo_a, lo_b = max(0, -shift), max(0, shift)
        n = min(len(a) - lo_a, len(b) - lo_b)
        if n <= 0:
            continue
        x = a[lo_a: lo_a + n] ^ b[lo_b: lo_b + n]
        errors = np.unpackbits(x.view(np.uint8).reshape(n, 4), axis=1).sum(axis=1)
        best = max(best, float(np.sum(errors <= max_bit_errors)) / min(len(a), len(b)))
    return round(best, 4)


def band_keys(hashes: np.ndarray, where: np.ndarray) -> np.ndarray:
    """(n, tables) int64 locality-sensitive keys of PDQ ``hashes`` (n, 32) uint8 under a plan
    ``where`` (tables, bits) of bit positions: table t's key is the values of its bits, with t in
    the bits above them (keys of different tables never meet). Two hashes share table t's key
    exactly when they agree on its bits."""
    where = np.asarray(where)
    tables, bits = where.shape
    unpacked = np.unpackbits(np.ascontiguousarray(hashes, dtype=np.uint8).reshape(-1, 32), axis=1)
    weights = 1 << np.arange(bits, dtype=np.int64)
    keys = np.stack([unpacked[:, where[t]].astype(np.int64) @ weights for t in range(tables)], axis=1)
    return keys.reshape(-1, tables) + (np.arange(tables, dtype=np.int64) << bits)
