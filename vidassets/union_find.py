"""Disjoint sets over item numbers (path compression; the smaller number is a group's root), shared
by the near-duplicate decision at ingest and perceptual/semantic dedup."""

from __future__ import annotations

import numpy as np


class UnionFind:
    def __init__(self, parent: np.ndarray | None = None):
        self.parent = list(parent) if parent is not None else []

    def add(self, n: int) -> None:
        self.parent.extend(range(len(self.parent), len(self.parent) + n))

    def find(self, i: int) -> int:
        root = i
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[i] != root:
            self.parent[i], i = root, self.parent[i]
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)
