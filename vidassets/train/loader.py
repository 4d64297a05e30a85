"""The loader: a torch ``IterableDataset`` that yields, per global step, this rank's slice of the
plan as ready tensors, read from the shards by byte offset (no tar scan, no replay). Start it at
any cursor (step, offset within the rank's slice) to resume exactly. ``text_mask`` marks the samples
that have a text embedding (a sample included without a caption has zeros there).

Where the shards are: a local directory, or any object store (``StoreShards``: S3 by HTTP range
requests, one request per sample covering its members, which lie next to each other in its tar).
Reads run on ``fetch_threads`` threads and run ahead ``prefetch_steps`` steps while the trainer
computes; each batch says how long it waited on them (``fetch_wait_s``), and ``fetch_wait_total``
sums it: the time a training step spent on data.

A takedown reaches a run in flight: given ``takedowns`` (the snapshot's samples taken down now, e.g.
``snapshot.taken_down_clips``), the loader re-reads it every ``recheck_steps`` steps and leaves those
samples out of their batches, counting them (``skipped_takedowns`` per batch, ``skipped_total``):
the run goes on, one sample short where it meets one, without a restart."""

from __future__ import annotations

import io
import json
import posixpath
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd
import torch

from vidassets.storage.objects import ObjectStore
from vidassets.train.plan import TrainPlan
from vidassets.train.shards import padded_text_states, restore_latents


class ShardSource(Protocol):
    def read(self, shard: str, offset: int, size: int) -> bytes: ...
    def text(self, name: str) -> str | None: ...


class LocalShards:
    """Shards in a local directory: files kept open, one per thread."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self._local = threading.local()

    def __getstate__(self) -> dict:
        return {"root": self.root}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["root"])

    def read(self, shard: str, offset: int, size: int) -> bytearray:
        files = self._local.__dict__.setdefault("files", {})
        f = files.get(shard)
        if f is None:
            f = files[shard] = open(self.root / shard, "rb")  # noqa: SIM115 - kept open across batches
        f.seek(offset)
        out = bytearray(size)
        f.readinto(out)
        return out

    def text(self, name: str) -> str | None:
        path = self.root / name
        return path.read_text() if path.exists() else None


class StoreShards:
    """Shards under ``prefix`` of an object store (``shards/v<N>``): a member is a range read."""

    def __init__(self, objects: ObjectStore, prefix: str):
        self.objects, self.prefix = objects, prefix.rstrip("/")

    def read(self, shard: str, offset: int, size: int) -> bytes:
        return self.objects.read_range(posixpath.normpath(f"{self.prefix}/{shard}"), offset, size)  # ../cas/...

    def text(self, name: str) -> str | None:
        key = f"{self.prefix}/{name}"
        return self.objects.get_bytes(key).decode() if self.objects.exists(key) else None


def npy(buffer: bytes | memoryview) -> np.ndarray:
    """An ``.npy`` member's array, over ``buffer`` (no copy)."""
    stream = io.BytesIO(buffer)
    version = np.lib.format.read_magic(stream)
    header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = header(stream)
    data = np.frombuffer(buffer, dtype=dtype, count=int(np.prod(shape)), offset=stream.tell())
    return data.reshape(shape, order="F" if fortran else "C")


class PlanDataset(torch.utils.data.IterableDataset):
    def __init__(self, plan: TrainPlan, shards: str | Path | ShardSource, index: pd.DataFrame, rank: int,
                 world_size: int, start_step: int = 0, start_offset: int = 0, steps: int | None = None,
                 takedowns: Callable[[], set[str]] | None = None, recheck_steps: int = 50,
                 prefetch_steps: int = 0, fetch_threads: int = 4):
        super().__init__()
        self._takedowns, self.recheck_steps = takedowns, recheck_steps
        self._down: set[str] = takedowns() if takedowns is not None else set()
        self.skipped_total = 0
        self.plan, self.rank, self.world = plan, rank, world_size
        self.source: ShardSource = shards if hasattr(shards, "read") else LocalShards(shards)
        # a sample's members, by (clip, shape bucket): one set per latents resolution it has
        self._where = {(r.clip_id, r.bucket): (r.shard, int(r.latents_offset), int(r.latents_size), int(r.text_offset),
                                               int(r.text_size)) for r in index.itertuples()}
        self._levels = ({(r.clip_id, r.bucket): json.loads(r.text_levels) for r in index.itertuples()
                         if isinstance(r.text_levels, str)} if "text_levels" in index else {})
        self._states = ({(r.clip_id, r.bucket): json.loads(r.text_states) for r in index.itertuples()
                         if isinstance(r.text_states, str)} if "text_states" in index else {})
        self._captions = ({r.clip_id: json.loads(r.captions) for r in plan.samples.itertuples() if isinstance(r.captions, str)}
                          if "captions" in plan.samples else {})
        self.start_step, self.start_offset, self.steps = start_step, start_offset, steps
        meta = json.loads(self.source.text("shards.json") or "{}")
        self._dtype = meta.get("latents_dtype", "bfloat16")
        self._states_meta = meta.get("text_states")
        self.prefetch_steps, self.fetch_threads = prefetch_steps, fetch_threads
        self.fetch_wait_total = 0.0
        self._pool: ThreadPoolExecutor | None = None
        self._ahead: dict[tuple[int, int], tuple] = {}

    def __getstate__(self) -> dict:  # to DataLoader workers: no threads, no reads in flight
        return {**self.__dict__, "_pool": None, "_ahead": {}}

    def _members(self, member: tuple[str, str], level: str) -> tuple[str, dict[str, tuple[int, int]]]:
        """The shard and the (offset, size) of each member the sample shows at ``level``."""
        shard, l_off, l_size, t_off, t_size = self._where[member]
        default = level == self.plan.caption_default
        if not default:
            t_off, t_size = self._levels.get(member, {}).get(level, (-1, 0))
        ranges = {"latents": (l_off, l_size)}
        if t_off >= 0:
            ranges["text"] = (t_off, t_size)
        states = self._states.get(member, {}).get("" if default else level) if self._states_meta else None
        if states is not None:
            ranges["states"] = (int(states[0]), int(states[1]))
        return shard, ranges

    def _read_sample(self, member: tuple[str, str], level: str) -> dict[str, np.ndarray]:
        """A sample's members in one read: they lie next to each other in its tar."""
        shard, ranges = self._members(member, level)
        start = min(o for o, _ in ranges.values())
        data = self.source.read(shard, start, max(o + n for o, n in ranges.values()) - start)
        block = memoryview(data if isinstance(data, bytearray) else bytearray(data))  # writable: tensors over it
        return {name: npy(block[o - start:o - start + n]) for name, (o, n) in ranges.items()}

    def _request(self, step: int, offset: int) -> tuple:
        """This rank's slice of ``step`` and its reads, started (on the fetch threads)."""
        if self.plan.global_batch % self.world:
            raise ValueError(f"global batch {self.plan.global_batch} is not divisible by world size {self.world}")
        sl = self.plan.step(step)
        clip_ids = sl.clip_ids[self.rank::self.world][offset:]
        levels = sl.caption_levels[self.rank::self.world][offset:]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.fetch_threads, thread_name_prefix="vidassets-fetch")
        reads: list[Future | None] = [None if clip in self._down else
                                      self._pool.submit(self._read_sample, (clip, sl.bucket), level)
                                      for clip, level in zip(clip_ids, levels, strict=True)]
        return sl, clip_ids, levels, reads

    def batch(self, step: int, offset: int = 0) -> dict:
        """This rank's samples of ``step``: latents, and per sample the caption level the plan shows
        it this epoch (``caption_levels``), that caption's text and its text embedding (masked where
        the sample has none); ``fetch_wait_s``: how long this call waited on reads."""
        sl, clip_ids, levels, reads = self._ahead.pop((step, offset), None) or self._request(step, offset)
        started = time.perf_counter()
        fetched = [read.result() if read is not None else None for read in reads]
        waited = time.perf_counter() - started
        self.fetch_wait_total += waited
        kept = [i for i, clip in enumerate(clip_ids) if clip not in self._down and fetched[i] is not None]
        skipped = len(clip_ids) - len(kept)
        self.skipped_total += skipped
        latents, texts, captions, states = [], [], [], []
        for i in kept:
            members, level = fetched[i], levels[i]
            latents.append(restore_latents(members["latents"], self._dtype))
            texts.append(torch.from_numpy(members["text"].copy()) if "text" in members else None)
            captions.append(self._captions.get(clip_ids[i], {}).get(level))
            states.append(padded_text_states(members["states"], self._states_meta["dtype"], self._states_meta["max_tokens"])
                          if "states" in members else None)
        levels = [levels[i] for i in kept]
        out = {"step": step, "clip_ids": [clip_ids[i] for i in kept], "bucket": sl.bucket,
               "latents": torch.stack(latents) if latents else None, "caption_levels": levels, "captions": captions,
               "skipped_takedowns": skipped, "fetch_wait_s": waited}
        out["text_embeddings"], out["text_mask"] = _stack_with_mask(texts)
        if self._states_meta is not None:  # a per-token encoder: (B, max_tokens, dim) zero-padded + (B, max_tokens) mask
            out["text_states"], out["text_states_mask"] = _stack_states(states, self._states_meta)
        return out

    def __iter__(self) -> Iterator[dict]:
        step, offset = self.start_step, self.start_offset
        end = None if self.steps is None else self.start_step + self.steps
        try:
            while end is None or step < end:
                if self._takedowns is not None and step > self.start_step and (step - self.start_step) % self.recheck_steps == 0:
                    self._down = self._takedowns()  # a takedown since the run started reaches it here
                for ahead in range(step + 1, step + 1 + self.prefetch_steps):  # the next steps' reads, started now
                    if (end is None or ahead < end) and (ahead, 0) not in self._ahead:
                        self._ahead[(ahead, 0)] = self._request(ahead, 0)
                yield self.batch(step, offset)
                step, offset = step + 1, 0
        finally:
            self.close()

    def close(self) -> None:
        """Stop the reads in flight and the fetch threads."""
        self._ahead.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _stack_with_mask(texts: list[torch.Tensor | None]) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Text embeddings of a batch as one tensor, zeros where a sample has none, and the mask saying
    which rows are real: one sample without a caption never drops the others' text."""
    mask = torch.tensor([t is not None for t in texts], dtype=torch.bool)
    present = [t for t in texts if t is not None]
    if not present:
        return None, mask
    blank = torch.zeros_like(present[0])
    return torch.stack([t if t is not None else blank for t in texts]), mask


def _stack_states(states: list, meta: dict) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Token states of a batch, (B, max_tokens, dim), and their mask, (B, max_tokens): a sample without
    states (no caption at its level) is all zeros and all False, as an empty prompt would be masked."""
    present = [s for s in states if s is not None]
    if not present:
        return None, torch.zeros((len(states), meta["max_tokens"]), dtype=torch.bool)
    blank = (torch.zeros_like(present[0][0]), torch.zeros_like(present[0][1]))
    filled = [s if s is not None else blank for s in states]
    return torch.stack([s for s, _ in filled]), torch.stack([m for _, m in filled])


def collate_first(batch: list[dict]) -> dict:
    """DataLoader collate for batch_size=1 over PlanDataset (each item already is a batch)."""
    return batch[0]


__all__ = ["PlanDataset", "collate_first"]
