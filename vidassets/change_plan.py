"""``vidassets plan-change``: what an edited configuration would recompute, before running anything.

Walks the asset catalog in dependency order. For each asset it works out the rows the next
materialize will want (replaying the cheap stages from saved tables: the eval split from the
inventory, clip windows from saved shots, selection decisions from saved scores) and counts those
whose stored row the step may not reuse: missing, another producer or input version (see
``vidassets.versions``), or a transient failure with runs left — the same rule the steps apply
(``storage.rows``). Where a count depends on results not computed yet (new shots after a new
analysis, new decisions after new scores), the plan uses the stored rows as the estimate and says
it is approximate. Costs come from measured per-row step times in the Dagster instance.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from vidassets import catalog
from vidassets.config import Settings
from vidassets.derive.text_embeddings import text_ok
from vidassets.ingest.eval_split import split_changes
from vidassets.storage.rows import RowVersion, matches, records, retry_due
from vidassets.storage.schemas import SAMPLE_MEDIA_TYPES
from vidassets.storage.tables import TableStore
from vidassets.versions import Versions


@dataclass
class AssetPlan:
    asset: str
    stale: bool  # its code version changes, or rows of it must be computed
    reason: str
    rows_now: int
    rows_to_compute: int
    exact: bool  # False when the count depends on an upstream result the plan cannot replay
    seconds_per_row: float | None = None
    estimated_seconds: float | None = None
    old_versions: list[str] | None = None
    new_version: str = ""


@dataclass
class _Outcome:
    rows_to_compute: int
    exact: bool = True
    reason: str = ""


class _Planner:
    def __init__(self, tables: TableStore, settings: Settings):
        self.tables, self.settings, self.v = tables, settings, Versions(settings)
        self.max_runs = settings.execution.max_runs
        self.frames: dict[str, pd.DataFrame] = {}
        self.out: dict[str, _Outcome] = {}
        # results replayed (or estimated) for downstream assets
        self.train_videos: dict[str, dict] = {}
        self.recomputed_assets: set[str] = set()  # videos whose analysis is computed again
        self.clip_set: pd.DataFrame = pd.DataFrame()
        self.exact_clips = True
        self.passing: list[str] = []
        self.exact_passing = True
        self.probe_due: set[str] = set()
        self.clip_rows: dict[str, dict] = {}
        self.new_drops: list[str] = []
        self.captions_due: set[str] = set()

    def read(self, table: str) -> pd.DataFrame:
        if table not in self.frames:
            self.frames[table] = self.tables.read_all(table)
        return self.frames[table]

    def due(self, frame: pd.DataFrame, key_cols: tuple[str, ...], wanted: Iterable[tuple], version) -> list[tuple]:
        """The wanted keys whose stored row may not be reused (``version``: one RowVersion, or a
        function of the key)."""
        stored = {tuple(r[c] for c in key_cols): r for r in records(frame)}
        out = []
        for key in wanted:
            row = stored.get(key)
            v = version(key) if callable(version) else version
            if row is None or not matches(row, v) or retry_due(row, self.max_runs):
                out.append(key)
        return out

    def changed(self, *names: str) -> bool:
        return any(self.out[n].rows_to_compute for n in names if n in self.out)

    # ------------------------------------------------------------------ per asset

    def raw_inventory(self) -> _Outcome:
        inv = self.read("raw_inventory")
        version = self.v.own("raw_inventory")
        n = int(((inv.producer_version != version) | (inv.status == "error")).sum()) if len(inv) else 0
        self.new_drops = self._new_drops(set(inv.source_shard) if len(inv) else set())
        if self.new_drops:  # their rows are known once they are inventoried
            return _Outcome(n, False, f"{len(self.new_drops)} new drop(s): {', '.join(self.new_drops[:3])}; "
                            "their rows are counted once inventoried")
        return _Outcome(n, reason="inventory version changed" if n else "")

    def _new_drops(self, known: set[str]) -> list[str]:
        from vidassets.ingest.drops import list_drops
        from vidassets.storage import ReadOnlyBucket, open_object_store

        try:
            listing = list_drops(ReadOnlyBucket(open_object_store(self.settings.bucket.uri)), self.settings.bucket)
        except Exception:  # noqa: BLE001 - a bucket the planner cannot list: plan from the store alone
            return []
        return [d.key for d in listing.complete if d.key not in known]

    def eval_split(self) -> _Outcome:
        from vidassets.ingest.eval_split import split_rows

        inv = self.read("raw_inventory")
        ok = [r for r in records(inv) if r["status"] == "ok" and r["media_type"] in SAMPLE_MEDIA_TYPES]
        train, _ = split_rows(ok, self.settings.eval.salt, self.settings.eval.fraction_for, self.v.own("eval_split"))
        canonical = {r["asset_id"] for r in ok if not r.get("duplicate_of")}
        self.train_videos = {r["asset_id"]: r for r in train if r["asset_id"] in canonical}
        stored = self.read("eval_split")
        n = len(split_changes(records(stored) + records(self.vault_rows()), ok, self.settings.eval.salt,
                              self.settings.eval.fraction_for, self.v.own("eval_split")))
        moved = len(self.train_videos) - len(canonical & set(stored.asset_id)) if len(stored) else 0
        return _Outcome(n, reason=f"eval routing changed ({moved:+d} train videos)" if n else "")

    def vault_rows(self) -> pd.DataFrame:
        from vidassets.storage import open_object_store

        try:
            return TableStore(open_object_store(self.settings.store.vault_uri())).read_all("eval_assets")
        except Exception:  # noqa: BLE001 - no vault yet (or unreachable): nothing routed to eval before
            return pd.DataFrame()

    def _media(self, name: str, usable_only: bool) -> _Outcome:
        wanted = sorted(self.train_videos)
        table, version = name, self.v.row(name)
        if name == "video_fingerprint":
            table, version = "video_fingerprints", self.v.fingerprint_row()
        if name == "video_analysis" and self.settings.near_duplicates.enabled:  # copies not analysed (as stored)
            from vidassets.ingest.near_duplicates import kept_out

            near = {r["asset_id"] for r in records(self.read("video_fingerprints")) if kept_out(r)}
            wanted = [a for a in wanted if a not in near]
        exact = True
        if usable_only:  # only videos the probe found usable; a re-probed video's verdict is unknown
            probe = {r["asset_id"]: r for r in records(self.read("video_probe"))}
            reprobed = self.probe_due
            wanted = [a for a in wanted if a in reprobed or (a in probe and probe[a]["status"] in ("ok", "salvaged"))]
            exact = not reprobed
        due = self.due(self.read(table), ("asset_id",), [(a,) for a in wanted], version)
        if name == "video_analysis":
            self.recomputed_assets = {a for (a,) in due}
        return _Outcome(len(due), exact, f"{len(due)} video(s) to (re)compute" if due else "")

    def video_probe(self) -> _Outcome:
        due = self.due(self.read("video_probe"), ("asset_id",), [(a,) for a in sorted(self.train_videos)],
                       self.v.row("video_probe"))
        self.probe_due = {a for (a,) in due}
        return _Outcome(len(due), reason=f"{len(due)} video(s) to probe" if due else "")

    def frame_index(self) -> _Outcome:
        return self._media("frame_index", usable_only=True)

    def video_fingerprint(self) -> _Outcome:
        return self._media("video_fingerprint", usable_only=True)

    def video_analysis(self) -> _Outcome:
        return self._media("video_analysis", usable_only=True)

    def clips(self) -> _Outcome:
        from vidassets.media.drop_steps import clip_partition

        stored = self.read("clips")
        version = self.v.row("clips")
        analysis = [r for r in records(self.read("video_analysis")) if r["asset_id"] in self.train_videos]
        replayable = [r for r in analysis if r["asset_id"] not in self.recomputed_assets]
        rows, _ = clip_partition(self.tables.objects, replayable, pd.DataFrame(), version, self.settings.clips)
        # videos analysed again: their clips are unknown until then; the stored ones are the estimate
        estimated = stored[stored.asset_id.isin(self.recomputed_assets)] if len(stored) else stored
        self.exact_clips = not len(estimated) and not self.recomputed_assets
        self.clip_rows = {**{r["clip_id"]: r for r in records(stored)}, **{r["clip_id"]: r for r in rows}}
        replayed = pd.DataFrame(rows) if rows else pd.DataFrame(columns=["clip_id", "asset_id"])
        self.clip_set = pd.concat([replayed[["clip_id", "asset_id"]], estimated[["clip_id", "asset_id"]]],
                               ignore_index=True) if len(estimated) else replayed[["clip_id", "asset_id"]]
        due = self.due(stored, ("clip_id",), [(c,) for c in replayed.clip_id], version) + list(estimated.clip_id)
        return _Outcome(len(due), self.exact_clips, f"{len(due)} clip(s) new or from changed inputs" if due else "")

    def _per_clip(self, name: str, version: RowVersion) -> _Outcome:
        due = self.due(self.read(name), ("clip_id",), [(c,) for c in self.clip_set.clip_id], version)
        return _Outcome(len(due), self.exact_clips, f"{len(due)} clip(s)" if due else "")

    def eval_features(self) -> _Outcome:
        return _Outcome(0, False, "eval vault (not counted here)")

    def clip_scores(self) -> _Outcome:
        from vidassets.curate.scores import (
            TIER,
            cascade_failure,
            cascade_gates,
            gates_digest,
            skipped_under_other_gates,
        )

        versions = self.v.score_rows()
        wanted = [(c, s) for c in self.clip_set.clip_id for s in versions]
        stored = self.read("clip_scores")
        due = self.due(stored, ("clip_id", "score"), wanted, lambda k: versions[k[1]])
        which = sorted({s for _, s in due})
        # rows the cascade skipped under other gates are decided again; those the new gates admit run a model
        gates = cascade_gates(self.settings.scores, self.v.recipe.score_rules)
        current = gates_digest(gates)
        due_keys = set(due)
        admitted: set[str] = set()  # clips with a skipped score the new gates admit (a clip's cheap models
        # always are among them: the costly ones wait for the same gates and more)
        if len(stored) and "status" in stored:
            values: dict[str, dict] = {}
            for r in records(stored[stored.status == "ok"]):
                values.setdefault(r["clip_id"], {})[r["score"]] = r["value"]
            for r in records(stored[stored.status == "skipped"]):
                if (r["clip_id"], r["score"]) in due_keys or not skipped_under_other_gates(r, current):
                    continue
                due.append((r["clip_id"], r["score"]))
                if cascade_failure(gates, values.get(r["clip_id"], {}), TIER[r["score"]]) is None:
                    admitted.add(r["clip_id"])
        note = f"scores: {', '.join(which)}" if which else ""
        if admitted:
            note = "; ".join(x for x in (note, f"model scores for {len(admitted)} clip(s) the recipe's gates now admit") if x)
        return _Outcome(len(due), self.exact_clips, note)

    def clip_embeddings(self) -> _Outcome:
        return self._per_clip("clip_embeddings", self.v.row("clip_embeddings"))

    def _global(self, name: str) -> _Outcome:
        stored = self.read(name)
        mismatch = [r for r in records(stored) if not matches(r, self.v.row(name))]
        ups = [r for r in self.v.reads(name) if self.changed(r)]
        if not mismatch and not ups and len(stored) == len(self.clip_set):
            return _Outcome(0, self.exact_clips)
        why = f"reads changed: {', '.join(ups)}" if ups else ("version changed" if mismatch else "new clips")
        return _Outcome(len(self.clip_set), self.exact_clips, why)

    def dedup_groups(self) -> _Outcome:
        return self._global("dedup_groups")

    def clip_clusters(self) -> _Outcome:
        """Clips with an ok embedding get a cluster; none do while fewer than ``k`` exist and the
        clustering version has no centroids yet."""
        from vidassets.curate.clusters import centroids_prefix

        emb = self.read("clip_embeddings")
        embedded = set(emb.loc[emb.status == "ok", "clip_id"]) if len(emb) and not self.changed("clip_embeddings") \
            else set(self.clip_set.clip_id) if len(self.clip_set) else set()
        own = self.v.own("clip_clusters")
        if len(embedded) < self.settings.clusters.k and \
                not self.tables.objects.exists(f"{centroids_prefix(own)}/meta.json"):
            return _Outcome(0, self.exact_clips, f"waiting: {len(embedded)} embedding(s) < k")
        stored = self.read("clip_clusters")
        mismatch = [r for r in records(stored) if not matches(r, self.v.row("clip_clusters"))]
        if not mismatch and not self.changed("clip_embeddings") and set(stored.clip_id) == embedded:
            return _Outcome(0, self.exact_clips)
        why = "reads changed: clip_embeddings" if self.changed("clip_embeddings") else \
            "version changed" if mismatch else "new clips"
        return _Outcome(len(embedded), self.exact_clips and not self.changed("clip_embeddings"), why)

    def decontamination(self) -> _Outcome:
        return self._global("decontamination")

    def selection(self) -> _Outcome:
        out = self._global("selection")
        sel = self.read("selection")
        self.passing = sorted(sel.loc[sel.decision == "pass", "clip_id"]) if len(sel) else []
        reads = self.v.reads("selection")
        inputs_known = not self.changed(*reads) and all(self.out[r].exact for r in reads)
        self.exact_passing = inputs_known
        if out.rows_to_compute and inputs_known:
            self.passing = self._replay_selection()
        out.exact = self.exact_passing
        return out

    def _replay_selection(self) -> list[str]:
        from vidassets.curate.selection import select
        from vidassets.storage.blobs import vector_of

        emb = self.read("clip_embeddings")
        vectors = {r.clip_id: vector_of(r.vector) for r in emb.itertuples() if r.status == "ok"} if len(emb) else {}
        deco = self.read("decontamination")
        excluded = set(deco.loc[deco.contaminated.astype(bool), "clip_id"]) if len(deco) else set()
        generated: set[str] = set()
        if self.settings.near_duplicates.firewall_generated:
            from vidassets.curate.selection import generated_copies

            inv = self.read("raw_inventory")
            made = set(inv.loc[inv.synthetic.fillna(False).astype(bool), "asset_id"].dropna()) \
                if len(inv) and "synthetic" in inv else set()
            scores = self.read("clip_scores")
            clips = scores[["clip_id", "asset_id"]] if len(scores) else pd.DataFrame(columns=["clip_id", "asset_id"])
            generated = generated_copies(clips, self.read("dedup_groups"), made)
        rows = select(self.v.recipe, self.read("clip_scores"), self.read("dedup_groups"), vectors,
                      self.v.row("selection"), excluded, generated)
        return sorted(r["clip_id"] for r in rows if r["decision"] == "pass")

    def annotations(self) -> _Outcome:
        versions = self.v.annotation_rows()
        wanted = [(c, k, versions[k].producer) for c in self.passing for k in versions]
        due = self.due(self.read("annotations"), ("clip_id", "kind", "producer_version"), wanted,
                       lambda key: versions[key[1]])
        self.captions_due = {c for c, k, _ in due if k == "captions"}
        kinds = {k: sum(1 for _, kk, _ in due if kk == k) for k in versions}
        return _Outcome(len(due), self.exact_passing,
                        "to annotate: " + ", ".join(f"{k} {n}" for k, n in kinds.items() if n) if due else "")

    def clip_ladder(self) -> _Outcome:
        from vidassets.media.clip_outputs import rungs_for
        from vidassets.media.image import is_image

        analysis = {r["asset_id"]: r for r in records(self.read("video_analysis"))}
        probe = {r["asset_id"]: r for r in records(self.read("video_probe"))}
        tiers = {r["clip_id"]: r["tier"] for r in records(self.read("selection"))}
        wanted, versions, exact = [], {}, self.exact_passing
        for clip_id in self.passing:
            clip = self.clip_rows.get(clip_id)
            if clip is None or clip["asset_id"] not in analysis:
                exact = False
                continue
            a, p = analysis[clip["asset_id"]], probe.get(clip["asset_id"], {})
            w = int(p.get("display_width") or a["analysis_width"])
            h = int(p.get("display_height") or a["analysis_height"])
            versions[clip_id] = self.v.window_row("clip_ladder", clip)
            for rung in rungs_for(self.settings.ladder, tiers.get(clip_id), float(a.get("fps") or 0.0), min(w, h),
                                  is_image(clip)):
                wanted.append((clip_id, rung["name"], versions[clip_id].producer))
        due = self.due(self.read("clip_ladder"), ("clip_id", "rung", "producer_version"), wanted,
                       lambda key: versions[key[0]])
        return _Outcome(len(due), exact, f"{len(due)} rung(s) of {len({c for c, _, _ in due})} clip(s)" if due else "")

    def _selected(self, name: str) -> _Outcome:
        """Rows per selected clip that read the clip's frames (window rows)."""
        known = [c for c in self.passing if c in self.clip_rows]
        versions = {c: self.v.window_row(name, self.clip_rows[c]) for c in known}
        due = self.due(self.read(name), ("clip_id", "producer_version"), [(c, versions[c].producer) for c in known],
                       lambda key: versions[key[0]])
        exact = self.exact_passing and len(known) == len(self.passing)
        return _Outcome(len(due), exact, f"{len(due)} selected clip(s)" if due else "")

    def clip_audio(self) -> _Outcome:
        return self._selected("clip_audio")

    def latents(self) -> _Outcome:
        """One row per selected clip and configured resolution."""
        known = [c for c in self.passing if c in self.clip_rows]
        versions = {(c, v.producer): v for c in known for v in self.v.latent_rows(self.clip_rows[c]).values()}
        due = self.due(self.read("latents"), ("clip_id", "producer_version"), list(versions), versions.__getitem__)
        exact = self.exact_passing and len(known) == len(self.passing)
        clips = len({c for c, _ in due})
        return _Outcome(len(due), exact, f"{len(due)} latents of {clips} selected clip(s)" if due else "")

    def audio_annotations(self) -> _Outcome:
        """Kinds due per selected clip whose audio is kept (as stored: a clip whose audio is
        extracted again may keep it or not, so then the count is an estimate)."""
        audio = {r["clip_id"]: r for r in records(self.read("clip_audio")) if r.get("audio_status") == "ok"}
        kinds = self.v.audio_annotation_kinds
        tiers = self.settings.audio_annotations.caption_tiers
        tier_of = {r["clip_id"]: r.get("tier") for r in records(self.read("selection"))}
        wanted, versions = [], {}
        for clip_id in self.passing:
            clip = self.clip_rows.get(clip_id)
            if clip_id not in audio or clip is None:
                continue
            for kind in kinds:
                if kind in ("audio_caption", "av_caption") and tiers is not None and tier_of.get(clip_id) not in tiers:
                    continue
                versions[(clip_id, kind)] = self.v.audio_annotation_row({**audio[clip_id], **clip}, kind)
                wanted.append((clip_id, kind, kinds[kind]))
        due = self.due(self.read("audio_annotations"), ("clip_id", "kind", "producer_version"), wanted,
                       lambda key: versions[(key[0], key[1])])
        return _Outcome(len(due), self.exact_passing and not self.changed("clip_audio"),
                        f"{len(due)} audio annotation(s) of {len({c for c, _, _ in due})} clip(s)" if due else "")

    def text_embeddings(self) -> _Outcome:
        version = self.v.own("text_embeddings")
        choice = self.v.recipe.captions
        caption_version = choice.version or self.v.annotation_kinds["captions"]
        te = self.read("text_embeddings")
        levels = self.v.recipe.curriculum.caption_levels(choice.level)
        have = set(zip(*[te.loc[(te.producer_version == version) & (te.caption_version == caption_version)
                                & text_ok(te), c] for c in ("clip_id", "caption_level")], strict=True)) if len(te) else set()
        recaptioned = self.captions_due if caption_version == self.v.annotation_kinds["captions"] else set()
        due = [c for c in self.passing for lv in levels if (c, lv) not in have or c in recaptioned]
        # a row's input is the caption text: a caption computed again may read the same
        return _Outcome(len(due), self.exact_passing and not recaptioned, f"{len(due)} caption(s)" if due else "")

    def on_request(self, name: str) -> _Outcome:
        ups = [r for r in self.v.reads(name) if self.changed(r) or (self.out.get(r) and self.out[r].reason == "stale")]
        return _Outcome(0, True, "stale" if ups else "")


def plan_change(tables: TableStore, new: Settings, instance: Any = None) -> list[AssetPlan]:
    planner = _Planner(tables, new)
    plans = []
    for entry in catalog.ASSETS:
        name = entry.name
        outcome = planner.on_request(name) if entry.kind == "on_request" else getattr(planner, name)()
        if planner.new_drops:  # a new drop's rows are not known before its inventory
            outcome.exact = False
        # a count built on an estimate is an estimate
        outcome.exact = outcome.exact and all(planner.out[r].exact for r in planner.v.reads(name) if r in planner.out)
        planner.out[name] = outcome
        stored = planner.read(entry.tables[0]) if entry.tables else pd.DataFrame()
        old = set(stored.producer_version) if len(stored) and "producer_version" in stored else set()
        last = last_code_version(instance, name) if instance is not None else None
        code_changed = last is not None and last != planner.v.full(name)
        stale = bool(outcome.rows_to_compute) or code_changed or outcome.reason == "stale"
        if code_changed and not outcome.reason:
            outcome.reason = "code version changed (no row to compute)"
        reason = outcome.reason or ("on request" if entry.kind == "on_request" else "unchanged")
        if entry.kind == "on_request" and outcome.reason == "stale":
            reason = "stale: re-materialize on request (" + ", ".join(
                r for r in planner.v.reads(name) if planner.changed(r) or planner.out[r].reason == "stale") + ")"
        plans.append(AssetPlan(name, stale, reason, len(stored), outcome.rows_to_compute, outcome.exact,
                               old_versions=sorted(old) or None, new_version=planner.v.full(name)))
    if instance is not None:
        for p in plans:
            p.seconds_per_row = seconds_per_row(instance, p.asset)
            if p.seconds_per_row is not None:
                p.estimated_seconds = round(p.seconds_per_row * p.rows_to_compute, 2)
    return plans


def last_code_version(instance: Any, asset: str) -> str | None:
    """The code version of the asset's latest materialization in the Dagster instance."""
    from dagster import AssetKey

    event = instance.get_latest_materialization_event(AssetKey(asset))
    if event is None or event.asset_materialization is None:
        return None
    return event.asset_materialization.tags.get("dagster/code_version")


def seconds_per_row(instance: Any, asset: str, limit: int = 20) -> float | None:
    """Measured step seconds per computed row over the asset's recent materializations."""
    from dagster import AssetKey

    records_ = instance.fetch_materializations(AssetKey(asset), limit=limit).records
    seconds, rows = 0.0, 0
    stats_by_run: dict[str, dict[str, float]] = {}
    for record in records_:
        meta = record.asset_materialization.metadata if record.asset_materialization else {}
        computed = _computed(meta, catalog.entry(asset).rows_computed)
        if not computed:
            continue
        if record.run_id not in stats_by_run:
            stats_by_run[record.run_id] = {
                s.step_key: (s.end_time or 0) - (s.start_time or 0) for s in instance.get_run_step_stats(record.run_id)}
        duration = stats_by_run[record.run_id].get(asset)
        if duration:
            seconds += duration
            rows += computed
    return round(seconds / rows, 4) if rows else None


def _computed(meta: dict, key: str) -> int:
    value = meta.get(key)
    if value is None:
        return 0
    value = getattr(value, "value", value)
    if isinstance(value, dict):
        return int(sum(value.values()))
    return int(value)


def render(plans: Iterable[AssetPlan]) -> str:
    lines = [f"{'asset':<18}{'recompute':>10}{'rows now':>10}{'rows to compute':>17}{'est. seconds':>14}  why"]
    total = 0.0
    for p in plans:
        est = "" if p.estimated_seconds is None else f"{p.estimated_seconds:.1f}"
        total += p.estimated_seconds or 0.0
        mark = "yes" if p.stale else "no"
        approx = "" if p.exact else " (approx.: depends on upstream results)"
        lines.append(f"{p.asset:<18}{mark:>10}{p.rows_now:>10}{p.rows_to_compute:>17}{est:>14}  {p.reason}{approx}")
    lines.append(f"estimated total: {total:.1f} s (measured per-row step times; blank = never measured)")
    return "\n".join(lines)


def to_json(plans: Iterable[AssetPlan]) -> str:
    return json.dumps([asdict(p) for p in plans], indent=1)
