"""Selected clips that match eval material, kept up to date from the writes of two tables.

What the blocking check on ``selection`` verifies, independently of how selection decided: no clip
``selection`` passed is one ``decontamination`` marks contaminated. Reading both tables whole on every
run costs what the bucket holds; instead this keeps, per drop, the clips marked contaminated, which of
them are passed (the leaks) and how many clips are passed (in buckets by drop), and each run applies only the rows the two
tables' writes replaced since the last (``TableStore.changes_since``). A table is read whole when the
writes cannot tell (the first run, a whole rewrite, a compaction since), and ``selection`` is read whole
when decontamination newly marked a clip of a drop whose selection rows were not rewritten since: that
clip's decision is then needed, and it is exactly the case the check exists for.
"""

from __future__ import annotations

import json

import pandas as pd

from vidassets.storage.objects import ObjectStore
from vidassets.storage.partition_map import PartitionMap
from vidassets.storage.tables import TableStore

STATE_KEY = "state/checks/eval_leaks.json"
PASSED_PREFIX = "state/checks/eval_leaks_passed"
TABLES = ("selection", "decontamination")


class EvalLeaks:
    """Per drop: contaminated clip ids and the passed ones among them (leaks): small, kept in one
    object with the cursors; per drop its count of passed clips, in a ``PartitionMap`` (a run reads
    and writes the buckets of the drops it changed), whose summary holds the total."""

    def __init__(self, objects: ObjectStore):
        self.objects = objects
        self.passed = PartitionMap(objects, PASSED_PREFIX)
        data = json.loads(objects.get_bytes(STATE_KEY)) if objects.exists(STATE_KEY) and self.passed.found else {}
        self.contaminated: dict[str, set[str]] = {d: set(c) for d, c in data.get("contaminated", {}).items()}
        self.leaked: dict[str, set[str]] = {d: set(c) for d, c in data.get("leaked", {}).items()}
        self.cursors: dict[str, dict] = dict(data.get("cursors", {}))
        self.selected = int(self.passed.meta.get("selected", 0)) if data else 0
        self._passed: dict[str, int | None] = {}  # the drops' passed counts this update set (None: none)
        self._passed_whole = not data  # the counts are every drop's (written whole)
        self.read_whole: list[str] = []  # the tables this update read whole

    def leaks(self) -> list[str]:
        return sorted(c for clips in self.leaked.values() for c in clips)

    # -- applying rows --------------------------------------------------------------------------
    def _contamination(self, drops: set[str], rows: pd.DataFrame) -> set[str]:
        """Set ``drops``' contaminated clips from their decontamination rows now; the drops that
        gained one."""
        marked = rows.loc[rows.contaminated.astype(bool), ["source_shard", "clip_id"]] if len(rows) else rows
        now = {d: set(g.clip_id) for d, g in marked.groupby("source_shard")} if len(marked) else {}
        gained = set()
        for drop in drops:
            clips = now.get(drop, set())
            if clips - self.contaminated.get(drop, set()):
                gained.add(drop)
            _put(self.contaminated, drop, clips)
            _put(self.leaked, drop, self.leaked.get(drop, set()) & clips)
        return gained

    def _selection(self, drops: set[str], rows: pd.DataFrame, whole: bool = False) -> None:
        """Set ``drops``' passed clips from their selection rows now (``whole``: every drop's)."""
        passing = rows.loc[rows.decision == "pass", ["source_shard", "clip_id"]] if len(rows) else rows
        now = {d: set(g.clip_id) for d, g in passing.groupby("source_shard")} if len(passing) else {}
        before = {} if whole else self.passed.get(drops)
        for drop in drops:
            clips = now.get(drop, set())
            self.selected += len(clips) - int(before.get(drop, 0))
            self._passed[drop] = len(clips) or None
            _put(self.leaked, drop, clips & self.contaminated.get(drop, set()))

    # -- the update -----------------------------------------------------------------------------
    def update(self, tables: TableStore) -> EvalLeaks:
        """Apply what the two tables' writes replaced since the last update (``read_whole`` says
        which were read whole this time)."""
        self.read_whole = []
        changes = {}
        for table in TABLES:
            changes[table], self.cursors[table] = tables.changes_since(table, self.cursors.get(table))
        if changes["decontamination"] is None:
            rows = tables.read_or_empty("decontamination")
            gained = self._contamination(set(self.contaminated) | (set(rows.source_shard) if len(rows) else set()), rows)
            self.read_whole.append("decontamination")
        else:
            gained = self._contamination(*changes["decontamination"])
        sel = changes["selection"]
        if sel is None or gained - sel[0]:
            rows = tables.read_or_empty("selection")
            self.selected, self.leaked, self._passed, self._passed_whole = 0, {}, {}, True
            self._selection(set(rows.source_shard) if len(rows) else set(), rows, whole=True)
            self.read_whole.append("selection")
        else:
            self._selection(*sel)
        return self

    # -- stored ---------------------------------------------------------------------------------
    @classmethod
    def load(cls, objects: ObjectStore) -> EvalLeaks:
        return cls(objects)

    def save(self) -> None:
        """The passed counts first (their map's summary holds the total), then the rest with the
        cursors: a save stopped between the two applies the same writes again next time."""
        counts = {d: n for d, n in self._passed.items() if n is not None or not self._passed_whole}
        self.passed.write(counts, {"selected": self.selected}, whole=self._passed_whole)
        self._passed, self._passed_whole = {}, False
        self.objects.put_bytes(STATE_KEY, json.dumps({
            "contaminated": {d: sorted(c) for d, c in sorted(self.contaminated.items())},
            "leaked": {d: sorted(c) for d, c in sorted(self.leaked.items())},
            "cursors": self.cursors}, sort_keys=True).encode())


def _put(by_drop: dict, drop: str, value) -> None:
    """Set a drop's entry; an empty one is dropped (the state holds what is there, not every drop)."""
    if value:
        by_drop[drop] = value
    else:
        by_drop.pop(drop, None)
