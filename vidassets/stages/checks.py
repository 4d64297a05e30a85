"""Asset checks that watch the whole graph: the stored tables still match their pandera schemas,
the quarantine rate per drop, the decoded/counted frame ratio of the CPU stages, and drift of each
filter's kill rate per source tier against the earlier partitions of that tier. Each check
attaches readable metadata (it shows in the UI under the asset's Checks tab)."""

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    ResourceParam,
    multi_asset_check,
)

from vidassets import catalog
from vidassets.curate.scores import rule_kill_rates
from vidassets.resources import Pipeline, StoreResource
from vidassets.stages.common import stage_check
from vidassets.storage.drop_batches import DropBatches
from vidassets.storage.rows import records
from vidassets.storage.schemas import SCHEMAS


def _partition(context: AssetCheckExecutionContext) -> str | None:
    return context.partition_key if context.has_partition_key else None


@multi_asset_check(
    specs=[AssetCheckSpec("schema", asset=AssetKey(a.name), description=f"Stored {', '.join(a.tables)} match their "
                          "pandera schemas") for a in catalog.ASSETS if a.tables],
    can_subset=True, name="table_schemas",
    description="Re-validates the stored tables (this partition's, or what the global table's latest write "
                "wrote) against their pandera schemas, lazily, reporting every failing check and column.")
def table_schemas(context: AssetCheckExecutionContext, store: StoreResource):
    tables = store.tables()
    partition = _partition(context)
    drops = DropBatches(tables.objects).drops_of(partition) if partition else []  # a batch: its drops
    for check_key in context.selected_asset_check_keys:
        name = check_key.asset_key.to_user_string()
        failures: dict[str, str] = {}
        rows = 0
        for table in catalog.tables_of(name):
            # in a partition's run: that partition (or the global table); run alone: every file.
            # A global table written a few drops at a time: the rows its latest write wrote (the
            # whole table is re-validated whenever a compaction rewrites it)
            if partition:
                parts = [d for d in drops if tables.exists(table, d)] or [None]
            else:
                parts = [None if p == "_all" else p for p in tables.partitions(table)]
            for part in parts:
                if not tables.exists(table, part):
                    continue
                frame = tables.read(table, part) if part else tables.latest_rows(table)
                rows += len(frame)
                try:
                    SCHEMAS[table].validate(frame, lazy=True)
                except Exception as exc:  # noqa: BLE001 - SchemaErrors: reported, not raised
                    cases = getattr(exc, "failure_cases", None)
                    text = cases.head(10).to_string() if cases is not None else str(exc)
                    failures[f"{table}/{part or 'global'}"] = text[:2000]
        yield AssetCheckResult(asset_key=check_key.asset_key, check_name="schema", passed=not failures,
                               severity=AssetCheckSeverity.ERROR,
                               metadata={"rows": rows, "partition": partition or "global",
                                         "failures": failures or "none"})


def table_checks() -> list:
    """The checks over every catalog table (not registered per asset)."""
    return [table_schemas]


@stage_check("video_probe", lambda s: f"Quarantined share of a drop's videos (warn above {s.checks.max_quarantine_rate:.0%}).")
def quarantine_rate(context: AssetCheckExecutionContext, store: StoreResource,
                    pipeline: ResourceParam[Pipeline]) -> AssetCheckResult:
    probe = store.tables().read_or_empty("video_probe", _partition(context))
    quarantined = probe[probe.status == "quarantined"] if len(probe) else probe
    rate = len(quarantined) / len(probe) if len(probe) else 0.0
    return AssetCheckResult(passed=rate <= pipeline.settings.checks.max_quarantine_rate, severity=AssetCheckSeverity.WARN,
                            metadata={"videos": len(probe), "quarantined": len(quarantined), "rate": round(rate, 4),
                                      "reasons": quarantined.reason.value_counts().head(5).to_dict()
                                      if len(quarantined) else {}})


@stage_check("video_analysis", "Frames decoded by the CPU stages over frames counted from packets: the analysis pass "
             "decodes each frame at most once (<= 1), the probe about one per file.")
def decoded_frames_ratio(context: AssetCheckExecutionContext, store: StoreResource) -> AssetCheckResult:
    tables, part = store.tables(), _partition(context)
    analysis, probe = tables.read_or_empty("video_analysis", part), tables.read_or_empty("video_probe", part)
    counted = float(analysis.counted_frames.fillna(0).sum()) if len(analysis) else 0.0
    decoded = float(analysis.frames_decoded.sum()) if len(analysis) else 0.0
    probe_per_file = float(probe.frames_decoded.fillna(0).mean()) if len(probe) else 0.0
    ratio = decoded / counted if counted else 0.0
    return AssetCheckResult(passed=ratio <= 1.0 and probe_per_file <= 2.0, severity=AssetCheckSeverity.WARN,
                            metadata={"frames_counted": int(counted), "analysis_frames_decoded": int(decoded),
                                      "analysis_ratio": round(ratio, 4), "probe_frames_per_file": round(probe_per_file, 3),
                                      "score_and_embedding_decodes": 0})


def _drift_description(s) -> str:
    c = s.checks
    return (f"Each recipe rule's kill rate in this drop vs the {c.kill_rate_window} earlier drops of the same source "
            f"tier, over the clips the rule's score was computed for (cascade skips are not kills; warn when it "
            f"moves by more than {c.kill_rate_drift:.0%}).")


@stage_check("clip_scores", _drift_description)
def kill_rate_drift(context: AssetCheckExecutionContext, store: StoreResource,
                    pipeline: ResourceParam[Pipeline]) -> AssetCheckResult:
    tables, part, c = store.tables(), _partition(context), pipeline.settings.checks
    if part is None:
        return AssetCheckResult(passed=True, metadata={"note": "runs per partition"})
    tier = part.split("/")[0]
    others = [p for p in tables.partitions("clip_scores") if p < part and p.split("/")[0] == tier][-c.kill_rate_window:]
    here = tables.read_or_empty("clip_scores", part)
    before = tables.read_all("clip_scores", others) if others else here.iloc[0:0]
    drift: dict[str, dict[str, float]] = {}
    flagged = []
    rules = pipeline.versions.recipe.score_rules
    now_rates, then_rates = (rule_kill_rates(records(frame), rules) for frame in (here, before))
    for rule in rules:
        if rule.name not in now_rates or rule.name not in then_rates:
            continue
        (now, n_now), (then, n_then) = now_rates[rule.name], then_rates[rule.name]
        drift[rule.name] = {"now": round(now, 4), "before": round(then, 4), "clips_now": n_now, "clips_before": n_then}
        if n_now >= c.kill_rate_min_clips and n_then >= c.kill_rate_min_clips and abs(now - then) > c.kill_rate_drift:
            flagged.append(rule.name)
    return AssetCheckResult(passed=not flagged, severity=AssetCheckSeverity.WARN, metadata={
        "source_tier": tier, "earlier_partitions": len(others), "by_rule": drift, "drifting": flagged or "none"})
