"""Each stage reads only what its catalog entry declares, and declares only what it reads: the views
a stage gets (``vidassets.stages.declared``) raise on an undeclared setting or table, and a whole
run's recorded reads match the catalog, asset by asset."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from dagster import DagsterInstance, materialize

from vidassets import catalog
from vidassets.config import parse_settings
from vidassets.resources import Pipeline, StageRun, StoreResource, build_resources
from vidassets.stages.declared import UndeclaredRead

from .conftest import graph_settings, run_graph, small_bucket

KEY = "licensed/drop-0001"


def test_views_refuse_undeclared_settings_and_tables(tmp_path: Path) -> None:
    settings = parse_settings({"store": {"uri": str(tmp_path / "store")}})
    run = StageRun(Pipeline(settings), "clips", KEY, StoreResource(root=str(tmp_path / "store")))
    assert run.settings.clips.min_seconds == settings.clips.min_seconds  # declared: the section itself
    assert run.settings.execution.max_runs == settings.execution.max_runs  # inert: how steps run
    with pytest.raises(UndeclaredRead, match="clips reads the setting 'probe.max_side'"):
        run.settings.probe.max_side  # noqa: B018 - the read under test
    with pytest.raises(UndeclaredRead, match="'analysis.detector'"):
        run.settings.analysis.detector  # noqa: B018 - the read under test
    assert run.settings.analysis.decode_threads == settings.analysis.decode_threads  # an inert leaf of it
    assert not run.tables.exists("video_analysis", KEY)  # clips' rows are computed from video_analysis
    with pytest.raises(UndeclaredRead, match="reads the table 'frame_index'"):
        run.tables.read("frame_index", KEY)  # not an input of clips' rows ...
    assert not run.which.exists("frame_index", KEY)  # ... though clips runs after it
    with pytest.raises(UndeclaredRead, match="writes the table 'video_analysis'"):
        run.tables.write("video_analysis", KEY, [])
    with pytest.raises(UndeclaredRead, match="writes"):
        run.which.write("clips", KEY, [])  # the which-items view writes nothing
    # a partially declared section: video_fingerprint declares ingest.tier_priority, nothing else of ingest
    fingerprint = StageRun(Pipeline(settings), "video_fingerprint", KEY, StoreResource(root=str(tmp_path / "store")))
    assert fingerprint.settings.ingest.tier_priority == settings.ingest.tier_priority
    with pytest.raises(UndeclaredRead, match="ingest.video_extensions"):
        fingerprint.settings.ingest.video_extensions  # noqa: B018 - the read under test


def test_a_stage_given_an_undeclared_read_fails(demo_bucket: Path, tmp_path: Path, monkeypatch) -> None:
    """Add an undeclared read to a stage's body: its run fails, naming the read."""
    from vidassets.graph import build_definitions
    from vidassets.stages import common, media  # noqa: F401 - media registers clips

    body, extra = common._ASSETS["clips"]

    def clips_reading_the_probe(context, store, pipeline):
        pipeline.run(context, store).settings.probe.max_side  # noqa: B018 - the read under test
        return body(context, store, pipeline)

    clips_reading_the_probe.__signature__ = inspect.signature(body)  # the same resources as the real body
    monkeypatch.setitem(common._ASSETS, "clips", (clips_reading_the_probe, extra))
    settings = graph_settings(small_bucket(demo_bucket, tmp_path), tmp_path)
    defs = build_definitions(settings)
    clips = next(a for a in defs.assets if a.key.to_user_string() == "clips")
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("source_shard", [KEY])
    result = materialize([clips], partition_key=KEY, resources=defs.resources, instance=instance,
                         raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "UndeclaredRead" in str(failure.event_specific_data.error)
    assert "probe.max_side" in str(failure.event_specific_data.error)


def test_what_each_stage_reads_in_a_run_is_what_the_catalog_declares(demo_bucket: Path, tmp_path: Path) -> None:
    """Run the graph (eval carve-out on, snapshot included) and compare, asset by asset, the settings
    and tables it read with its entry. ``models.*`` reach a model through the models resource (a
    model's version carries the compute dtype), so they are not read through the view."""
    settings = graph_settings(small_bucket(demo_bucket, tmp_path), tmp_path, **{"eval.fraction": 0.5})
    first = run_graph(settings, tmp_path)
    snapshot = run_graph(settings, tmp_path, select=["dataset_snapshot"], add_partitions=False)
    ran = set(first.stages) | set(snapshot.stages)
    assert "eval_features" in ran and "dataset_snapshot" in ran and "selection" in ran
    settings_read = {**first.reads.settings}
    tables_read = {name: set(first.reads.tables.get(name, ())) | set(snapshot.reads.tables.get(name, ()))
                   for name in ran}
    for name, more in snapshot.reads.settings.items():
        settings_read[name] = settings_read.get(name, set()) | more
    problems = []
    for name in sorted(ran):
        entry = catalog.entry(name)
        read = settings_read.get(name, set())
        for declared in entry.settings:
            if declared.startswith("models."):
                continue
            if not any(r == declared or r.startswith(declared + ".") or declared.startswith(r + ".") for r in read):
                problems.append(f"{name} declares the setting {declared} but never read it")
        data = {t for purpose, t in tables_read[name] if purpose == "tables"}
        for upstream in entry.reads:
            owner = catalog.entry(upstream)
            if not data & set(owner.tables + owner.vault_tables):
                problems.append(f"{name} declares it reads {upstream} but read none of its tables")
    assert not problems, "\n".join(problems)


def test_build_resources_gives_each_service_once() -> None:
    resources = build_resources(parse_settings({}))
    assert {"bucket", "store", "eval_vault", "pipeline", "execution", "models"} <= set(resources)
    models = resources["models"]
    registry = models.registry
    assert registry.get("silero-vad", 0.5) is registry.get("silero-vad", 0.5)  # built once, kept on the resource


def test_a_probe_version_change_expires_the_rows_that_read_probe_facts(demo_bucket: Path, tmp_path: Path,
                                                                      monkeypatch) -> None:
    """Analysis (rotation, counted frames), fingerprints (the frames to sample) and the ladder (the
    upright size) read the probe's facts: a new probe version leaves none of their rows current, and
    plan-change says those assets must compute their rows again."""
    from vidassets.change_plan import plan_change
    from vidassets.media import probe
    from vidassets.storage import TableStore, open_object_store
    from vidassets.storage.rows import matches
    from vidassets.versions import Versions

    settings = graph_settings(small_bucket(demo_bucket, tmp_path), tmp_path)
    run_graph(settings, tmp_path)
    tables = TableStore(open_object_store(settings.store.uri))

    def current(versions: Versions) -> dict[str, int]:
        rows = {name: tables.read_all(table).to_dict("records")
                for name, table in (("video_analysis", "video_analysis"), ("video_fingerprint", "video_fingerprints"),
                                    ("clip_ladder", "clip_ladder"))}
        clips = {r["clip_id"]: r for r in tables.read_all("clips").to_dict("records")}
        return {"video_analysis": sum(matches(r, versions.row("video_analysis")) for r in rows["video_analysis"]),
                "video_fingerprint": sum(matches(r, versions.fingerprint_row()) for r in rows["video_fingerprint"]),
                "clip_ladder": sum(matches(r, versions.window_row("clip_ladder", clips[r["clip_id"]]))
                                   for r in rows["clip_ladder"] if r["clip_id"] in clips)}

    before = current(Versions(settings))
    assert all(before.values()), before  # every kind has current rows
    monkeypatch.setattr(probe, "VERSION", probe.VERSION + "-fixed")
    assert current(Versions(settings)) == dict.fromkeys(before, 0)
    plans = {p.asset: p for p in plan_change(tables, settings)}
    for name in before:
        assert plans[name].stale and plans[name].rows_to_compute > 0, (name, plans[name])
