"""Automation that scales with drops: the work on selected clips of a drop runs only after selection
has seen that drop, and a new selection requests it only for the drops whose selected clips changed
(one run each), never for every drop."""

from __future__ import annotations

import shutil
from pathlib import Path

from dagster import AssetKey, SensorResult, SkipReason, build_sensor_context, evaluate_automation_conditions

from vidassets import catalog
from vidassets.curate.selection import changed_drops
from vidassets.graph import build_definitions
from vidassets.runner import local_instance, materialize_bucket
from vidassets.storage import LocalObjectStore, TableStore, open_object_store
from vidassets_tests.conftest import CURATE_STAGES, graph_settings, run_graph, small_bucket

AFTER_GLOBAL = [a.name for a in catalog.after_global()]
GLOBAL = [a.name for a in catalog.of_kind("global")]


def _row(drop: str, clip: str, decision: str, tier: str | None = "T1") -> dict:
    return {"source_shard": drop, "clip_id": clip, "decision": decision, "tier": tier if decision == "pass" else None}


def test_changed_drops_are_the_drops_whose_selected_clips_changed() -> None:
    before = [_row("a", "a1", "pass"), _row("a", "a2", "reject"), _row("b", "b1", "pass")]
    assert changed_drops(before, before) == []
    new_drop = [*before, _row("c", "c1", "pass")]
    assert changed_drops(before, new_drop) == ["c"]
    rejected_only = [*before, _row("c", "c1", "reject")]
    assert changed_drops(before, rejected_only) == []  # nothing to annotate or encode there
    # a new clip beats an old group representative: the old drop's clip flips to reject
    flipped = [_row("a", "a1", "reject"), _row("a", "a2", "reject"), _row("b", "b1", "pass"), _row("c", "c1", "pass")]
    assert changed_drops(before, flipped) == ["a", "c"]
    retiered = [_row("a", "a1", "pass", "T0"), _row("a", "a2", "reject"), _row("b", "b1", "pass")]
    assert changed_drops(before, retiered) == ["a"]  # T0 clips get more rungs, earlier


def test_a_new_drop_requests_only_its_own_work_after_selection(demo_bucket: Path, tmp_path: Path, monkeypatch) -> None:
    from vidassets.stages import common

    # every write here is seconds old: with no look-back the journal names only what the new drop wrote
    monkeypatch.setattr(common, "JOURNAL_LAG_NS", 0)
    bucket = small_bucket(demo_bucket, tmp_path)
    settings = graph_settings(bucket, tmp_path)
    run_graph(settings, tmp_path)
    tables = TableStore(open_object_store(str(tmp_path / "store")))
    passing_before = _passing_by_drop(tables)
    instance = local_instance(str(tmp_path / "home"))
    defs = build_definitions(settings)
    settled = evaluate_automation_conditions(defs, instance)  # the daemon's view before the new drop
    drop = bucket / "raw/web/drop-0002"
    drop.mkdir(parents=True)
    shutil.copy(demo_bucket / "raw/licensed/drop-0002/bigbuckbunny_rot90.mp4", drop / "bunny.mp4")
    (drop / "_SUCCESS").write_bytes(b"")
    partitioned = [n for n in CURATE_STAGES if n not in GLOBAL]
    assert materialize_bucket(settings, instance, select=partitioned, log=lambda _: None).ok

    # the new drop's chain is done up to its scores: automation requests none of the work on selected
    # clips (for no drop: selection has not seen the new clips yet), nor the global assets ...
    evaluation = evaluate_automation_conditions(defs, instance, cursor=settled.cursor)
    for name in [*AFTER_GLOBAL, *GLOBAL]:
        assert evaluation.get_num_requested(AssetKey(name)) == 0, name
    # ... which the global-stages sensor requests, all in one run, once
    global_sensor = next(s for s in defs.sensors if s.name == "global_stages_sensor")
    requested = global_sensor(build_sensor_context(instance=instance, definitions=defs))
    assert isinstance(requested, SensorResult) and len(requested.run_requests) == 1
    assert sorted(k.to_user_string() for k in requested.run_requests[0].asset_selection) == sorted(GLOBAL)
    assert isinstance(global_sensor(build_sensor_context(instance=instance, definitions=defs,
                                                         cursor=requested.cursor)), SkipReason)

    sensor = next(s for s in defs.sensors if s.name == "selected_clips_sensor")
    first = sensor(build_sensor_context(instance=instance, definitions=defs, resources={"store": defs.resources["store"]}))
    cursor = first.cursor if isinstance(first, SensorResult) else None  # the first selection, already handled
    assert materialize_bucket(settings, instance, select=GLOBAL, add_partitions=False, log=lambda _: None).ok
    selected = instance.get_latest_materialization_event(AssetKey("selection")).asset_materialization.metadata
    assert selected["inventory_drops_read"].value == 1  # the new drop's inventory, not every drop's
    # no partitioned input listed whole: the journal named the new drop's partition of each (dedup: 4
    # tables; clusters: embeddings, inventory; decontamination: 4 + the eval vault's 2; selection: 3
    # and the two global tables it reads, listed: a base file and a few deltas)
    found = {}
    for name in GLOBAL:
        meta = instance.get_latest_materialization_event(AssetKey(name)).asset_materialization.metadata
        found[name] = (meta["input_tables_listed"].value, meta["input_partitions_looked_up"].value,
                       meta["input_version_buckets_read"].value)
    # and one bucket of stored versions per input store (decontamination: the bucket's and the vault's)
    assert found == {"dedup_groups": (0, 4, 1), "clip_clusters": (0, 2, 1), "decontamination": (0, 6, 2),
                     "selection": (2, 3, 1)}
    dedup_meta = instance.get_latest_materialization_event(AssetKey("dedup_groups")).asset_materialization.metadata
    assert dedup_meta["drops_read"].value == 0  # told the new drop changed: no covered drop's row read
    clusters_meta = instance.get_latest_materialization_event(AssetKey("clip_clusters")).asset_materialization.metadata
    assert clusters_meta["drops_read"].value == 0  # likewise: no stored drop's clusters state read
    changed = sorted(d for d, clips in _passing_by_drop(tables).items() if clips != passing_before.get(d, set()))
    assert "web/drop-0002" in changed and "licensed/drop-0001" not in changed

    result = sensor(build_sensor_context(instance=instance, definitions=defs, cursor=cursor, resources={"store": defs.resources["store"]}))
    assert isinstance(result, SensorResult)
    assert sorted(r.partition_key for r in result.run_requests) == changed  # one run per changed drop
    for request in result.run_requests:
        assert sorted(k.to_user_string() for k in request.asset_selection) == sorted(AFTER_GLOBAL)
    again = sensor(build_sensor_context(instance=instance, definitions=defs, cursor=result.cursor, resources={"store": defs.resources["store"]}))
    assert isinstance(again, SkipReason)
    # the global stages again with nothing changed: each keeps its rows and reports their count from
    # its table's index, reading no bucket of it
    read: list[str] = []
    real_get = LocalObjectStore.get_bytes
    monkeypatch.setattr(LocalObjectStore, "get_bytes", lambda self, key: (read.append(key), real_get(self, key))[1])
    assert materialize_bucket(settings, instance, select=GLOBAL, add_partitions=False, log=lambda _: None).ok
    read_by_the_run = list(read)
    written = [name for name in GLOBAL if tables.exists(name)]  # clusters: too few clips here to train
    assert set(GLOBAL) - set(written) <= {"clip_clusters"}
    for name in written:
        meta = instance.get_latest_materialization_event(AssetKey(name)).asset_materialization.metadata
        stored = tables.read(name)
        assert meta["inputs_unchanged"].value is True, name
        assert meta["rows_out"].value == (len(stored) if name != "selection" else int((stored.decision == "pass").sum()))
        assert meta["rows_in"].value == len(stored), name
    assert not [k for k in read_by_the_run if "/_groups/b" in k], read_by_the_run


def _passing_by_drop(tables: TableStore) -> dict[str, set[tuple]]:
    sel = tables.read_or_empty("selection")
    out: dict[str, set[tuple]] = {}
    for r in sel[sel.decision == "pass"].itertuples():
        out.setdefault(r.source_shard, set()).add((r.clip_id, r.tier))
    return out


def test_rows_waiting_for_a_retry_are_requested_again(demo_bucket: Path, tmp_path: Path, monkeypatch) -> None:
    from vidassets.curate import scores as scores_module

    bucket = small_bucket(demo_bucket, tmp_path)
    settings = graph_settings(bucket, tmp_path)
    instance = local_instance(str(tmp_path / "home"))
    defs = build_definitions(settings)
    sensor = next(s for s in defs.sensors if s.name == "retry_sensor")
    real = scores_module._model_score

    def flaky(name, model, frames, sc):
        if name == "faces":
            raise TimeoutError("face detector timed out")  # injected: a failure of the run
        return real(name, model, frames, sc)

    monkeypatch.setattr(scores_module, "_model_score", flaky)
    assert materialize_bucket(settings, instance, select=CURATE_STAGES, log=lambda _: None).ok
    result = sensor(build_sensor_context(instance=instance, definitions=defs))
    assert [(r.partition_key, [k.to_user_string() for k in r.asset_selection]) for r in result.run_requests] == \
        [("licensed/drop-0001", ["clip_scores"])]
    monkeypatch.setattr(scores_module, "_model_score", real)
    assert materialize_bucket(settings, instance, select=["clip_scores"], log=lambda _: None).ok
    quiet = sensor(build_sensor_context(instance=instance, definitions=defs, cursor=result.cursor))
    assert not quiet.run_requests  # the retry succeeded: nothing waits any more


def test_global_stages_wait_for_drops_in_flight_then_run_once() -> None:
    """A burst of drops (or a backfill) costs one global run: while other drops' chains are in flight
    the sensor waits for them, up to the configured bound."""
    from dagster import AssetMaterialization, DagsterInstance, DagsterRun, DagsterRunStatus

    from vidassets.config import load_settings
    from vidassets.jobs import sensor_jobs
    from vidassets.sensors import global_stages_sensor

    instance = DagsterInstance.ephemeral()
    job = sensor_jobs(load_settings(env={}))["global_stages"]
    patient, impatient = global_stages_sensor(job, 30, 3600), global_stages_sensor(job, 30, 0)
    assert isinstance(patient(build_sensor_context(instance=instance)), SkipReason)  # nothing finished yet
    instance.report_runless_asset_event(AssetMaterialization("clip_embeddings", partition="web/drop-0001"))
    in_flight = DagsterRun(job_name="__ASSET_JOB", run_id="b" * 32, status=DagsterRunStatus.STARTED,
                           asset_selection=frozenset({AssetKey("video_analysis"), AssetKey("clips")}))
    instance.add_run(in_flight)
    waiting = patient(build_sensor_context(instance=instance))
    assert isinstance(waiting, SkipReason) and "in flight" in waiting.skip_message
    late = impatient(build_sensor_context(instance=instance))  # waited long enough: run for what finished
    assert isinstance(late, SensorResult) and len(late.run_requests) == 1
    instance.report_run_canceled(in_flight)
    done = patient(build_sensor_context(instance=instance))
    assert isinstance(done, SensorResult)
    assert sorted(k.to_user_string() for k in done.run_requests[0].asset_selection) == sorted(GLOBAL)
    assert isinstance(patient(build_sensor_context(instance=instance, cursor=done.cursor)), SkipReason)
    # a global run in flight: the drops it has not seen go into the next one
    instance.report_runless_asset_event(AssetMaterialization("clip_scores", partition="web/drop-0002"))
    in_flight_global = DagsterRun(job_name="__ASSET_JOB", run_id="c" * 32, status=DagsterRunStatus.STARTED,
                                  asset_selection=frozenset({AssetKey("selection")}))
    instance.add_run(in_flight_global)
    assert isinstance(patient(build_sensor_context(instance=instance, cursor=done.cursor)), SkipReason)
    instance.report_run_canceled(in_flight_global)
    # a global run that started after the drop finished (a backfill's, the CLI's) covers it: no new run
    from dagster._core.events import DagsterEvent, DagsterEventType, StepMaterializationData

    covering = DagsterRun(job_name="__ASSET_JOB", run_id="e" * 32, status=DagsterRunStatus.STARTED)
    instance.add_run(covering)
    instance.report_dagster_event(DagsterEvent(DagsterEventType.RUN_START.value, job_name="__ASSET_JOB"),
                                  run_id=covering.run_id)
    instance.report_dagster_event(DagsterEvent(
        DagsterEventType.ASSET_MATERIALIZATION.value, job_name="__ASSET_JOB",
        event_specific_data=StepMaterializationData(AssetMaterialization(AssetKey("selection")))), run_id=covering.run_id)
    instance.report_run_canceled(covering)
    covered = patient(build_sensor_context(instance=instance, cursor=done.cursor))
    assert isinstance(covered, SensorResult) and not covered.run_requests and covered.cursor != done.cursor


def test_a_ui_backfill_runs_its_own_global_and_selected_clip_work() -> None:
    """While a backfill of the graph is in flight the global-stages sensor requests nothing (the
    backfill runs the global assets once, after its drops), and the selected-clips sensor leaves
    the drops that backfill targets to it, requesting only old drops whose decisions changed."""
    import time as clock

    from dagster import AssetMaterialization, DagsterInstance, DagsterRun, DagsterRunStatus
    from dagster._core.events import DagsterEvent, DagsterEventType, StepMaterializationData
    from dagster._core.execution.backfill import PartitionBackfill

    from vidassets.config import load_settings

    settings = load_settings(env={})
    defs = build_definitions(settings)
    instance = DagsterInstance.ephemeral()
    drops = ["web/drop-0001", "web/drop-0002"]
    instance.add_dynamic_partitions("source_shard", [*drops, "licensed/drop-0000"])
    keys = [AssetKey(a.name) for a in catalog.ASSETS if a.kind != "on_request"]
    backfill = PartitionBackfill.from_asset_partitions(
        backfill_id="bfbfbfbf", asset_graph=defs.resolve_asset_graph(), partition_names=drops, asset_selection=keys,
        backfill_timestamp=clock.time(), tags={}, dynamic_partitions_store=instance, all_partitions=False, title=None,
        description=None, run_config=None)
    instance.add_backfill(backfill)
    sensors = {s.name: s for s in defs.sensors}
    instance.report_runless_asset_event(AssetMaterialization("clip_embeddings", partition=drops[0]))
    waiting = sensors["global_stages_sensor"](build_sensor_context(instance=instance, definitions=defs))
    assert isinstance(waiting, SkipReason) and "backfill" in waiting.skip_message
    # the backfill's global run reports its selection: the new drops and an old one changed
    run = DagsterRun(job_name="__ASSET_JOB", run_id="d" * 32, status=DagsterRunStatus.SUCCESS,
                     tags={"dagster/backfill": "bfbfbfbf"})
    instance.add_run(run)
    instance.report_dagster_event(DagsterEvent(
        DagsterEventType.ASSET_MATERIALIZATION.value, job_name="__ASSET_JOB",
        event_specific_data=StepMaterializationData(AssetMaterialization(
            AssetKey("selection"), metadata={"changed_drops": [*drops, "licensed/drop-0000"]}))), run_id=run.run_id)
    result = sensors["selected_clips_sensor"](build_sensor_context(instance=instance, definitions=defs, resources={"store": defs.resources["store"]}))
    assert isinstance(result, SensorResult)
    assert [r.partition_key for r in result.run_requests] == ["licensed/drop-0000"]


def test_canonical_sensor_asks_the_named_drops_to_ingest_again(tmp_path: Path) -> None:
    """raw_inventory of a drop with a better copy names the holder (to release) and, on the holder's
    release, the new drop (to take it): the sensor turns each name into one raw_inventory run."""
    from dagster import AssetKey, AssetMaterialization, DagsterInstance, build_sensor_context

    from vidassets.resources import StoreResource
    from vidassets.sensors import canonical_sensor
    from vidassets.storage.drop_batches import DropBatches

    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("source_shards", ["web/drop-0001", "licensed/drop-0002"])
    sensor = canonical_sensor(30)
    store = {"store": StoreResource(root=str(tmp_path))}
    quiet = sensor(build_sensor_context(instance=instance, resources=store))
    assert not quiet.run_requests
    instance.report_runless_asset_event(AssetMaterialization(
        AssetKey("raw_inventory"), partition="licensed/drop-0002", metadata={"canonical_requests": ["web/drop-0001"]}))
    first = sensor(build_sensor_context(instance=instance, cursor=quiet.cursor, resources=store))
    assert [(r.partition_key, [k.to_user_string() for k in r.asset_selection]) for r in first.run_requests] == \
        [("web/drop-0001", ["raw_inventory"])]
    instance.report_runless_asset_event(AssetMaterialization(
        AssetKey("raw_inventory"), partition="web/drop-0001", metadata={"canonical_requests": ["licensed/drop-0002"]}))
    second = sensor(build_sensor_context(instance=instance, cursor=first.cursor, resources=store))
    assert [r.partition_key for r in second.run_requests] == ["licensed/drop-0002"]
    assert not sensor(build_sensor_context(instance=instance, cursor=second.cursor, resources=store)).run_requests
    # a drop batched into a partition (bucket.drops_per_partition > 1): its batch is asked
    DropBatches(store["store"].objects()).assign(["web/drop-0003"], 2)
    instance.report_runless_asset_event(AssetMaterialization(
        AssetKey("raw_inventory"), partition="web/drop-0001", metadata={"canonical_requests": ["web/drop-0003"]}))
    third = sensor(build_sensor_context(instance=instance, cursor=second.cursor, resources=store))
    assert [r.partition_key for r in third.run_requests] == ["web/~batch-000000"]


def test_canonical_sensor_asks_drops_to_decide_near_duplicates_again(tmp_path: Path) -> None:
    """video_fingerprint of a drop holding a better copy names the drops whose stored near-duplicate
    decision changed: one video_fingerprint run each (not raw_inventory); a cursor written before the
    sensor watched two assets (a plain storage id) still reads as raw_inventory's."""
    from dagster import AssetKey, AssetMaterialization, DagsterInstance, build_sensor_context

    from vidassets.resources import StoreResource
    from vidassets.sensors import canonical_sensor

    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("source_shards", ["crawl/drop-0001", "licensed/drop-0002"])
    sensor = canonical_sensor(30)
    store = {"store": StoreResource(root=str(tmp_path))}
    instance.report_runless_asset_event(AssetMaterialization(
        AssetKey("raw_inventory"), partition="licensed/drop-0002", metadata={"canonical_requests": []}))
    old_cursor = str(instance.fetch_materializations(AssetKey("raw_inventory"), limit=1).records[0].storage_id)
    instance.report_runless_asset_event(AssetMaterialization(
        AssetKey("video_fingerprint"), partition="licensed/drop-0002",
        metadata={"canonical_requests": ["crawl/drop-0001"]}))
    first = sensor(build_sensor_context(instance=instance, cursor=old_cursor, resources=store))
    assert [(r.partition_key, [k.to_user_string() for k in r.asset_selection]) for r in first.run_requests] == \
        [("crawl/drop-0001", ["video_fingerprint"])]
    assert not sensor(build_sensor_context(instance=instance, cursor=first.cursor, resources=store)).run_requests


def test_flips_are_the_older_drops_clips_whose_decision_or_tier_changed() -> None:
    import pandas as pd

    from vidassets.curate.selection import flips

    before = pd.DataFrame([_row("a", "a1", "pass"), _row("a", "a2", "reject"), _row("b", "b1", "pass", "T2"),
                           _row("c", "c1", "pass")])
    after = [_row("a", "a1", "reject"), _row("a", "a2", "reject"), _row("b", "b1", "pass", "T0"),
             _row("c", "c1", "reject"), _row("n", "n1", "pass")]
    # c is the drop whose own inputs changed: its clips are decided, not flipped; n is new
    assert flips(before, after, {"c", "n"}) == [
        {"clip_id": "a1", "drop": "a", "before": "pass/T1", "after": "reject"},
        {"clip_id": "b1", "drop": "b", "before": "pass/T2", "after": "pass/T0"}]
    assert flips(before.iloc[0:0], after, set()) == []
