"""Definitions, the bucket sensor, and in-process materialization through Dagster (local + S3)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from dagster import AssetKey, DagsterInstance, DefaultSensorStatus, SensorResult, SkipReason, build_sensor_context

from vidassets.config import Settings, load_settings
from vidassets.graph import build_definitions
from vidassets.partitions import source_shards
from vidassets.runner import local_instance, materialize_bucket
from vidassets.storage import TableStore, open_object_store
from vidassets.storage.objects import s3_client
from vidassets.versions import Versions
from vidassets_tests.conftest import REPO, SMALL_LATENTS, SMALL_LATENTS_YAML, upload_tree


def _settings(bucket: str, store: str, vault: str, **extra) -> Settings:
    overrides = {"bucket.uri": bucket, "store.uri": store, "store.eval_vault_uri": vault, **SMALL_LATENTS, **extra}
    return load_settings(env={}, overrides=overrides)


def test_definitions_validate_with_the_dagster_cli() -> None:
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "dagster"), "definitions", "validate", "-m", "vidassets.definitions"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_sensors_run_by_default_and_code_versions_carry_producer_versions(tmp_path: Path) -> None:
    settings = _settings(str(tmp_path / "b"), str(tmp_path / "s"), str(tmp_path / "v"),
                         **{"eval.salt": "abc", "eval.fraction": 0.01})
    defs = build_definitions(settings)
    sensors = {s.name: s for s in defs.sensors}
    assert sensors["bucket_drop_sensor"].default_status == DefaultSensorStatus.RUNNING
    assert sensors["vidassets_automation"].default_status == DefaultSensorStatus.RUNNING
    assert sensors["selected_clips_sensor"].default_status == DefaultSensorStatus.RUNNING
    assert sensors["retry_sensor"].default_status == DefaultSensorStatus.RUNNING
    graph = defs.resolve_asset_graph()
    versions = {k.to_user_string(): graph.get(k).code_version for k in graph.get_all_asset_keys()}
    assert versions["eval_split"] == Versions(settings).full("eval_split")
    other = _settings(str(tmp_path / "b"), str(tmp_path / "s"), str(tmp_path / "v"),
                      **{"eval.salt": "xyz", "eval.fraction": 0.01})
    assert Versions(other).full("eval_split") != Versions(settings).full("eval_split")  # salt is part of the version
    assert Versions(other).full("raw_inventory") == Versions(settings).full("raw_inventory")  # and of nothing else


def _tick(defs, instance, cursor):
    sensor = next(s for s in defs.sensors if s.name == "bucket_drop_sensor")
    context = build_sensor_context(instance=instance, cursor=cursor, resources={"bucket": defs.resources["bucket"],
                                                                                     "store": defs.resources["store"]})
    result = sensor(context)
    if isinstance(result, SensorResult):
        for request in result.dynamic_partitions_requests or []:
            instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    return result


def _sensor_scenario(defs, mark_complete) -> None:
    instance = DagsterInstance.ephemeral()
    first = _tick(defs, instance, None)
    assert isinstance(first, SensorResult)
    added = sorted(r.partition_key for r in first.run_requests)
    assert added == ["licensed/drop-0001", "licensed/drop-0002", "web/drop-0003"]  # not the incomplete drop-0004
    assert all(set(r.asset_selection) == {AssetKey("raw_inventory"), AssetKey("eval_split")} for r in first.run_requests)
    second = _tick(defs, instance, first.cursor)
    assert isinstance(second, SkipReason) and "1 incomplete" in second.skip_message
    # a lost cursor still never re-adds a drop: the partitions themselves remember
    assert isinstance(_tick(defs, instance, None), SkipReason)
    mark_complete()
    third = _tick(defs, instance, first.cursor)
    assert [r.partition_key for r in third.run_requests] == ["web/drop-0004"]
    assert json.loads(third.cursor) == ["web/drop-0004"]  # bounded by a tick's new drops, not by every drop
    assert sorted(instance.get_dynamic_partitions(source_shards.name)) == added + ["web/drop-0004"]
    assert isinstance(_tick(defs, instance, third.cursor), SkipReason)


def test_sensor_adds_only_complete_new_drops_once_local(bucket_copy: Path, tmp_path: Path) -> None:
    defs = build_definitions(_settings(str(bucket_copy), str(tmp_path / "s"), str(tmp_path / "v")))
    _sensor_scenario(defs, lambda: (bucket_copy / "raw/web/drop-0004/_SUCCESS").write_bytes(b""))


@pytest.mark.s3
def test_sensor_adds_only_complete_new_drops_once_s3(demo_bucket: Path, s3_endpoint: str, s3_bucket_name: str,
                                                      monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VIDASSETS_S3_ENDPOINT_URL", s3_endpoint)
    client = s3_client(s3_endpoint)
    upload_tree(client, demo_bucket, s3_bucket_name, "landing")
    defs = build_definitions(_settings(f"s3://{s3_bucket_name}/landing", str(tmp_path / "s"), str(tmp_path / "v")))
    _sensor_scenario(defs, lambda: client.put_object(Bucket=s3_bucket_name, Key="landing/raw/web/drop-0004/_SUCCESS", Body=b""))


def test_sensor_batches_new_drops_into_partitions(bucket_copy: Path, tmp_path: Path) -> None:
    """bucket.drops_per_partition: 2: the sensor puts new drops in batches per tier (recorded in the
    store), adds a partition per new batch, and requests each batch's ingest once per set of drops;
    a later drop joins its tier's open batch (no new partition)."""
    defs = build_definitions(_settings(str(bucket_copy), str(tmp_path / "s"), str(tmp_path / "v"),
                                       **{"bucket.drops_per_partition": 2}))
    instance = DagsterInstance.ephemeral()
    first = _tick(defs, instance, None)
    keys = {r.partition_key: r.run_key for r in first.run_requests}
    assert keys == {"licensed/~batch-000000": "ingest:licensed/~batch-000000:licensed/drop-0001,licensed/drop-0002",
                    "web/~batch-000000": "ingest:web/~batch-000000:web/drop-0003"}
    assert instance.get_dynamic_partitions(source_shards.name) == ["licensed/~batch-000000", "web/~batch-000000"]
    assert isinstance(_tick(defs, instance, first.cursor), SkipReason)
    # a lost cursor: the drops are recorded, so nothing is assigned again; their ingest (never run
    # here) is asked again under the same run keys, which Dagster launches once
    lost = _tick(defs, instance, None)
    assert {r.partition_key: r.run_key for r in lost.run_requests} == keys and not lost.dynamic_partitions_requests
    # ... unless a backfill in flight (a user's, from the UI) targets the batch: it runs the ingest itself
    import time

    from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill

    backfill = PartitionBackfill.from_asset_partitions(
        backfill_id="bfbfbfbf", asset_graph=defs.resolve_asset_graph(), partition_names=["web/~batch-000000"],
        asset_selection=[AssetKey("raw_inventory"), AssetKey("eval_split")], backfill_timestamp=time.time(), tags={},
        dynamic_partitions_store=instance, all_partitions=False, title=None, description=None, run_config=None)
    instance.add_backfill(backfill)
    assert [r.partition_key for r in _tick(defs, instance, None).run_requests] == ["licensed/~batch-000000"]
    instance.update_backfill(backfill.with_status(BulkActionStatus.COMPLETED_SUCCESS))
    # ... nor a drop that is no longer complete (recorded by hand, say, before its marker was written)
    (bucket_copy / "raw/licensed/drop-0002/_SUCCESS").unlink()
    assert [r.run_key for r in _tick(defs, instance, None).run_requests] == \
        ["ingest:licensed/~batch-000000:licensed/drop-0001", keys["web/~batch-000000"]]
    (bucket_copy / "raw/licensed/drop-0002/_SUCCESS").write_bytes(b"")
    (bucket_copy / "raw/web/drop-0004/_SUCCESS").write_bytes(b"")
    third = _tick(defs, instance, first.cursor)
    assert [(r.partition_key, r.run_key) for r in third.run_requests] == \
        [("web/~batch-000000", "ingest:web/~batch-000000:web/drop-0004")]
    assert not third.dynamic_partitions_requests and json.loads(third.cursor) == ["web/drop-0004"]
    assert len(instance.get_dynamic_partitions(source_shards.name)) == 2


def test_quiet_period_completion(bucket_copy: Path, tmp_path: Path) -> None:
    from vidassets.ingest.drops import list_drops
    from vidassets.storage import LocalObjectStore, ReadOnlyBucket

    settings = _settings(str(bucket_copy), str(tmp_path / "s"), str(tmp_path / "v"),
                         **{"bucket.completion": "quiet", "bucket.quiet_seconds": 60})
    bucket = ReadOnlyBucket(LocalObjectStore(bucket_copy))
    now = max(p.stat().st_mtime for p in bucket_copy.rglob("*") if p.is_file())
    assert list_drops(bucket, settings.bucket, now=now + 10).complete == []
    assert len(list_drops(bucket, settings.bucket, now=now + 61).complete) == 4


def _run(settings: Settings, tmp_path: Path, **kw):
    instance = local_instance(str(tmp_path / "dagster_home"))
    return materialize_bucket(settings, instance, log=lambda _: None, **kw)


@pytest.fixture(scope="module")
def local_e2e(demo_bucket: Path, tmp_path_factory) -> dict:
    """The whole graph over a private copy of the demo bucket, once for the tests below; records the
    bucket's files before and after."""
    tmp = tmp_path_factory.mktemp("e2e")
    bucket = tmp / "bucket"
    shutil.copytree(demo_bucket, bucket)
    files_before = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in bucket.rglob("*")}
    settings = _settings(str(bucket), str(tmp / "store"), str(tmp / "vault"), **{"eval.fraction": 0.3, "eval.salt": "e2e"})
    summary = _run(settings, tmp, complete_only=True)
    files_after = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in bucket.rglob("*")}
    return {"tmp": tmp, "settings": settings, "summary": summary, "before": files_before, "after": files_after}


def test_materialize_local_end_to_end(local_e2e: dict) -> None:
    tmp_path, settings, summary = local_e2e["tmp"], local_e2e["settings"], local_e2e["summary"]
    assert summary.ok and summary.skipped_incomplete == ["web/drop-0004"]
    tables = TableStore(open_object_store(str(tmp_path / "store")))
    vault = TableStore(open_object_store(str(tmp_path / "vault")))
    inventory = tables.read_all("raw_inventory")
    assert set(inventory.source_shard) == {"licensed/drop-0001", "licensed/drop-0002", "web/drop-0003"}
    train = tables.read_all("eval_split")
    evals = vault.read_all("eval_assets")
    assert len(evals) > 0 and len(train) > 0
    assert not set(train.asset_id) & set(evals.asset_id)  # no asset on both sides, duplicates included
    samples = inventory[(inventory.status == "ok") & inventory.media_type.isin(["video", "image"])]
    assert set(train.uri) | set(evals.uri) == set(samples.uri)
    assert (inventory.media_type == "image").sum() == 5  # the demo's stills (three loose, two in a tar)
    # the stills went the whole way: 1-frame clips, and latents in 1-frame buckets
    clips = tables.read_all("clips")
    stills = clips[clips.media_type == "image"]
    assert len(stills) and (stills.num_frames == 1).all()
    latents = tables.read_all("latents")
    still_latents = latents[latents.clip_id.isin(stills.clip_id) & (latents.status == "ok")]
    assert len(still_latents) and still_latents.bucket.str.startswith("f1_").all()
    assert not (tmp_path / "store" / "tables" / "eval_assets").exists()  # eval rows never in the train store
    # every stage ran, derived assets included
    for stage in ("clips", "selection", "annotations", "latents", "text_embeddings"):
        assert summary.stages[stage].runs >= 1 and not summary.stages[stage].failures, stage
    # the run is recorded in the instance, per partition
    instance = DagsterInstance.from_config(str(tmp_path / "dagster_home"))
    mats = instance.fetch_materializations(AssetKey("raw_inventory"), limit=10).records
    assert {m.partition_key for m in mats} == set(inventory.source_shard)
    # a second run over the same bucket re-hashes nothing, decodes nothing, calls no model
    again = _run(settings, tmp_path, complete_only=True)
    assert again.stages["raw_inventory"].extra["rows_reused"] == again.stages["raw_inventory"].rows_out
    assert tables.read_all("raw_inventory").drop(columns=["object_version"]).equals(inventory.drop(columns=["object_version"]))
    for stage in again.stages.values():
        assert stage.extra.get("model_calls", 0) == 0 and stage.extra.get("frames_decoded", 0) == 0, stage


def test_the_bucket_is_never_written(local_e2e: dict) -> None:
    assert local_e2e["before"] == local_e2e["after"]


VOLATILE = {"seconds", "encode_run"}  # how long a row took, which encode run wrote it: never equal across runs


def test_drops_batched_into_partitions_give_the_same_rows(local_e2e: dict) -> None:
    """bucket.drops_per_partition: 2 over the same bucket: two partitions (a batch per tier) instead
    of three, every table's rows equal to one partition per drop (stored per drop, lineage per drop),
    and a second run reuses everything."""
    from vidassets import catalog
    from vidassets.storage.drop_batches import DropBatches

    tmp = local_e2e["tmp"] / "batched"
    tmp.mkdir()
    settings = _settings(local_e2e["settings"].bucket.uri, str(tmp / "store"), str(tmp / "vault"),
                         **{"eval.fraction": 0.3, "eval.salt": "e2e", "bucket.drops_per_partition": 2})
    summary = _run(settings, tmp, complete_only=True)
    assert summary.ok and summary.drops == ["licensed/drop-0001", "licensed/drop-0002", "web/drop-0003"]
    assert summary.stages["clips"].runs == 2 and summary.stages["latents"].runs == 2  # a step per batch
    instance = DagsterInstance.from_config(str(tmp / "dagster_home"))
    assert instance.get_dynamic_partitions(source_shards.name) == ["licensed/~batch-000000", "web/~batch-000000"]
    # a second run settles a near-duplicate decision that borrowed a later drop's fingerprints, for
    # both stores (the drop-per-partition one may have run once or twice by now)
    again = _run(settings, tmp, complete_only=True)
    assert again.ok and again.stages["raw_inventory"].extra["rows_reused"] == again.stages["raw_inventory"].rows_out
    for stage in again.stages.values():
        assert stage.extra.get("model_calls", 0) == 0 and stage.extra.get("frames_decoded", 0) == 0, stage
    assert _run(local_e2e["settings"], local_e2e["tmp"], complete_only=True).ok
    one, batched = (TableStore(open_object_store(str(root / "store"))) for root in (local_e2e["tmp"], tmp))
    assert DropBatches(batched.objects).recorded() == {"licensed/drop-0001": "licensed/~batch-000000",
                                                      "licensed/drop-0002": "licensed/~batch-000000",
                                                      "web/drop-0003": "web/~batch-000000"}
    compared = 0
    for table in sorted({t for a in catalog.ASSETS for t in a.tables}):
        assert one.partitions(table) == batched.partitions(table), table  # stored per drop, never per batch
        for part in one.partitions(table):
            part = None if part == "_all" else part
            a, b = one.read(table, part), batched.read(table, part)
            keep = [c for c in a.columns if c not in VOLATILE]
            pd.testing.assert_frame_equal(a[keep], b[keep], obj=f"{table}/{part}")
            compared += 1
    assert compared > 40
    mats = instance.fetch_materializations(AssetKey("clips"), limit=10).records
    drops = {m.partition_key: m.asset_materialization.metadata["batch_drops"].value for m in mats}
    assert drops == {"licensed/~batch-000000": ["licensed/drop-0001", "licensed/drop-0002"],
                     "web/~batch-000000": ["web/drop-0003"]}


@pytest.mark.slow
@pytest.mark.s3
def test_materialize_s3_end_to_end_matches_local(demo_bucket: Path, local_e2e: dict, s3_endpoint: str,
                                                 s3_bucket_name: str, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VIDASSETS_S3_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("VIDASSETS_VAULT_AWS_ACCESS_KEY_ID", "vault-key")  # the vault's own pair (sealed by default)
    monkeypatch.setenv("VIDASSETS_VAULT_AWS_SECRET_ACCESS_KEY", "vault-secret")
    client = s3_client(s3_endpoint)
    # two of the demo's drops (an eval asset, tar members, exact copies, an incomplete drop) keep it quick
    subset = tmp_path / "subset"
    for drop in ("raw/licensed/drop-0001", "raw/web/drop-0003", "raw/web/drop-0004"):
        shutil.copytree(demo_bucket / drop, subset / drop)
    upload_tree(client, subset, s3_bucket_name, "raw-root")
    client.create_bucket(Bucket=f"{s3_bucket_name}-out")
    s3_settings = _settings(f"s3://{s3_bucket_name}/raw-root", f"s3://{s3_bucket_name}-out/catalog",
                            f"s3://{s3_bucket_name}-out/eval_vault", **{"eval.fraction": 0.3, "eval.salt": "e2e"})
    summary = _run(s3_settings, tmp_path / "s3", complete_only=True)
    assert summary.ok
    s3_tables = TableStore(open_object_store(f"s3://{s3_bucket_name}-out/catalog"))
    local_tables = TableStore(open_object_store(str(local_e2e["tmp"] / "store")))  # the same bucket, run locally
    for table in ("raw_inventory", "eval_split"):
        s3_rows = s3_tables.read_all(table)
        local_rows = local_tables.read_all(table, ["licensed/drop-0001", "web/drop-0003"])
        key = s3_rows.uri.str.split("/raw/").str[1] + "|" + s3_rows.asset_id.fillna("")
        local_key = local_rows.uri.str.split("/raw/").str[1] + "|" + local_rows.asset_id.fillna("")
        assert sorted(key) == sorted(local_key), table
    assert s3_tables.read_all("raw_inventory").uri.str.startswith(f"s3://{s3_bucket_name}/raw-root/raw/").all()
    objects = client.list_objects_v2(Bucket=f"{s3_bucket_name}-out", Prefix="eval_vault/")["KeyCount"]
    assert objects > 0
    # the input bucket holds exactly what was uploaded
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket_name)["Contents"]}
    assert len(keys) == sum(1 for p in subset.rglob("*") if p.is_file())
    for stage in ("clips", "selection", "latents", "clip_ladder", "clip_audio"):  # the whole graph ran on S3
        assert summary.stages[stage].runs >= 1 and not summary.stages[stage].failures, stage


def test_cli_materialize_and_table(bucket_copy: Path, tmp_path: Path) -> None:
    vidassets = str(Path(sys.executable).parent / "vidassets")
    env_free = {"PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path)}
    config = tmp_path / "small.yaml"
    config.write_text(json.dumps(SMALL_LATENTS_YAML))
    proc = subprocess.run(
        [vidassets, "materialize", "--bucket", str(bucket_copy), "--store", str(tmp_path / "store"),
         "--dagster-home", str(tmp_path / "home"), "--config", str(config),
         "--select", "raw_inventory,eval_split"],  # the whole graph through the CLI: test_demo_command
        capture_output=True, text=True, cwd=tmp_path, env=env_free, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "raw_inventory" in proc.stdout and "web/drop-0004" in proc.stdout  # explicit runs take every drop
    out = subprocess.run(
        [vidassets, "table", "raw_inventory", "--store", str(tmp_path / "store"), "--partition", "web/drop-0003"],
        capture_output=True, text=True, cwd=tmp_path, env=env_free, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    copy = next(r for r in rows if r["uri"].endswith("bikes_copy.mp4"))
    assert copy["duplicate_of"] and copy["duplicate_of_uri"].endswith("drop-0001/bikes.mp4")
    csv = subprocess.run([vidassets, "table", "eval_split", "--store", str(tmp_path / "store"), "--format", "csv"],
                         capture_output=True, text=True, cwd=tmp_path, env=env_free, timeout=120)
    assert csv.returncode == 0 and csv.stdout.startswith("uri,asset_id,")
    bad = subprocess.run([vidassets, "materialize", "--bucket", str(bucket_copy), "--select", "nope",
                          "--store", str(tmp_path / "store"), "--dagster-home", str(tmp_path / "home")],
                         capture_output=True, text=True, cwd=tmp_path, env=env_free, timeout=120)
    assert bad.returncode == 2 and "nope" in bad.stderr


@pytest.mark.slow
def test_demo_command_runs_on_a_fresh_home(demo_bucket: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    shutil.copytree(demo_bucket, home / "demo_bucket")
    shutil.copy(demo_bucket.parent / "demo_truth.json", home / "demo_truth.json")
    proc = subprocess.run([str(Path(sys.executable).parent / "vidassets"), "demo", "--home", str(home)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "incomplete drops skipped: web/drop-0004" in proc.stdout
    assert "raw_inventory" in proc.stdout and "eval_split" in proc.stdout
