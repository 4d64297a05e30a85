"""The global stages past one machine, in simulation: measure one shard here, model 10^8 clips.

    python bench/global_scale.py [--shard-clips 50000] [--clips 1e8] [--drop-clips 100000]

Dedup (perceptual) shards naturally: every LSH table of ``curate.dedup`` is independent, and within
a table the sorted keys split by key range, so shard (table, range) finds its equal-key frame pairs
alone; the candidate clip pairs are then verified exactly by shards keyed on the smaller clip id
(each holding its clips' PDQ hashes). Semantic search shards by clip id into faiss IVF-PQ indexes;
a query is broadcast to every shard and the per-shard top-k merged.

Measured here on one shard of ``--shard-clips`` synthetic clips (8 PDQ hashes each, 5% planted
near-duplicate pairs at Hamming 24; 1280-d vectors, the default embedder's size), with vidassets'
own code for the dedup side (``_lsh_candidates`` for one table, ``_pair_shares`` for verification):
CPU seconds per table-shard, per verified pair, and for IVF-PQ training, adding and searching, plus
the bytes each holds. The model scales those to ``--clips`` (the sort in a table-shard is
n·log n: the model keeps each shard at the measured size, so cost is linear in shards) and to a new
drop of ``--drop-clips`` (looked up in sorted shard keys: measured ``searchsorted`` cost per key).

The last line is the figures as JSON (also written under "figures" to bench/results/global_scale.json;
no target is stated, so its verdict is empty).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from common import REPO, cpu_seconds, write_results

from vidassets.config import DedupSettings
from vidassets.curate import dedup

FRAMES = 8
DIM = 1280


def planted_hashes(clips: int, rng: np.random.Generator, share: float = 0.05, distance: int = 24):
    hashes = rng.integers(0, 256, size=(clips * FRAMES, 32), dtype=np.uint8)
    owner = np.repeat(np.arange(clips, dtype=np.int64), FRAMES)
    pairs = int(clips * share / 2)
    for c in range(pairs):  # clip 2c+1 is a near-duplicate of clip 2c
        src = hashes[2 * c * FRAMES:(2 * c + 1) * FRAMES]
        bits = np.unpackbits(src, axis=1)
        for row in bits:
            row[rng.choice(256, distance, replace=False)] ^= 1
        hashes[(2 * c + 1) * FRAMES:(2 * c + 2) * FRAMES] = np.packbits(bits, axis=1)
    return hashes, owner, pairs


def timed(fn, *args, **kw):
    start = cpu_seconds()
    out = fn(*args, **kw)
    return out, cpu_seconds() - start


def dedup_shard(clips: int, rng: np.random.Generator) -> dict:
    hashes, owner, planted = planted_hashes(clips, rng)
    settings = DedupSettings()
    tables = dedup.lsh_tables(settings.max_hamming)
    pairs, per_table_s = timed(dedup._lsh_candidates, hashes, owner, 0, 1)
    all_pairs, all_tables_s = timed(dedup._lsh_candidates, hashes, owner, 0, tables)
    shares, verify_s = timed(dedup._pair_shares, hashes, owner, clips, all_pairs, settings.max_hamming)
    found = int(np.sum((all_pairs[:, 1] == all_pairs[:, 0] + 1) & (all_pairs[:, 0] % 2 == 0)
                       & (all_pairs[:, 1] < 2 * planted)))
    sorted_keys = np.sort(rng.integers(0, 2**32, size=len(hashes), dtype=np.uint64))
    probe_keys = rng.integers(0, 2**32, size=200_000, dtype=np.uint64)
    _, lookup_s = timed(np.searchsorted, sorted_keys, probe_keys)
    return {"clips": clips, "frames": len(hashes), "tables": tables, "table_shard_cpu_s": round(per_table_s, 3),
            "all_tables_cpu_s": round(all_tables_s, 3), "candidate_pairs": len(all_pairs),
            "planted_pairs": planted, "planted_found": found, "verify_cpu_s": round(verify_s, 3),
            "verify_us_per_pair": round(verify_s * 1e6 / max(1, len(all_pairs)), 3),
            "table_shard_bytes": len(hashes) * 16,  # packed (key, position) + owner per frame
            "hash_bytes": hashes.nbytes,
            "lookup_us_per_key": round(lookup_s * 1e6 / len(probe_keys), 4),
            "linked_pairs": int((shares >= settings.min_frame_share).sum())}


def semantic_shard(clips: int, rng: np.random.Generator, queries: int = 2000) -> dict:
    import faiss

    centers = rng.standard_normal((2000, DIM)).astype(np.float32)
    vectors = centers[rng.integers(0, len(centers), clips)] + 0.5 * rng.standard_normal((clips, DIM)).astype(np.float32)
    faiss.normalize_L2(vectors)
    nlist, m = max(64, int(4 * np.sqrt(clips))), 64
    index = faiss.IndexIVFPQ(faiss.IndexFlatIP(DIM), DIM, nlist, m, 8, faiss.METRIC_INNER_PRODUCT)
    _, train_s = timed(index.train, vectors[: min(clips, 40 * nlist)])
    _, add_s = timed(index.add, vectors)
    index.nprobe = 16
    _, search_s = timed(index.search, vectors[:queries], 50)
    _, coarse_s = timed(index.quantizer.search, vectors[:queries], index.nprobe)
    search_ms, coarse_ms = search_s * 1000 / queries, coarse_s * 1000 / queries
    return {"clips": clips, "dim": DIM, "nlist": nlist, "pq_bytes": m, "nprobe": index.nprobe,
            "train_cpu_s": round(train_s, 2), "add_us_per_vector": round(add_s * 1e6 / clips, 2),
            "search_ms_per_query": round(search_ms, 4), "coarse_ms_per_query": round(coarse_ms, 4),
            "scan_ns_per_code": round(max(search_ms - coarse_ms, 0) * 1e6 / (index.nprobe * clips / nlist), 2),
            "index_bytes": clips * (m + 8) + nlist * DIM * 4}


def model(d: dict, s: dict, clips: float, drop: float, frames_per_shard: float, vectors_per_shard: float) -> dict:
    """Scale the measured shards to ``clips``. Dedup: each LSH table's keys split into ranges of
    ``frames_per_shard`` keys; a sort costs n·log n, so the per-key cost grows by log(n')/log(n);
    the candidate pairs to verify are the linked ones (linear in n) plus the random pairs of frames
    that share a key (n^2).
    Semantic: one IVF-PQ codebook trained once (k-means cost ~ nlist² at 40 training vectors per
    list) and shared by shards of ``vectors_per_shard`` vectors (nlist' = 4·sqrt(n') each); a query
    costs the coarse search (linear in nlist) plus nprobe lists of n'/nlist' codes on every shard."""
    frames = clips * FRAMES
    n0 = d["frames"]
    key_cost = d["table_shard_cpu_s"] / n0 * np.log2(frames_per_shard) / np.log2(n0)
    full_tables_cpu = d["tables"] * frames * key_cost
    # planted near copies grow with the clips; random pairs sharing a key grow with the pairs of frames,
    # as n^2 (bench/global_ray.py measures the exponent: about 2.2 over 6e4 - 2.4e5 clips)
    planted = d["linked_pairs"]
    pairs = planted / d["clips"] * clips + (d["candidate_pairs"] - planted) * (clips / d["clips"]) ** 2
    verify_cpu = pairs * d["verify_us_per_pair"] / 1e6
    drop_lookup_cpu = drop * FRAMES * d["tables"] * d["lookup_us_per_key"] / 1e6 * np.log2(frames_per_shard) / np.log2(n0)
    shards = int(np.ceil(clips / vectors_per_shard))
    nlist = 4 * np.sqrt(vectors_per_shard)
    train_cpu = s["train_cpu_s"] * (nlist / s["nlist"]) ** 2
    query_ms = (s["coarse_ms_per_query"] * nlist / s["nlist"]
                + s["nprobe"] * vectors_per_shard / nlist * s["scan_ns_per_code"] / 1e6)
    coarse_us = s["coarse_ms_per_query"] * 1000  # an add assigns its list like a query's coarse search
    add_us = max(s["add_us_per_vector"] - coarse_us, 0) + coarse_us * nlist / s["nlist"]
    shard_bytes = vectors_per_shard * (s["pq_bytes"] + 8) + nlist * DIM * 4
    return {
        "clips": clips,
        "dedup": {
            "tables": d["tables"], "frames_per_table_shard": frames_per_shard,
            "table_shards": int(d["tables"] * np.ceil(frames / frames_per_shard)),
            "bytes_per_table_shard": frames_per_shard * 16, "pdq_hash_bytes_total": frames * 32,
            "candidate_pairs_total": round(pairs),
            "full_rebuild_cpu_hours": round((full_tables_cpu + verify_cpu) / 3600, 2),
            "new_drop_lookup_cpu_s": round(drop_lookup_cpu, 1),
        },
        "semantic": {
            "vectors_per_shard": vectors_per_shard, "shards": shards, "nlist_per_shard": round(nlist),
            "bytes_per_shard": round(shard_bytes), "bytes_total": round(shards * shard_bytes),
            "train_cpu_hours_once": round(train_cpu / 3600, 2),
            "add_cpu_hours": round(clips * add_us / 1e6 / 3600, 2),
            "query_ms_per_shard": round(query_ms, 3),
            "new_drop_search_cpu_hours": round(drop * shards * query_ms / 1000 / 3600, 3),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shard-clips", type=int, default=50_000)
    parser.add_argument("--clips", type=float, default=1e8)
    parser.add_argument("--drop-clips", type=float, default=1e5)
    parser.add_argument("--frames-per-table-shard", type=float, default=1e8)
    parser.add_argument("--vectors-per-shard", type=float, default=1e7)
    args = parser.parse_args()
    rng = np.random.default_rng(7)
    started = time.perf_counter()
    d = dedup_shard(args.shard_clips, rng)
    print(f"dedup shard of {d['clips']} clips ({d['frames']} hashes): one table {d['table_shard_cpu_s']} CPU-s, "
          f"{d['tables']} tables {d['all_tables_cpu_s']} s, {d['candidate_pairs']} candidate pairs verified in "
          f"{d['verify_cpu_s']} s; planted pairs found {d['planted_found']}/{d['planted_pairs']}")
    s = semantic_shard(args.shard_clips, rng)
    print(f"IVF-PQ shard of {s['clips']} x {s['dim']}-d: train {s['train_cpu_s']} s, add {s['add_us_per_vector']} us/vector, "
          f"search {s['search_ms_per_query']} ms/query (k 50, nprobe 16), {s['index_bytes'] / 2**20:.0f} MiB")
    m = model(d, s, args.clips, args.drop_clips, args.frames_per_table_shard, args.vectors_per_shard)
    md, ms = m["dedup"], m["semantic"]
    print(f"model for {args.clips:.0e} clips: dedup {md['table_shards']} table-shards of "
          f"{md['bytes_per_table_shard'] / 2**30:.1f} GiB, full rebuild {md['full_rebuild_cpu_hours']} CPU-h, a "
          f"{args.drop_clips:.0e}-clip drop {md['new_drop_lookup_cpu_s']} CPU-s of lookups; semantic {ms['shards']} "
          f"shards of {ms['bytes_per_shard'] / 2**30:.2f} GiB, codebook {ms['train_cpu_hours_once']} CPU-h once, adds "
          f"{ms['add_cpu_hours']} CPU-h, {ms['query_ms_per_shard']} ms per query per shard, a drop's queries "
          f"{ms['new_drop_search_cpu_hours']} CPU-h")
    out = {"dedup_shard": d, "semantic_shard": s, "model": m, "wall_s": round(time.perf_counter() - started, 1)}
    write_results(REPO / "bench/results/global_scale.json", sys.argv, out, {}, settings=vars(args))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
