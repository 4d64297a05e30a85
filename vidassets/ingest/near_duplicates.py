"""Near-duplicate videos across every drop, decided from the ingest fingerprints.

A drop's run matches its videos against the fingerprints of every drop (its own included): the
stored videos holding a frame within ``max_hamming`` of one of its own are found through the
persistent near-duplicate index (``near_dup_index``; the pairs within the drop by a faiss binary
index), then each candidate pair is aligned in
time (``media.fingerprint.align``). With the shorter video's aligned share at least ``min_share``:

- the longer's share at least ``min_share_longer``: the two are **near-duplicates** (re-encodes,
  rescales, crops, overlays, trims, speed changes of one footage);
- otherwise the longer **contains** the shorter (a compilation): recorded with the span on the longer
  video's row (``contains``) and on the shorter's (``contained_in``), never dropped. Only the drop
  that runs writes its rows: an older compilation gains a newer video in ``contains`` at its own next
  run (no other drop is run for it).

Near-duplicates form groups (transitively, through the decisions other drops stored). The canonical
copy of a group is chosen among the copies no other copy *holds* (a copy holds another when their
alignment places the other inside it and covers less than ``SAME_FOOTAGE`` of it: a trim, an
excerpt), so no footage is lost to a shorter copy whatever its bitrate; among those, by
``near_duplicates.canonical``: ``rights_first`` (default) the tier order of ``ingest.tier_priority``,
then quality (bits per pixel x pixels, higher first); ``quality_first`` quality, then tier; then
the URI: never by ingest order. Every other member is ``near_duplicate_of`` it and is not analysed. When a better copy lands in a later drop, the drops
whose stored decisions are now wrong are returned as ``requests`` (run their ``video_fingerprint``
again: fingerprints are reused, only the decision changes; their analysis then parks the old copy's
rows).

Fingerprints are first taken within a decode budget (GOP heads of long GOPs). A candidate pair (two
sampled frames within ``max_hamming``) that the rule rejects while a copy was sampled within the
budget, that no other match has grouped and whose evidence is thin (``inconclusive``) is undecided:
this drop's copies in it are returned as ``undecided`` (the caller takes them again on the whole
grid and decides again), another drop's as ``borrow``: the caller takes them on the whole grid too,
for this decision only (``whole_grid``; stored where any later run finds them), and their drops are
not run for it. So the whole grid is paid almost only for copies, at most once per video, and a new
drop never makes an older drop run for a retake.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vidassets.config import NearDuplicateSettings
from vidassets.ingest.near_dup_index import IndexedVideo, NearDuplicateIndex
from vidassets.media.fingerprint import Alignment, Fingerprint, align
from vidassets.storage.objects import ObjectStore
from vidassets.storage.tables import put_blob, read_many
from vidassets.union_find import UnionFind

VERSION = "near-dup-v3"  # v2: held copies never canonical; rights_first. v3: candidates from the index

MIN_COMPARED = 4
"""Fewest time bins (both videos together) the other side must have been able to confirm."""

KINDS = ("full", "square", "inner")

SAME_FOOTAGE = 0.9
"""A near-duplicate pair whose alignment covers less than this share of the longer copy: the longer
holds footage the shorter lacks (a trim, an excerpt), so the shorter is never canonical over it. At
the 2-per-second grid the alignment's extent is good to about half a second: a copy shorter by less
than a tenth counts as the same footage (re-encodes, speed changes of a few percent)."""


@dataclass
class Outcome:
    requests: set[str] = field(default_factory=set)
    """Other drops whose stored decisions this run's decision changed."""
    pairs_aligned: int = 0
    near_duplicates: int = 0
    contains: int = 0
    generated_matches: int = 0
    undecided: set[str] = field(default_factory=set)
    """This drop's videos (asset ids) whose budgeted samples left a candidate pair undecided: take
    them again on the whole grid and decide again (``retake_undecided``)."""
    borrow: list[dict] = field(default_factory=list)
    """Other drops' rows (budgeted) in such pairs: this run takes them on the whole grid too, for
    this decision (``retake_undecided``); their drops are not run for it."""


def load(objects: ObjectStore, row: Mapping[str, Any]) -> Fingerprint:
    blob = json.loads(objects.get_bytes(row["fingerprint_blob"]))
    return Fingerprint.from_row(blob["times"], blob["full"], blob["square"], blob["inner"], row.get("duration_s"),
                                blob.get("audio"))


PACK_MAGIC = b"vidassets-fingerprint-pack-v1\n"


def pack_bytes(entries: Sequence[tuple[str, str, np.ndarray]]) -> bytes:
    """One drop's hashes in one object: (asset_id, fingerprint blob, its hashes with ``KINDS`` stacked)
    per video, as a JSON header then the raw 32-byte hashes. Same entries, same bytes."""
    header = json.dumps([{"asset_id": a, "blob": b, "hashes": len(h)} for a, b, h in entries]).encode()
    body = b"".join(np.ascontiguousarray(h, dtype=np.uint8).tobytes() for _, _, h in entries)
    return PACK_MAGIC + len(header).to_bytes(8, "little") + header + body


def read_pack(data: bytes) -> dict[tuple[str, str], np.ndarray]:
    """(asset_id, fingerprint blob) -> hashes, from ``pack_bytes``."""
    if not data.startswith(PACK_MAGIC):
        raise ValueError("not a fingerprint pack")
    at = len(PACK_MAGIC)
    size = int.from_bytes(data[at:at + 8], "little")
    header = json.loads(data[at + 8:at + 8 + size])
    hashes = np.frombuffer(data, dtype=np.uint8, offset=at + 8 + size).reshape(-1, 32)
    if len(hashes) != sum(e["hashes"] for e in header):
        raise ValueError("fingerprint pack truncated")
    out, start = {}, 0
    for e in header:
        out[(e["asset_id"], e["blob"])] = hashes[start:start + e["hashes"]]
        start += e["hashes"]
    return out


class Prints:
    """What one run's decisions read of the stored fingerprints, each object at most once. The
    candidate search needs only hashes: another drop's come from its **pack** (one object holding
    every hash of the drop, named on its rows in ``fingerprint_pack``), not from one blob per video;
    a whole fingerprint (times, audio) is loaded only for a video in a candidate pair, or where no
    pack holds the row's blob (a table written before packs; a whole grid taken for this decision)."""

    def __init__(self, objects: ObjectStore):
        self.objects = objects
        self._prints: dict[tuple[str, str], Fingerprint] = {}
        self._packs: dict[str, dict[tuple[str, str], np.ndarray]] = {}
        self.blobs_read = 0
        self.packs_read = 0
        self.packs_unreadable = 0

    def fingerprint(self, row: Mapping[str, Any]) -> Fingerprint:
        key = (row["fingerprint_blob"], repr(row.get("duration_s")))
        if key not in self._prints:
            self._prints[key] = load(self.objects, row)
            self.blobs_read += 1
        return self._prints[key]

    def hashes(self, row: Mapping[str, Any]) -> np.ndarray:
        """Every hash of the row's fingerprint, ``KINDS`` stacked."""
        packed = self._pack(row.get("fingerprint_pack")).get((row["asset_id"], row["fingerprint_blob"]))
        if packed is not None:
            return packed
        fp = self.fingerprint(row)
        return np.concatenate([getattr(fp, kind) for kind in KINDS])

    def read_packs(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Read the packs ``rows`` name, several at once (each later lookup finds its pack read)."""
        keys = sorted({k for r in rows if isinstance(k := r.get("fingerprint_pack"), str) and k} - set(self._packs))
        for key, pack in zip(keys, read_many(self._read_pack, keys), strict=True):
            self._packs[key] = pack
            self.packs_read += pack is not None
            self.packs_unreadable += pack is None

    def _read_pack(self, key: str) -> dict[tuple[str, str], np.ndarray] | None:
        try:
            return read_pack(self.objects.get_bytes(key))
        except Exception:  # noqa: BLE001 - a lost or damaged pack costs reads, not a decision: blobs hold it all
            return None

    def _pack(self, key: Any) -> dict[tuple[str, str], np.ndarray]:
        if not isinstance(key, str) or not key:
            return {}
        if key not in self._packs:
            self.read_packs([{"fingerprint_pack": key}])
        return self._packs[key] or {}

    def write_pack(self, rows: Sequence[dict[str, Any]]) -> str | None:
        """Store the pack of a drop's ``rows`` (content-addressed), name it in ``fingerprint_pack`` on
        the rows it holds (the fingerprinted ones; None on the others) and return its key."""
        held = sorted((r for r in rows if r.get("status") == "ok" and r.get("fingerprint_blob")),
                      key=lambda r: r["asset_id"])
        entries = [(r["asset_id"], r["fingerprint_blob"], self.hashes(r)) for r in held]
        key = put_blob(self.objects, "fingerprint_packs", pack_bytes(entries), ".bin") if entries else None
        for row in rows:
            row["fingerprint_pack"] = None
        for row in held:
            row["fingerprint_pack"] = key
        return key


def indexed_videos(rows: Sequence[Mapping[str, Any]], prints: Prints) -> list[IndexedVideo]:
    """A drop's fingerprinted videos as the near-duplicate index holds them (hashes read only for a
    video the index does not hold yet: from the drop's pack)."""
    return [IndexedVideo(r["asset_id"], r["fingerprint_blob"], r.get("near_duplicate_of") or r["asset_id"],
                         lambda r=r: prints.hashes(r))
            for r in rows if r.get("status") == "ok" and r.get("fingerprint_blob")]


class Neighbourhood:
    """What a drop's decision reads of the other drops, found through the near-duplicate index: the
    stored videos sharing a sampled frame with this drop's (within ``max_hamming``) and every copy in
    their groups, as their drops' stored rows (``read_drop``: a drop's rows, each drop read at most
    once). ``rows`` holds everything served so far."""

    def __init__(self, index: NearDuplicateIndex, read_drop: Callable[[str], list[dict]], drop: str,
                 max_hamming: int, prints: Prints):
        self.index, self.read_drop, self.drop, self.max_hamming, self.prints = index, read_drop, drop, max_hamming, prints
        self._drops: dict[str, dict[str, dict]] = {}
        self.served: dict[str, dict] = {}

    @property
    def rows(self) -> list[dict]:
        return list(self.served.values())

    @property
    def drops(self) -> set[str]:
        return {r["source_shard"] for r in self.served.values()}

    def __call__(self, here: Sequence[Mapping[str, Any]]) -> list[dict]:
        hashes = [self.prints.hashes(r) for r in here if r.get("status") == "ok" and r.get("fingerprint_blob")]
        if not hashes:
            return []
        found = self.index.neighbours(np.concatenate(hashes), self.max_hamming, skip_drop=self.drop)
        out = []
        for f in self.index.groups(found, skip_drop=self.drop):
            if f.drop not in self._drops:
                self._drops[f.drop] = {r["asset_id"]: r for r in self.read_drop(f.drop)}
            row = self._drops[f.drop].get(f.asset_id)
            if row is not None:  # (an index behind its table: the row is gone, so is the copy)
                self.served[f"{f.drop}/{f.asset_id}"] = row
                out.append(row)
        return out


def rank(tier_priority: Sequence[str], canonical: str = "rights_first") -> Callable[[Mapping[str, Any]], tuple]:
    """Sort key of the canonical rule among the copies no other holds (best first): ``rights_first``
    tier, then quality; ``quality_first`` quality, then tier; then URI."""
    if canonical not in ("rights_first", "quality_first"):
        raise ValueError(f"near_duplicates.canonical must be rights_first or quality_first, got {canonical!r}")
    order = {tier: i for i, tier in enumerate(tier_priority)}

    def key(row: Mapping[str, Any]) -> tuple:
        quality = row.get("quality_key")
        quality = -float(quality) if quality is not None and quality == quality else 0.0
        tier = row.get("source_tier") or ""
        rights = (order.get(tier, len(order)), "" if tier in order else tier)
        return ((*rights, quality) if canonical == "rights_first" else (quality, *rights)) + (row["uri"],)

    return key


def held_copies(members: Sequence[int], rows: Sequence[Mapping[str, Any]],
                evidence: Mapping[tuple[int, int], dict]) -> set[int]:
    """The members whose footage another member holds and exceeds: for a pair's evidence (this run's
    alignment, or the ``match`` another drop stored), the shorter copy when the aligned span covers
    less than ``SAME_FOOTAGE`` of the longer one."""
    inside = set(members)
    held = set()
    for (a, b), found in evidence.items():
        if a not in inside or b not in inside or found.get("overlap_longer") is None:
            continue
        if float(found["overlap_longer"]) < SAME_FOOTAGE:
            da, db = (float(rows[k].get("duration_s") or 0.0) for k in (a, b))
            held.add(a if da <= db else b)
    return held if len(held) < len(inside) else set()  # (contradictory evidence: every copy eligible)


def _stored_evidence(rows: Sequence[Mapping[str, Any]], index_of: Mapping[str, int],
                     start: int) -> dict[tuple[int, int], dict]:
    """The pair evidence other drops' decisions stored (the ``match`` of each row from ``start`` on:
    with whom, how)."""
    found = {}
    for i, r in enumerate(rows[start:], start=start):
        if r.get("match"):
            match = json.loads(r["match"])
            j = index_of.get(match.get("with") or "")
            if j is not None:
                found[(i, j)] = match
    return found


def _candidates(hashes: list[np.ndarray], here: list[int], max_hamming: int) -> set[tuple[int, int]]:
    """Pairs (i, j), i in ``here``, j != i, with at least one frame pair within ``max_hamming``
    (``hashes[i]``: every hash of row i, its kinds stacked)."""
    import faiss

    sizes = [len(h) for h in hashes]
    if not sum(sizes):
        return set()
    stacked = np.ascontiguousarray(np.concatenate(hashes))
    owner_of = np.repeat(np.arange(len(hashes), dtype=np.int64), sizes)
    index = faiss.IndexBinaryFlat(256)
    index.add(stacked)
    pairs: set[tuple[int, int]] = set()
    for i in here:
        if not sizes[i]:
            continue
        _, _, ids = index.range_search(np.ascontiguousarray(hashes[i]), max_hamming + 1)
        for j in np.unique(owner_of[ids]).tolist():
            if j != i:
                pairs.add((i, int(j)))
    return pairs


def relation(a: Fingerprint, b: Fingerprint, settings: NearDuplicateSettings,
             al: Alignment | None = None) -> tuple[str, dict] | None:
    """("near_duplicate" | "a_contains_b" | "b_contains_a", evidence), or None: the rule above, on
    their alignment (``al``: already computed). Agreement is measured where both videos were
    sampled (sparse long-GOP samples compare only where the other side looked); the extent comes
    from the alignment line and the durations."""
    al = al or align(a, b, settings.max_hamming, settings.max_speed_change)
    if al is None or al.compared < MIN_COMPARED:
        return None
    a_shorter = a.duration_s <= b.duration_s
    overlap_short, overlap_long = (al.overlap_a, al.overlap_b) if a_shorter else (al.overlap_b, al.overlap_a)
    agreement = min(al.share_a, al.share_b)
    visual = agreement >= settings.min_share
    heard = (al.audio_share is not None and al.audio_share >= settings.min_share
             and agreement >= settings.min_share / 2)
    if not (visual or heard) or overlap_short < settings.min_share:
        return None
    evidence = {"agreement": round(agreement, 3), "overlap_shorter": round(overlap_short, 3),
                "overlap_longer": round(overlap_long, 3), "compared_bins": al.compared, "speed": al.speed,
                "offset_s": al.offset_s, "pairs": al.pairs, "audio_share": al.audio_share}
    if overlap_long >= settings.min_share_longer:
        return "near_duplicate", evidence
    return ("b_contains_a" if a_shorter else "a_contains_b"), {**evidence, "span_a": list(al.span_a),
                                                              "span_b": list(al.span_b)}


def inconclusive(a: Fingerprint, b: Fingerprint, settings: NearDuplicateSettings,
                 al: Alignment | None = None) -> bool:
    """Whether a candidate pair the rule rejected lacks the evidence to reject it: fewer than
    ``MIN_COMPARED`` seconds where each could confirm the other, or at least half the agreement the
    rule asks for. Different videos sharing a frame or two (edits of the same footage) disagree over
    the seconds compared: settled, not retaken."""
    al = al or align(a, b, settings.max_hamming, settings.max_speed_change)
    return al is not None and (al.compared < MIN_COMPARED or min(al.share_a, al.share_b) >= settings.min_share / 2)


def decide(here: list[dict], others: list[dict] | Callable[[list[dict]], list[dict]], prints: Prints, settings: NearDuplicateSettings,
           tier_priority: Sequence[str], whole_grid: Mapping[str, str] | None = None,
           down: Collection[str] = ()) -> Outcome:
    """Fill the decision columns of this drop's fingerprint rows (``here``, in place) against
    ``others`` (the other drops' stored rows: every one, or a ``Neighbourhood`` giving those that
    share a frame with ``here`` and their groups; ``whole_grid``: asset_id -> the whole-grid
    fingerprint this run took of another drop's budgeted video, used instead of its stored one),
    reading the stored fingerprints through ``prints``. ``down``: assets a takedown took down:
    never canonical, so the best copy still up is promoted and analysed."""
    out = Outcome()
    for row in here:
        row.update(near_duplicate_of=None, near_duplicate_of_uri=None, match=None, contains=None, contained_in=None,
                   group_size=None, generated_match=None)
    whole_grid = whole_grid or {}
    if callable(others):
        others = others(here)
    others = [{**r, "fingerprint_blob": whole_grid[r["asset_id"]], "whole_grid": True} if r["asset_id"] in whole_grid
              else r for r in others]
    rows = [r for r in here if r.get("status") == "ok"] + [r for r in others if r.get("status") == "ok"]
    n_here = sum(1 for r in here if r.get("status") == "ok")
    if not rows:
        return out
    prints.read_packs(rows)
    fps = _Lazy(prints, rows)
    index_of = {r["asset_id"]: i for i, r in enumerate(rows)}
    uf = UnionFind()
    uf.add(len(rows))
    for i, r in enumerate(rows[n_here:], start=n_here):  # what the other drops decided among themselves
        j = index_of.get(r.get("near_duplicate_of") or "")
        if j is not None and j >= n_here:
            uf.union(i, j)
    matches: dict[int, dict[int, dict]] = {}
    contains: dict[int, list[dict]] = {}
    generated: dict[int, list[dict]] = {}  # real video -> the model-generated videos it copies or holds
    pairs = {tuple(sorted(p, key=lambda k: rows[k]["asset_id"]))  # the same alignment whichever drop runs
             for p in _candidates([prints.hashes(r) for r in rows], list(range(n_here)), settings.max_hamming)}
    open_pairs: list[tuple[int, int, Alignment | None]] = []  # candidates the rule rejected: undecided if budgeted
    for a, b in sorted(pairs):
        al = align(fps[a], fps[b], settings.max_hamming, settings.max_speed_change)
        found = relation(fps[a], fps[b], settings, al)
        out.pairs_aligned += 1
        if found is None:
            open_pairs.append((a, b, al))
            continue
        kind, evidence = found
        if settings.firewall_generated and bool(rows[a].get("synthetic")) != bool(rows[b].get("synthetic")):
            real, made = (a, b) if not rows[a].get("synthetic") else (b, a)
            hit = {"asset_id": rows[made]["asset_id"], "uri": rows[made]["uri"], "relation": kind,
                   **{k: v for k, v in evidence.items() if not k.startswith("span_")}}
            generated.setdefault(real, []).append(hit)
            continue  # a copy of generated footage never joins a group of real footage
        if kind == "near_duplicate":
            uf.union(a, b)
            matches.setdefault(a, {})[b] = evidence
            matches.setdefault(b, {})[a] = evidence
        else:
            long_, short = (a, b) if kind == "a_contains_b" else (b, a)
            span = evidence.pop("span_a") if long_ == a else evidence.pop("span_b")
            contains.setdefault(long_, []).append({"asset_id": rows[short]["asset_id"], "uri": rows[short]["uri"],
                                                   "span_s": span, **evidence})
    for a, b, al in open_pairs:  # a pair already grouped through other matches needs no more samples
        budgeted = [k for k in (a, b) if not rows[k].get("whole_grid")]
        if not budgeted or uf.find(a) == uf.find(b) or not inconclusive(fps[a], fps[b], settings, al):
            continue
        out.undecided |= {rows[k]["asset_id"] for k in budgeted if k < n_here}
        if settings.retake_undecided:
            taken = {r["asset_id"] for r in out.borrow}
            out.borrow += [rows[k] for k in budgeted if k >= n_here and rows[k]["asset_id"] not in taken]
    best_first = rank(tier_priority, settings.canonical)
    evidence = {**_stored_evidence(rows, index_of, start=n_here),  # what other drops decided among themselves
                **{(a, b): e for a, found in matches.items() for b, e in found.items()}}  # this run's alignments
    groups: dict[int, list[int]] = {}
    for i in range(len(rows)):
        groups.setdefault(uf.find(i), []).append(i)
    for members in groups.values():
        held = held_copies(members, rows, evidence)
        up = [k for k in members if rows[k]["asset_id"] not in down]
        canonical = min([k for k in up if k not in held] or up or members, key=lambda k: best_first(rows[k]))
        for k in members:
            should = None if k == canonical else rows[canonical]["asset_id"]
            if k < n_here:
                row = rows[k]
                row["group_size"] = len(members)
                if should:
                    row["near_duplicate_of"], row["near_duplicate_of_uri"] = should, rows[canonical]["uri"]
                    direct = matches.get(k, {})
                    via = canonical if canonical in direct else (min(direct) if direct else None)
                    if via is not None:
                        row["match"] = json.dumps({"with": rows[via]["asset_id"], **direct[via]}, sort_keys=True)
                    out.near_duplicates += 1
            elif (rows[k].get("near_duplicate_of") or None) != should:  # (a stale group_size alone asks nothing)
                out.requests.add(rows[k]["source_shard"])
    inside: dict[int, list[dict]] = {}
    for k, found in contains.items():
        if k < n_here:
            rows[k]["contains"] = json.dumps(sorted(found, key=lambda c: c["asset_id"]), sort_keys=True)
            out.contains += len(found)
        for c in found:  # the contained video's row says where it sits: an older compilation is not re-run
            short = index_of[c["asset_id"]]
            if short < n_here:
                inside.setdefault(short, []).append({**{k2: v for k2, v in c.items() if k2 not in ("asset_id", "uri")},
                                                     "asset_id": rows[k]["asset_id"], "uri": rows[k]["uri"]})
    for k, found in inside.items():
        rows[k]["contained_in"] = json.dumps(sorted(found, key=lambda c: c["asset_id"]), sort_keys=True)
    for k, hits in generated.items():
        if k < n_here:
            rows[k]["generated_match"] = json.dumps(sorted(hits, key=lambda c: c["asset_id"]), sort_keys=True)
            out.generated_matches += 1
        elif not {h["asset_id"] for h in hits} <= _stored_hits(rows[k]):
            out.requests.add(rows[k]["source_shard"])  # an older real copy of newly registered generated footage
    out.requests -= {r["source_shard"] for r in here}
    return out


class _Lazy:
    """``rows``' fingerprints by position, loaded on first use."""

    def __init__(self, prints: Prints, rows: list[dict]):
        self.prints, self.rows = prints, rows

    def __getitem__(self, k: int) -> Fingerprint:
        return self.prints.fingerprint(self.rows[k])


def _stored_hits(row: Mapping[str, Any]) -> set[str]:
    value = row.get("generated_match")
    return {h["asset_id"] for h in json.loads(value)} if value else set()


def regroup_drops(fingerprints: Sequence[Mapping[str, Any]], down: Collection[str]) -> dict[str, list[str]]:
    """The drops whose near-duplicate decision a takedown makes stale: drop -> the URIs there that
    stood in for a copy now taken down (``near_duplicate_of`` it) and are still up. Their
    ``video_fingerprint`` decides again (fingerprints reused): the best copy still up is promoted
    and analysed, so the footage is not lost with the copy."""
    found: dict[str, list[str]] = {}
    for row in fingerprints:
        if row.get("status") == "ok" and row.get("near_duplicate_of") in down and row["asset_id"] not in down:
            found.setdefault(row["source_shard"], []).append(row["uri"])
    return {drop: sorted(uris) for drop, uris in sorted(found.items())}


def kept_out(row: Mapping[str, Any]) -> str | None:
    """Why a video is not analysed (so never reaches training), or None."""
    if row.get("blocked"):
        return str(row["blocked"])
    if row.get("near_duplicate_of"):
        return f"near-duplicate of {row.get('near_duplicate_of_uri') or row['near_duplicate_of']}"
    if row.get("generated_match"):
        return "matches model-generated video " + ", ".join(h["uri"] for h in json.loads(row["generated_match"]))
    return None


_NOT_DECIDED = dict(near_duplicate_of=None, near_duplicate_of_uri=None, match=None, contains=None, contained_in=None,
                    group_size=None, generated_match=None)


def fingerprint_drop(bucket: Any, objects: ObjectStore, videos: list[dict], probe_rows: list[dict],
                     index_rows: list[dict], previous: Any, others: list[dict] | Neighbourhood, row_version: Any, whole_grid: Any,
                     near: NearDuplicateSettings, tier_priority: Sequence[str], limits: Any, max_runs: int,
                     log: Callable[[str], None], engine: Any,
                     videos_of: Callable[[list[dict]], list[dict]],
                     down: Collection[str] = (), prints: Prints | None = None,
                     ) -> tuple[list[dict], Any, Outcome | None, Prints]:
    """A drop's fingerprint rows and its near-duplicate decision against ``others`` (the other drops'
    fingerprint rows, or the ``Neighbourhood`` that finds those the decision needs). A pair the budgeted samples cannot decide is retaken on the whole grid: this
    drop's video in the fingerprint step, another drop's by borrowing it (``videos_of`` gives those
    videos with their probe facts and packet index), until no candidate pair is left to borrow.
    ``down``: assets taken down (never canonical). Writes the drop's fingerprint pack (what later
    drops' decisions read of it)."""
    from vidassets.media.drop_steps import fingerprint_partition, whole_grid_prints

    prints = prints or Prints(objects)  # every stored fingerprint this run reads, read once
    decided: list[Outcome] = []  # each decision this run made; the last one saw the final rows
    borrowed: dict[str, str] = {}  # other drops' videos this run took on the whole grid to decide
    asked: set[str] = set()  # each borrowed at most once (one that cannot be taken stays undecided)
    borrow_stats: list = []

    def undecided(rows: list[dict]) -> set[str]:
        while True:  # a borrowed whole grid can raise new candidate pairs: until none is left to borrow
            decided.append(outcome := decide(rows, others, prints, near, tier_priority, borrowed, down))
            wanted = [r for r in outcome.borrow if r["asset_id"] not in asked]
            if not wanted:
                return outcome.undecided
            asked.update(r["asset_id"] for r in wanted)
            found, taken = whole_grid_prints(bucket, objects, videos_of(wanted), whole_grid, near, limits, log, engine)
            borrowed.update(found)
            borrow_stats.append(taken)

    rows, stats = fingerprint_partition(bucket, objects, videos, probe_rows, index_rows, previous, row_version,
                                        whole_grid, near, limits, max_runs, log, engine,
                                        retake=undecided if near.enabled and near.retake_undecided else None)
    for taken in borrow_stats:
        stats.frames_decoded += taken.frames_decoded
        stats.merge(taken.extra)
    outcome = None
    if near.enabled:
        outcome = decided[-1] if decided else decide(rows, others, prints, near, tier_priority, down=down)
    else:
        for row in rows:
            row.update(_NOT_DECIDED)
    prints.write_pack(rows)
    return rows, stats, outcome, prints
