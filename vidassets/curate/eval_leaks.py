"""Selected clips that match eval material, kept up to date from the writes of two tables.

What the blocking check on ``selection`` verifies, independently of how selection decided: no clip
``selection`` passed is one ``decontamination`` marks contaminated. Reading both tables whole on every
run costs what the bucket holds; instead this keeps, per drop, the clips marked contaminated, which of
them are passed (the leaks) and how many clips are passed, and each run applies only the rows the two
tables' writes replaced since the last (``TableStore.changes_since``). A table is read whole when the
writes cannot tell (the first run, a whole rewrite, a compaction since), and ``selection`` is read whole
when decontamination newly marked a clip of a drop whose selection rows were not rewritten since: that
clip's decision is then needed, and it is exactly the case the check exists for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pandas as pd

from vidassets.storage.objects import ObjectStore
from vidassets.storage.tables import TableStore

STATE_KEY = "state/checks/eval_leaks.json"
TABLES = ("selection", "decontamination")


@dataclass
class EvalLeaks:
    """Per drop: contaminated clip ids, passed clip ids among them (leaks), passed clip count."""

    contaminated: dict[str, set[str]] = field(default_factory=dict)
    leaked: dict[str, set[str]] = field(default_factory=dict)
    passed: dict[str, int] = field(default_factory=dict)
    cursors: dict[str, dict] = field(default_factory=dict)
    read_whole: list[str] = field(default_factory=list)  # the tables this update read whole

    @property
    def selected(self) -> int:
        return sum(self.passed.values())

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

    def _selection(self, drops: set[str], rows: pd.DataFrame) -> None:
        """Set ``drops``' passed clips from their selection rows now."""
        passing = rows.loc[rows.decision == "pass", ["source_shard", "clip_id"]] if len(rows) else rows
        now = {d: set(g.clip_id) for d, g in passing.groupby("source_shard")} if len(passing) else {}
        for drop in drops:
            clips = now.get(drop, set())
            _put(self.passed, drop, len(clips))
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
            self.passed, self.leaked = {}, {}
            self._selection(set(rows.source_shard) if len(rows) else set(), rows)
            self.read_whole.append("selection")
        else:
            self._selection(*sel)
        return self

    # -- stored ---------------------------------------------------------------------------------
    @classmethod
    def load(cls, objects: ObjectStore) -> EvalLeaks:
        if not objects.exists(STATE_KEY):
            return cls()
        data = json.loads(objects.get_bytes(STATE_KEY))
        return cls({d: set(c) for d, c in data["contaminated"].items()}, {d: set(c) for d, c in data["leaked"].items()},
                   dict(data["passed"]), dict(data["cursors"]))

    def save(self, objects: ObjectStore) -> None:
        objects.put_bytes(STATE_KEY, json.dumps({
            "contaminated": {d: sorted(c) for d, c in sorted(self.contaminated.items())},
            "leaked": {d: sorted(c) for d, c in sorted(self.leaked.items())},
            "passed": dict(sorted(self.passed.items())), "cursors": self.cursors}, sort_keys=True).encode())


def _put(by_drop: dict, drop: str, value) -> None:
    """Set a drop's entry; an empty one is dropped (the state holds what is there, not every drop)."""
    if value:
        by_drop[drop] = value
    else:
        by_drop.pop(drop, None)
