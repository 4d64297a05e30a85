"""``vidassets report``: one self-contained static HTML page (plots inlined as PNG, no scripts, no
external files) about a store: the funnel per stage and per source tier with the first-failed-rule
breakdown, score histograms with the recipe's thresholds, duplicate group sizes, and throughput per
stage from the Dagster instance's step timings."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pandas as pd

from vidassets.curate.selection import Recipe
from vidassets.storage.schemas import SAMPLE_MEDIA_TYPES
from vidassets.storage.tables import TableStore

STAGES = ("raw_inventory", "eval_split", "video_probe", "frame_index", "video_analysis", "clips", "clip_scores",
          "clip_embeddings", "dedup_groups", "decontamination", "selection", "annotations", "latents", "text_embeddings")


def funnel(tables: TableStore) -> pd.DataFrame:
    """Per source tier: how many items survive each step (videos, then clips)."""
    inv = tables.read_all("raw_inventory")
    split = tables.read_all("eval_split")
    probe = tables.read_all("video_probe")
    analysis = tables.read_all("video_analysis")
    clips = tables.read_all("clips")
    sel = tables.read_or_empty("selection")
    lat = tables.read_all("latents")
    ann = tables.read_all("annotations")

    def tier(frame: pd.DataFrame) -> pd.Series:
        return frame["source_shard"].str.split("/").str[0] if len(frame) else pd.Series(dtype=str)

    steps: list[tuple[str, pd.DataFrame]] = [
        ("videos and images found", inv[inv.media_type.isin(SAMPLE_MEDIA_TYPES)] if len(inv) else inv),
        ("readable, not an exact duplicate", split[split.duplicate_of.isna()] if len(split) else split),
        ("probe ok / salvaged", probe[probe.status != "quarantined"] if len(probe) else probe),
        ("analysed", analysis[analysis.status != "failed"] if len(analysis) else analysis),
        ("clips", clips),
        ("clips selected", sel[sel.decision == "pass"] if len(sel) else sel),
        ("clips annotated", ann[ann.status == "ok"].drop_duplicates("clip_id") if len(ann) else ann),
        ("clips with latents", lat[lat.status == "ok"].drop_duplicates("clip_id") if len(lat) else lat),
    ]
    rows = []
    for name, frame in steps:
        counts = tier(frame).value_counts().to_dict() if len(frame) else {}
        rows.append({"step": name, "all": len(frame), **counts})
    return pd.DataFrame(rows).fillna(0).set_index("step")


def first_failed(tables: TableStore) -> pd.DataFrame:
    sel = tables.read_or_empty("selection")
    if not len(sel):
        return pd.DataFrame()
    rejected = sel[sel.decision == "reject"].copy()
    rejected["tier"] = rejected["source_shard"].str.split("/").str[0]
    return rejected.groupby(["first_failed_rule", "tier"]).size().unstack(fill_value=0)


def throughput(instance: Any, limit: int = 200) -> pd.DataFrame:
    """Per stage: step seconds, rows out and rows per second over recent materializations."""
    from dagster import AssetKey

    rows = []
    for stage in STAGES:
        records = instance.fetch_materializations(AssetKey(stage), limit=limit).records
        seconds, out, runs = 0.0, 0, 0
        cache: dict[str, dict[str, float]] = {}
        for record in records:
            if record.run_id not in cache:
                cache[record.run_id] = {s.step_key: (s.end_time or 0) - (s.start_time or 0)
                                        for s in instance.get_run_step_stats(record.run_id)}
            meta = record.asset_materialization.metadata
            rows_out = meta.get("rows_out")
            seconds += cache[record.run_id].get(stage, 0.0)
            out += int(rows_out.value) if rows_out is not None else 0
            runs += 1
        if runs:
            rows.append({"stage": stage, "materializations": runs, "step_seconds": round(seconds, 2), "rows_out": out,
                         "rows_per_second": round(out / seconds, 2) if seconds else None})
    return pd.DataFrame(rows)


def release_gate(tables: TableStore, vault: TableStore) -> str:
    """Contamination-scan coverage: the share of training-ready clips (selection passes) checked
    against the eval vault as it is now."""
    from vidassets.curate.decontamination import EVAL_TABLES, scan_coverage
    from vidassets.storage.tables import partition_fingerprints

    selection = tables.read_or_empty("selection")
    ready = set(selection.loc[selection.decision == "pass", "clip_id"]) if len(selection) else set()
    scan = scan_coverage(tables.objects, ready, partition_fingerprints(vault, EVAL_TABLES))
    stale = ", ".join(scan["eval_drops_not_scanned"]) or "none"
    verdict = "PASS" if scan["coverage"] >= 1.0 else "FAIL"
    return (f"<h2>Release gate: contamination-scan coverage {scan['coverage']:.1%} ({verdict})</h2>"
            f"<p>{scan['checked']} of {scan['clips']} training-ready clips checked against the current eval vault; "
            f"eval drops not yet scanned: {html.escape(stale)}.</p>")


def _png(draw: Callable[[Any], None], width: float = 7.5, height: float = 3.6) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height), dpi=100)
    draw(ax)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}">'


def curriculum_section(tables: TableStore, train: Any = None) -> str:
    """The newest snapshot's streams, semantic clusters and cluster-group coverage, the captions'
    length and language monitors, and (when its shards exist) the realized-stream monitor over
    the first window of each phase of its plan, with the plot."""
    from vidassets.train.snapshot import snapshot_meta, snapshot_versions

    objects = tables.objects
    found = snapshot_versions(objects)
    if not found:
        return "<h2>Curriculum</h2><p>No snapshot yet.</p>"
    version = found[-1]
    meta = snapshot_meta(objects, version)
    out = [f"<h2>Curriculum (snapshot v{version})</h2>"]
    if meta.get("streams"):
        out.append("<h3>Samples per stream</h3>" + pd.Series(meta["streams"], name="samples").to_frame().to_html())
    clusters = meta.get("clusters") or {}
    if clusters.get("per_cluster"):
        table = pd.DataFrame(clusters["per_cluster"]).set_index("cluster")
        table["tiers"] = table.tiers.map(lambda t: ", ".join(f"{k}: {v}" for k, v in t.items()))
        table["examples"] = table.examples.map(", ".join)
        coverage = clusters.get("coverage") or {}
        out.append("<h3>Semantic clusters</h3>" + table.to_html()
                   + f"<p>{clusters.get('unclustered', 0)} samples without a cluster. Under-represented groups: "
                   f"{html.escape(', '.join(coverage.get('under') or []) or 'none')}; over-represented: "
                   f"{html.escape(', '.join(coverage.get('over') or []) or 'none')}.</p>"
                   + pd.DataFrame(coverage.get("groups") or {}).T.to_html())
    from vidassets.derive.caption_check import caption_texts_by_drop, profile

    annotations = tables.read_all("annotations")
    if len(annotations):
        captions = annotations[annotations.kind == "captions"]
        rows = []
        for version_name in sorted(captions.producer_version.unique()):
            texts = [t for ts in caption_texts_by_drop(captions, version_name).values() for t in ts]
            p = profile(texts)
            rows.append({"captioner version": version_name, "captions": p["captions"], "mean words": p["mean_words"],
                         "p95 words": p["p95_words"], "mojibake": p["mojibake_share"],
                         "languages": ", ".join(f"{k} {v:.0%}" for k, v in p["languages"].items())})
        out.append("<h3>Caption monitors per captioner version</h3>" + pd.DataFrame(rows).to_html(index=False))
    if train is not None:
        try:
            from vidassets.train.build import build_plan, snapshot_recipe
            from vidassets.train.monitor import inspect_plan, plot_report

            plan = build_plan(objects, version, train)
        except FileNotFoundError as exc:  # no shards for it yet
            out.append(f"<p>Plan monitor: {html.escape(str(exc))}.</p>")
            return "".join(out)
        limits = snapshot_recipe(objects, version).curriculum.monitor
        for phase in plan.phases:
            end = min(phase.spec.start + limits.window_steps, phase.spec.end or train.total_steps, train.total_steps)
            if end <= phase.spec.start:
                continue
            report = inspect_plan(plan, phase.spec.start, end, limits)
            buffer = io.BytesIO()
            plot_report(report, plan, buffer)
            verdict = "PASS" if report["passed"] else "FAIL: " + "; ".join(report["findings"])
            out.append(f"<h3>Realized streams, phase {html.escape(phase.spec.name)}, steps {phase.spec.start}:{end} "
                       f"({html.escape(verdict)})</h3>"
                       f'<img alt="monitor" src="data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}">')
    return "".join(out)


def caption_qc_section(vault: TableStore) -> str:
    """Caption QC per captioner version and judge: golden-set and sample scores."""
    from vidassets.derive.caption_judge import summary

    table = vault.read_or_empty("caption_qc")
    if not len(table):
        return "<h2>Caption QC</h2><p>Not run yet (materialize <code>caption_qc</code>).</p>"
    rows = []
    for (captions, judge), _ in table.groupby(["captions_version", "judge_version"]):
        found = summary(table, captions, judge)
        rows.append({"captioner version": captions, "judge": judge,
                     "golden judged": found["golden"]["judged"], "golden mean": found["golden"]["mean_score"],
                     "sample judged": found["sample"]["judged"], "sample mean": found["sample"]["mean_score"]})
    return "<h2>Caption QC</h2>" + pd.DataFrame(rows).to_html(index=False)


def build_report(tables: TableStore, recipe: Recipe, instance: Any = None, vault: TableStore | None = None,
                 train: Any = None) -> str:
    parts: list[str] = []
    if vault is not None:
        parts.append(release_gate(tables, vault))
    f = funnel(tables)

    def draw_funnel(ax) -> None:
        tiers = [c for c in f.columns if c != "all"]
        bottom = pd.Series(0.0, index=f.index)
        for t in tiers:
            ax.barh(f.index[::-1], f[t][::-1], left=bottom[::-1], label=t)
            bottom += f[t]
        ax.set_xlabel("items (videos, then clips)")
        ax.legend(title="source tier", fontsize=8)

    parts.append("<h2>Funnel per stage and source tier</h2>" + _png(draw_funnel) + f.astype(int).to_html())
    ff = first_failed(tables)
    if len(ff):
        parts.append("<h2>Rejected clips by first failed rule</h2>"
                     + _png(lambda ax: ff.plot.barh(stacked=True, ax=ax)) + ff.to_html())
    scores = tables.read_all("clip_scores")
    if len(scores):
        thresholds = {}
        for rule in recipe.score_rules:
            thresholds.setdefault(rule.score, []).extend(x for x in (rule.min, rule.max) if x is not None)
        names = sorted(scores.score.unique())

        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        cols = 4
        rows = (len(names) + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(10, 2.4 * rows), dpi=100, squeeze=False)
        for ax, name in zip(axes.flat, names, strict=False):
            values = scores.loc[(scores.score == name) & (scores.status == "ok"), "value"].astype(float)
            ax.hist(values, bins=20, range=(0, 1), color="#4c72b0")
            for t in thresholds.get(name, []):
                ax.axvline(t, color="#c44e52", linestyle="--")
            ax.set_title(name, fontsize=9)
        for ax in list(axes.flat)[len(names):]:
            ax.axis("off")
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        plt.close(fig)
        parts.append(f"<h2>Score histograms (dashed: thresholds of recipe {html.escape(recipe.name)})</h2>"
                     f'<img alt="scores" src="data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}">')
    groups = tables.read_or_empty("dedup_groups")
    if len(groups):
        pdq = groups.drop_duplicates("pdq_group").pdq_group_size
        sem = groups.dropna(subset=["semantic_group"]).drop_duplicates("semantic_group").semantic_group_size

        def draw_groups(ax) -> None:
            top = int(max(pdq.max(), sem.max() if len(sem) else 1))
            ax.hist([pdq, sem], bins=[b + 0.5 for b in range(top + 1)], label=["perceptual (PDQ)", "semantic"])
            ax.set_xticks(range(1, top + 1))
            ax.set_xlabel("group size (clips)")
            ax.set_ylabel("groups")
            ax.legend(fontsize=8)

        parts.append("<h2>Duplicate group sizes</h2>" + _png(draw_groups)
                     + f"<p>{int((pdq > 1).sum())} perceptual and {int((sem > 1).sum())} semantic groups with more "
                     "than one clip.</p>")
    parts.append(curriculum_section(tables, train))
    if vault is not None:
        parts.append(caption_qc_section(vault))
    if instance is not None:
        tp = throughput(instance)
        if len(tp):
            def draw_throughput(ax) -> None:
                ax.barh(tp.stage[::-1], tp.step_seconds[::-1])
                ax.set_xlabel("step seconds (all materializations)")

            parts.append("<h2>Throughput per stage (Dagster step timings)</h2>" + _png(draw_throughput)
                         + tp.to_html(index=False))
    else:
        parts.append("<h2>Throughput per stage</h2><p>No Dagster instance given (--dagster-home).</p>")
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>vidassets report</title><style>"
            "body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;font-size:13px}"
            "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}img{max-width:100%}</style></head><body>"
            f"<h1>vidassets report</h1><p>store {html.escape(tables.uri)} · generated {generated}</p>"
            + "".join(parts) + "</body></html>")
