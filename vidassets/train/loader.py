"""The loader: a torch ``IterableDataset`` that yields, per global step, this rank's slice of the
plan as ready tensors, read from the shards by byte offset (no tar scan, no replay). Start it at
any cursor (step, offset within the rank's slice) to resume exactly. ``text_mask`` marks the samples
that have a text embedding (a sample included without a caption has zeros there).

A takedown reaches a run in flight: given ``takedowns`` (the snapshot's samples taken down now, e.g.
``snapshot.taken_down_clips``), the loader re-reads it every ``recheck_steps`` steps and leaves those
samples out of their batches, counting them (``skipped_takedowns`` per batch, ``skipped_total``):
the run goes on, one sample short where it meets one, without a restart."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from vidassets.train.plan import TrainPlan
from vidassets.train.shards import padded_text_states, restore_latents


class PlanDataset(torch.utils.data.IterableDataset):
    def __init__(self, plan: TrainPlan, shards_root: Path, index: pd.DataFrame, rank: int, world_size: int,
                 start_step: int = 0, start_offset: int = 0, steps: int | None = None,
                 takedowns: Callable[[], set[str]] | None = None, recheck_steps: int = 50):
        super().__init__()
        self._takedowns, self.recheck_steps = takedowns, recheck_steps
        self._down: set[str] = takedowns() if takedowns is not None else set()
        self.skipped_total = 0
        self.plan, self.root, self.rank, self.world = plan, Path(shards_root), rank, world_size
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
        self._dtype = self._read_dtype()
        self._states_meta = self._meta().get("text_states")
        self._files: dict[str, object] = {}

    def _member(self, shard: str, offset: int, size: int) -> np.ndarray:
        f = self._files.get(shard)
        if f is None:
            f = self._files[shard] = open(self.root / shard, "rb")  # noqa: SIM115 - kept open across batches
        f.seek(offset)
        # parse the .npy header in place and read the array straight into its buffer (no extra copy)
        version = np.lib.format.read_magic(f)
        header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = header(f)
        array = np.empty(shape, dtype=dtype, order="F" if fortran else "C")
        f.readinto(memoryview(array.reshape(-1, order="A")).cast("B"))
        return array

    def __del__(self) -> None:
        for f in getattr(self, "_files", {}).values():
            f.close()

    def _meta(self) -> dict:
        return json.loads((self.root / "shards.json").read_text()) if (self.root / "shards.json").exists() else {}

    def _read_dtype(self) -> str:
        return self._meta().get("latents_dtype", "bfloat16")

    def _text_states(self, member: tuple[str, str], level: str):
        """The caption's token states padded to the encoder's text length, and their mask (None: none)."""
        where = self._states.get(member, {}).get("" if level == self.plan.caption_default else level)
        if where is None or self._states_meta is None:
            return None
        return padded_text_states(self._member(self._where[member][0], *where), self._states_meta["dtype"],
                                  self._states_meta["max_tokens"])

    def batch(self, step: int, offset: int = 0) -> dict:
        """This rank's samples of ``step``: latents, and per sample the caption level the plan shows
        it this epoch (``caption_levels``), that caption's text and its text embedding (masked where
        the sample has none)."""
        if self.plan.global_batch % self.world:
            raise ValueError(f"global batch {self.plan.global_batch} is not divisible by world size {self.world}")
        sl = self.plan.step(step)
        clip_ids = sl.clip_ids[self.rank::self.world][offset:]
        levels = sl.caption_levels[self.rank::self.world][offset:]
        kept = [i for i, clip in enumerate(clip_ids) if clip not in self._down]
        skipped = len(clip_ids) - len(kept)
        self.skipped_total += skipped
        clip_ids, levels = [clip_ids[i] for i in kept], [levels[i] for i in kept]
        latents, texts, captions, states = [], [], [], []
        for clip, level in zip(clip_ids, levels, strict=True):
            member = (clip, sl.bucket)  # the step's shape bucket: the phase's resolution
            shard, l_off, l_size, t_off, t_size = self._where[member]
            latents.append(restore_latents(self._member(shard, l_off, l_size), self._dtype))
            if level != self.plan.caption_default:
                t_off, t_size = self._levels.get(member, {}).get(level, (-1, 0))
            texts.append(torch.from_numpy(self._member(shard, t_off, t_size)) if t_off >= 0 else None)
            captions.append(self._captions.get(clip, {}).get(level))
            states.append(self._text_states(member, level))
        out = {"step": step, "clip_ids": clip_ids, "bucket": sl.bucket, "latents": torch.stack(latents) if latents else None,
               "caption_levels": levels, "captions": captions, "skipped_takedowns": skipped}
        out["text_embeddings"], out["text_mask"] = _stack_with_mask(texts)
        if self._states_meta is not None:  # a per-token encoder: (B, max_tokens, dim) zero-padded + (B, max_tokens) mask
            out["text_states"], out["text_states_mask"] = _stack_states(states, self._states_meta)
        return out

    def __iter__(self) -> Iterator[dict]:
        step, offset = self.start_step, self.start_offset
        while self.steps is None or step < self.start_step + self.steps:
            if self._takedowns is not None and step > self.start_step and (step - self.start_step) % self.recheck_steps == 0:
                self._down = self._takedowns()  # a takedown since the run started reaches it here
            yield self.batch(step, offset)
            step, offset = step + 1, 0


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
