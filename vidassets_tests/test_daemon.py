"""The real daemon (`dagster dev`: webserver, sensors, automation) on a bucket of three drops of real
files: everything is carried through by automation alone; then new drops land one at a time, and the
runs launched for each are checked: its own chain, the global assets, and the work on selected clips
only for the drops whose selected clips changed, never before selection has seen the new drop. The
fourth drop changes no old drop's decisions; the fifth holds the sharp original of the second drop's
softened copy, so it becomes its duplicate group's representative and the old copy flips to reject.
Near-duplicates at ingest are off here so that the two copies meet in clip-level dedup (at ingest the
sharp copy would take over before the analysis pass: test_near_duplicates covers that path)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterEventType, DagsterInstance, DagsterRunStatus
from dagster._core.scheduler.instigation import TickStatus

from vidassets import catalog
from vidassets.jobs import JOBS
from vidassets.storage import TableStore, open_object_store
from vidassets.storage.drop_batches import DropBatches
from vidassets_tests.conftest import dagster_dev_env, dagster_dev_server

AFTER_GLOBAL = {a.name for a in catalog.after_global()}
GLOBAL = {a.name for a in catalog.of_kind("global")}
BIKES = "raw/licensed/drop-0001/bikes.mp4"
DROPS = {"licensed/drop-0001": "raw/licensed/drop-0001/carphone.mp4",
         "licensed/drop-0002": None,  # a softened copy of bikes, made below
         "web/drop-0003": "raw/licensed/drop-0002/bigbuckbunny_neardup.mp4"}
DONE = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)


def _add_drop(bucket: Path, demo_bucket: Path, key: str, source: str | None) -> None:
    drop = bucket / "raw" / key
    drop.mkdir(parents=True)
    if source is None:  # blurred and re-encoded: a near-duplicate that ranks below the original
        import cv2

        from vidassets.demo.bucket import decode_rgb, encode

        encode((cv2.GaussianBlur(f, (0, 0), 2.0) for f in decode_rgb(demo_bucket / BIKES)), drop / "bikes_soft.mp4",
               "libx264", 25, options={"preset": "veryfast", "crf": "28"})
    else:
        shutil.copy(demo_bucket / source, drop / Path(source).name)
    (drop / "_SUCCESS").write_bytes(b"")


def _settled(instance: DagsterInstance, since: float, timeout: float, what: str) -> list:
    """Wait until no run is queued or running and every sensor (the automation sensor included) has
    finished two ticks that started after the last run ended and after ``since``, all skipped (no run
    and no partition requested): their decisions read the instance's state, so a tick that starts
    once everything is done sees all of it. The retry sensor (5-minute interval) is left out: no row
    waits for a retry here."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = instance.get_runs()
        if runs and all(r.status in DONE for r in runs):
            failed = [r.run_id for r in runs if r.status != DagsterRunStatus.SUCCESS]
            assert not failed, f"failed runs: {failed}"
            moment = max(since, *(instance.get_run_stats(r.run_id).end_time or 0.0 for r in runs))
            sensors = [s for s in instance.all_instigator_state() if s.instigator_name != "retry_sensor"]
            ticks = {s.instigator_name: [t for t in instance.get_ticks(s.instigator_origin_id, s.selector_id, limit=10)
                                         if t.timestamp > moment and t.status != TickStatus.STARTED]
                     for s in sensors}
            if sensors and all(len(done) >= 2 and all(t.status == TickStatus.SKIPPED for t in done)
                               for done in ticks.values()):
                return runs
        time.sleep(2)
    raise AssertionError(f"timed out waiting for {what}")


def _passing(tables: TableStore) -> dict[str, set]:
    sel = tables.read_or_empty("selection")
    out: dict[str, set] = {}
    for r in sel[sel.decision == "pass"].itertuples():
        out.setdefault(r.source_shard, set()).add((r.clip_id, r.tier))
    return out


def _assets(run) -> set[str]:
    """The assets a run materializes (runs of the sensors' named jobs cover the whole job)."""
    return {k.to_user_string() for k in (run.asset_selection or set())} or set(JOBS.get(run.job_name, ()))


def _materialized_at(instance: DagsterInstance, run_id: str, asset: str) -> float:
    """When ``run_id`` stored its materialization of ``asset``."""
    events = instance.all_logs(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)
    times = [e.timestamp for e in events if e.dagster_event.asset_key == AssetKey(asset)]
    assert times, (run_id, asset)
    return min(times)


@pytest.mark.slow
@pytest.mark.parametrize("per_partition", [1, 2])
def test_a_new_drop_under_the_daemon_costs_its_own_runs(per_partition: int, demo_bucket: Path, tmp_path: Path) -> None:
    """Also with drops batched two to a partition (``bucket.drops_per_partition``): the same runs,
    counted per partition (web/drop-0004 joins web/drop-0003's batch; web/drop-0005 opens one)."""
    bucket = tmp_path / "bucket"
    for key, source in DROPS.items():
        _add_drop(bucket, demo_bucket, key, source)
    # steps in their run's process: what this test checks is which runs automation launches, not
    # how a run executes its steps (test_ui runs steps in processes of their own under `dagster dev`)
    with dagster_dev_env(tmp_path, bucket, {"near_duplicates": {"enabled": False},
                                            "execution": {"local_executor": "in_process"},
                                            "bucket": {"drops_per_partition": per_partition}}) as env:
        instance = DagsterInstance.get()  # this process reads the same instance
        with dagster_dev_server(tmp_path, env, tmp_path / "dagster-dev.log"):
            tables = TableStore(open_object_store(str(tmp_path / "store")))

            def partitions(drops) -> list[str]:
                return sorted(set(DropBatches(tables.objects).partition_of(drops).values()))

            first = _settled(instance, time.time(), 900, "the first three drops")
            assert set(_passing(tables)) <= set(DROPS)
            for drop in _passing(tables):  # automation alone carried each drop through to its latents
                assert instance.get_latest_materialization_event(AssetKey("latents")) is not None, drop
            seen = {r.run_id for r in first}
            # a drop that changes no old drop's decisions, then one whose clip beats an old representative
            for new_drop, source, old_changed in (("web/drop-0004", "raw/licensed/drop-0002/carphone_vp9.webm", set()),
                                                  ("web/drop-0005", BIKES, {"licensed/drop-0002"})):
                before = _passing(tables)
                _add_drop(bucket, demo_bucket, new_drop, source)
                runs = [r for r in _settled(instance, time.time(), 900, new_drop) if r.run_id not in seen]
                seen |= {r.run_id for r in runs}
                after = _passing(tables)
                changed = sorted(d for d in set(before) | set(after) if before.get(d, set()) != after.get(d, set()))
                assert set(changed) - {new_drop} == old_changed, (new_drop, changed)
                [home] = partitions([new_drop])
                if per_partition > 1:
                    assert home != new_drop  # a batch's key
                changed = partitions(changed)  # from here on: the partitions holding those drops
                post = [r for r in runs if _assets(r) & AFTER_GLOBAL]
                # the work on selected clips ran once per changed drop, for no other drop, in one run per drop
                assert sorted(r.tags.get("dagster/partition") for r in post) == changed, (new_drop, changed)
                assert all(_assets(r) == AFTER_GLOBAL for r in post)
                # ... and only after the selection that saw the new drop
                selections = [r for r in runs if "selection" in _assets(r)]
                assert selections
                # (a run's end time also counts its worker's teardown, after which a sensor may already have
                # launched the next run: the moment that matters is the selection's materialization)
                first_selection = min(_materialized_at(instance, r.run_id, "selection") for r in selections)
                for run in post:
                    assert instance.get_run_stats(run.run_id).start_time >= first_selection
                partitioned = {r.tags["dagster/partition"] for r in runs if r.tags.get("dagster/partition")}
                assert partitioned <= {home, *changed}
                # runs per new drop: its ingest, its chain, ONE run of the global assets, then one run per
                # changed drop (the new drop included): an old drop runs only when its decisions changed
                old_drop_runs = [r for r in runs if r.tags.get("dagster/partition") not in (None, home)]
                assert len(old_drop_runs) == len(set(changed) - {home})
                global_runs = [r for r in runs if _assets(r) & GLOBAL]
                assert len(global_runs) == 1 and _assets(global_runs[0]) == GLOBAL, global_runs
                assert len(runs) == 3 + len(changed), [sorted(_assets(r)) for r in runs]
                with open(tmp_path / "runs.txt", "a") as f:
                    f.write(f"{new_drop}: {len(runs)} runs, changed {changed}\n" + "\n".join(
                        f"  {r.tags.get('dagster/partition', 'global')}: {sorted(_assets(r))}" for r in runs) + "\n")
