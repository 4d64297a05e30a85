"""Hash-list blocking at ingest: known abusive material, matched on the fingerprints' PDQ hashes.

Legal and safety teams receive lists of perceptual hashes of known abusive images and video frames
through industry hash-sharing programs (PDQ for images and frames, the format those programs
exchange: one 64-hex-digit PDQ hash a line, optionally followed by fields of metadata such as a
list item id). ``safety.hash_lists`` names such files (local paths or object URIs); every sampled
frame of every video fingerprinted at ingest (whole frame, square and inner crops) is matched
against them within ``safety.max_hamming`` bits. A video with a match, and every copy the
near-duplicate decision ties to it, is blocked: ``blocked:<list>`` on its fingerprint row, never
analysed or decoded further, so never in a clip, a score or a snapshot, and reported in the
``safety_reports`` table for the reporting path. The lists' contents are part of the fingerprint
decision's version: a list update re-checks every stored fingerprint without decoding anything.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

VERSION = "hash-lists-v1"
_LINE = re.compile(r"^([0-9a-fA-F]{64})(?:[\s,;|]+(.*))?$")


@dataclass(frozen=True)
class HashList:
    name: str
    """The file's stem: what ``blocked:<list>`` and the reports name."""
    hashes: np.ndarray
    """(n, 32) uint8: the PDQ hashes."""
    items: tuple[str, ...]
    """Each hash's metadata as the list gave it (an item id, a label), '' where none."""
    digest: str
    """sha256 of the file's bytes (what the decision's version names)."""


def parse(name: str, data: bytes) -> HashList:
    """A list from its bytes: one PDQ hash (64 hex digits) a line, optional metadata after it; blank
    lines and ``#`` comments skipped. A malformed line is a ValueError naming the list and line."""
    hashes, items = [], []
    for number, raw in enumerate(data.decode("utf-8", errors="strict").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        found = _LINE.match(line)
        if not found:
            raise ValueError(f"safety.hash_lists: {name} line {number} is not a PDQ hash (64 hex digits, "
                             f"then optional metadata): {line[:80]!r}")
        hashes.append(np.frombuffer(bytes.fromhex(found.group(1)), np.uint8))
        items.append((found.group(2) or "").strip())
    array = np.stack(hashes) if hashes else np.zeros((0, 32), np.uint8)
    return HashList(name, array, tuple(items), hashlib.sha256(data).hexdigest())


def load(uris: Sequence[str], read: Callable[[str], bytes]) -> list[HashList]:
    """Every configured list (``read``: bytes of a local path or object URI)."""
    out = []
    for uri in uris:
        try:
            data = read(uri)
        except (FileNotFoundError, KeyError) as exc:
            raise FileNotFoundError(f"safety.hash_lists: {uri} cannot be read ({exc})") from None
        out.append(parse(Path(uri.rstrip("/")).stem, data))
    return out


def lists_version(lists: Sequence[HashList], max_hamming: int) -> str:
    """What the decision's version names: the lists' contents and the threshold."""
    if not lists:
        return ""
    return f"{VERSION}+d{max_hamming}+{hashlib.sha256(json.dumps(sorted(h.digest for h in lists)).encode()).hexdigest()[:12]}"


def matches(hashes: np.ndarray, lists: Sequence[HashList], max_hamming: int) -> list[dict[str, Any]]:
    """The list entries within ``max_hamming`` of any of ``hashes`` ((n, 32) uint8): one hit per
    (list, entry), at its closest distance."""
    import faiss

    hits = []
    if not len(hashes):
        return hits
    for hl in lists:
        if not len(hl.hashes):
            continue
        index = faiss.IndexBinaryFlat(256)
        index.add(np.ascontiguousarray(hl.hashes))
        lims, distances, found = index.range_search(np.ascontiguousarray(hashes), max_hamming + 1)
        best: dict[int, int] = {}
        for entry, distance in zip(found.tolist(), distances.tolist(), strict=True):
            best[entry] = min(distance, best.get(entry, 256))
        hits += [{"list": hl.name, "entry": hl.hashes[e].tobytes().hex(), "item": hl.items[e], "distance": int(d)}
                 for e, d in sorted(best.items())]
    return hits


def block(rows: list[dict], others: Sequence[Mapping[str, Any]], hashes_of: Callable[[Mapping[str, Any]], np.ndarray],
          lists: Sequence[HashList], max_hamming: int) -> list[dict[str, Any]]:
    """Set ``blocked`` on this drop's fingerprint ``rows`` (in place): ``blocked:<list>`` for a video
    whose sampled frames match a list, and for every copy the near-duplicate decision ties to a
    matched one (its canonical, or another drop's copy already blocked); None otherwise. Returns
    the reports (one per direct match)."""
    reports = []
    direct: dict[str, str] = {}
    for row in rows:
        row["blocked"] = None
        if row.get("status") != "ok" or not row.get("fingerprint_blob") or not lists:
            continue
        hits = matches(hashes_of(row), lists, max_hamming)
        if hits:
            direct[row["asset_id"]] = f"blocked:{hits[0]['list']}"
            reports += [{"asset_id": row["asset_id"], "uri": row["uri"], "source_shard": row["source_shard"],
                         "list": h["list"], "list_entry": h["entry"], "list_item": h["item"],
                         "distance": h["distance"], "tied_to": None} for h in hits]
    blocked = {**{r["asset_id"]: r["blocked"] for r in others if r.get("blocked")}, **direct}
    # a group is blocked as a whole: its canonical copy and every copy pointing at a blocked one
    canonical_of = {r["asset_id"]: r.get("near_duplicate_of") for r in [*others, *rows] if r.get("near_duplicate_of")}
    for asset, why in list(blocked.items()):
        head = canonical_of.get(asset)
        if head and head not in blocked:
            blocked[head] = why
    for row in rows:
        reason = blocked.get(row["asset_id"]) or blocked.get(row.get("near_duplicate_of") or "")
        if reason:
            row["blocked"] = reason
            if row["asset_id"] not in direct:
                tied = row.get("near_duplicate_of") or next(a for a, h in canonical_of.items() if h == row["asset_id"]
                                                            and a in blocked)
                reports.append({"asset_id": row["asset_id"], "uri": row["uri"], "source_shard": row["source_shard"],
                                "list": reason.split(":", 1)[1], "list_entry": None, "list_item": None,
                                "distance": None, "tied_to": tied})
    return reports
