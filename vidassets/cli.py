"""``vidassets`` command line: materialize a bucket, print a table, run the demo.

    vidassets materialize --bucket URI --store URI [--select ASSET,...]
    vidassets table NAME --store URI [--partition KEY] [--format json|csv] [--binary base64|omit]
    vidassets demo
    vidassets plan-change --config NEW.yaml [--store URI] [--json]
    vidassets report -o report.html [--store URI] [--dagster-home DIR]
    vidassets snapshot create|diff A B, vidassets takedown, vidassets lineage sample CLIP_ID | steps
    vidassets plan inspect --snapshot N --steps A:B [--plot FILE]
    vidassets golden import FILE.jsonl
    vidassets models check [--config FILE] [--json], vidassets egress render [--config FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vidassets.config import DEFAULT_HOME, ConfigError, dagster_home, load_settings

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vidassets", description="Raw video bucket → training-ready data, as Dagster assets.")
    sub = parser.add_subparsers(dest="command", required=True)

    _catalog_commands(sub)
    _release_commands(sub)
    _other_commands(sub)
    return parser


def _catalog_commands(sub) -> None:
    """materialize, table, plan-change, report."""
    m = sub.add_parser("materialize", help="run the asset graph in-process for every drop in a bucket")
    m.add_argument("--bucket", help="input bucket URI: a path, file:// or s3://bucket/prefix (default: config/env)")
    m.add_argument("--store", help="output store URI (default: config/env)")
    m.add_argument("--eval-vault", help="eval vault URI (default: config/env, else a sibling 'eval_vault' of the store)")
    m.add_argument("--config", help="YAML config file (default: $VIDASSETS_CONFIG or ./vidassets.yaml)")
    m.add_argument("--select", help="comma-separated asset names to materialize (default: all)")
    m.add_argument("--complete-only", action="store_true",
                   help="only drops the sensor would take (with their completion marker); default: every drop")
    m.add_argument("--retry-quarantined", action="store_true",
                   help="probe quarantined files again (later runs otherwise never retry them)")
    m.add_argument("--dagster-home", help=f"Dagster instance dir (default: $DAGSTER_HOME or {DEFAULT_HOME}/dagster_home)")
    m.set_defaults(func=_materialize)

    t = sub.add_parser("table", help="print a catalog table")
    t.add_argument("name", help="table name, e.g. raw_inventory, eval_split")
    t.add_argument("--store", help="store URI (default: config/env)")
    t.add_argument("--partition", help="one partition key (<tier>/<drop>); default: all partitions")
    t.add_argument("--format", choices=["json", "csv"], default="json")
    t.add_argument("--binary", choices=["base64", "omit"], default="base64",
                   help="binary columns (embedding vectors, hashes): base64 text (default) or left out")
    t.add_argument("--eval-vault", action="store_true", help="read from the eval vault instead of the store")
    t.add_argument("--config", help="YAML config file")
    t.set_defaults(func=_table)

    pc = sub.add_parser("plan-change", help="dry run: what an edited config would recompute, and its estimated cost")
    pc.add_argument("--config", required=True, help="the edited YAML config file")
    pc.add_argument("--store", help="store URI (default: the config's / env)")
    pc.add_argument("--dagster-home", help="Dagster instance with measured step timings (default: $DAGSTER_HOME "
                    f"or {DEFAULT_HOME}/dagster_home; skipped if absent)")
    pc.add_argument("--json", action="store_true", help="print the plan as JSON")
    pc.set_defaults(func=_plan_change)

    r = sub.add_parser("report", help="write a static HTML report (funnel, rejects, scores, duplicates, throughput)")
    r.add_argument("-o", "--output", required=True, help="HTML file to write")
    r.add_argument("--store", help="store URI (default: config/env)")
    r.add_argument("--config", help="YAML config file (its recipe's thresholds are marked)")
    r.add_argument("--dagster-home", help="Dagster instance for step timings (optional)")
    r.add_argument("--eval-vault", help="eval vault URI for the release gate (default: config/env)")
    r.set_defaults(func=_report)


def _release_commands(sub) -> None:
    """snapshot, takedown, lineage."""
    sn = sub.add_parser("snapshot", help="create a dataset snapshot, or diff two")
    snsub = sn.add_subparsers(dest="snapshot_command", required=True)
    sc = snsub.add_parser("create", help="materialize dataset_snapshot (takedowns applied)")
    sc.add_argument("--store", help="store URI (default: config/env)")
    sc.add_argument("--config", help="YAML config file")
    sc.add_argument("--dagster-home", help="Dagster instance dir")
    sc.set_defaults(func=_snapshot_create)
    sd = snsub.add_parser("diff", help="samples added/removed between two snapshots, with the reason")
    sd.add_argument("a", type=int, help="older snapshot version (N of snapshots/vN)")
    sd.add_argument("b", type=int, help="newer snapshot version")
    sd.add_argument("--store", help="store URI (default: config/env)")
    sd.add_argument("--config", help="YAML config file")
    sd.add_argument("--format", choices=["text", "json"], default="text")
    sd.set_defaults(func=_snapshot_diff)
    sr = snsub.add_parser("retire", help="mark a snapshot retired: its shards become collectable (after a lease) "
                                         "unless a registered run trains on it")
    sr.add_argument("version", type=int, help="snapshot version N")
    sr.add_argument("--reason", default="")
    sr.add_argument("--store", help="store URI (default: config/env)")
    sr.add_argument("--config", help="YAML config file")
    sr.set_defaults(func=_snapshot_retire)
    sg = snsub.add_parser("collect", help="delete the shards no live snapshot has referenced for the lease")
    sg.add_argument("--lease-hours", type=float, default=168.0, help="default: 168 (a week)")
    sg.add_argument("--store", help="store URI (default: config/env)")
    sg.add_argument("--config", help="YAML config file")
    sg.set_defaults(func=_snapshot_collect)

    tk = sub.add_parser("takedown", help="tombstone an asset, source shard, source tier or license")
    tk.add_argument("--store", help="store URI (default: config/env)")
    tk.add_argument("--config", help="YAML config file")
    group = tk.add_mutually_exclusive_group(required=True)
    for kind in ("asset-id", "source-shard", "source-tier", "license"):
        group.add_argument(f"--{kind}", dest=kind.replace("-", "_"))
    tk.add_argument("--reason", required=True, help="why (kept with every excluded sample)")
    tk.set_defaults(func=_takedown)

    rn = sub.add_parser("run", help="the training-run registry: which run trained on which snapshot, plan and steps")
    rnsub = rn.add_subparsers(dest="run_command", required=True)
    rr = rnsub.add_parser("register", help="record a training run (its snapshot, plan file and steps)")
    rr.add_argument("run_id", help="the run's id (letters, digits, '.', '_', '-'); never reused")
    rr.add_argument("--snapshot", type=int, required=True, help="snapshot version N")
    rr.add_argument("--plan", help="plan file key plans/vN/<digest>.json (default: the snapshot's only plan)")
    rr.add_argument("--steps", help="A:B, the steps it trains, inclusive (default: the plan's total_steps)")
    rr.add_argument("--note", default="", help="free text kept with the record")
    rr.add_argument("--store", help="store URI (default: config/env)")
    rr.add_argument("--config", help="YAML config file")
    rr.set_defaults(func=_run_register)
    rl = rnsub.add_parser("list", help="the training_runs table")
    rl.add_argument("--store", help="store URI (default: config/env)")
    rl.add_argument("--config", help="YAML config file")
    rl.add_argument("--format", choices=["json", "csv"], default="json")
    rl.set_defaults(func=_run_list)

    li = sub.add_parser("lineage", help="where a training sample came from")
    lisub = li.add_subparsers(dest="lineage_command", required=True)
    ls = lisub.add_parser("sample", help="everything known about one clip, source to snapshots")
    ls.add_argument("clip_id")
    ls.add_argument("--store", help="store URI (default: config/env)")
    ls.add_argument("--config", help="YAML config file")
    ls.set_defaults(func=_lineage_sample)
    lst = lisub.add_parser("steps", help="exactly the clips served at some steps of a plan, with their sources")
    lst.add_argument("--snapshot", type=int, required=True, help="snapshot version N")
    lst.add_argument("--seed", type=int, help="plan seed (default: train.seed)")
    lst.add_argument("--steps", required=True, help="A:B (steps A..B-1) or one step")
    lst.add_argument("--world-size", type=int, help="ranks (default: train.world_size)")
    lst.add_argument("--global-batch", type=int, help="default: train.global_batch")
    lst.add_argument("--store", help="store URI (default: config/env)")
    lst.add_argument("--config", help="YAML config file (seed, batch)")
    lst.set_defaults(func=_lineage_steps)


def _other_commands(sub) -> None:
    """golden, plan, export, demo."""
    go = sub.add_parser("golden", help="the golden caption set in the eval vault (caption QC)")
    gosub = go.add_subparsers(dest="golden_command", required=True)
    gi = gosub.add_parser("import", help="add or replace golden clips: JSON lines of {asset_id, first_frame, "
                                         "last_frame, captions: {level_1: ...}, golden_id (optional)}")
    gi.add_argument("file")
    gi.add_argument("--store", help="store URI (default: config/env)")
    gi.add_argument("--eval-vault", help="eval vault URI (default: config/env, else a sibling of the store)")
    gi.add_argument("--config", help="YAML config file")
    gi.set_defaults(func=_golden_import)

    pl = sub.add_parser("plan", help="a training plan of a snapshot")
    plsub = pl.add_subparsers(dest="plan_command", required=True)
    pi = plsub.add_parser("inspect", help="the realized-stream monitor over some steps: autocorrelation of stream, "
                                          "cluster and source ids, repeats, realized vs configured shares")
    pi.add_argument("--snapshot", type=int, required=True, help="snapshot version N")
    pi.add_argument("--steps", required=True, help="A:B (steps A..B-1)")
    pi.add_argument("--seed", type=int, help="plan seed (default: train.seed)")
    pi.add_argument("--global-batch", type=int, help="default: train.global_batch")
    pi.add_argument("--plot", help="also write the plot (PNG) here")
    pi.add_argument("--store", help="store URI (default: config/env)")
    pi.add_argument("--config", help="YAML config file (seed, batch)")
    pi.set_defaults(func=_plan_inspect)

    ex = sub.add_parser("export", help="export a snapshot for another trainer")
    exsub = ex.add_subparsers(dest="export_command", required=True)
    for trainer, text in (("vjepa", "clip files + the video list V-JEPA 2's VideoDataset reads (path label)"),
                          ("diffsynth", "clip files + the metadata.csv (video, prompt) DiffSynth-Studio's Wan/DiT "
                                        "training scripts read"),
                          ("nemo", "a NeMo AutoModel latent cache (metadata.json, one .meta per sample: the "
                                   "snapshot's latents and caption token states) for TextToVideoDataset")):
        ev = exsub.add_parser(trainer, help=text)
        ev.add_argument("--snapshot", type=int, help="snapshot version N (default: the newest)")
        ev.add_argument("--to", required=True, help="local directory the export is written to")
        if trainer == "diffsynth":
            ev.add_argument("--short-side", type=int, help="the smallest ladder rung at least this tall "
                                                           "(default: each clip's largest)")
        if trainer == "nemo":
            ev.add_argument("--model-type", default="wan", help="model_type written in each cache file (default: wan)")
            ev.add_argument("--resolution", type=int, help="the latents short side to export (one of "
                                                           "latents.resolutions; default: each sample's first)")
        ev.add_argument("--store", help="store URI (default: config/env)")
        ev.add_argument("--config", help="YAML config file")
        ev.set_defaults(func=_export)

    mo = sub.add_parser("models", help="the configured models")
    mosub = mo.add_subparsers(dest="models_command", required=True)
    mc = mosub.add_parser("check", help="load every configured model once and run a tiny forward: slot, weights digest, "
                                        "version, device, dtype, provider, time; non-zero exit on any failure")
    mc.add_argument("--config", help="YAML config file (e.g. deployments/models.production.yaml)")
    mc.add_argument("--json", action="store_true", help="print JSON instead of a table")
    mc.set_defaults(func=_models_check)

    eg = sub.add_parser("egress", help="the step pods' egress NetworkPolicies")
    egsub = eg.add_subparsers(dest="egress_command", required=True)
    er = egsub.add_parser("render", help="print the media and annotator pods' NetworkPolicies for these settings "
                                         "(kubectl apply -f -); the annotators' allow the configured model endpoints")
    er.add_argument("--config", help="YAML config file")
    er.set_defaults(func=_egress_render)

    d = sub.add_parser("demo", help="build the demo bucket and materialize everything on local storage")
    d.add_argument("--home", default=DEFAULT_HOME, help="where the demo bucket, store and Dagster instance live")
    d.add_argument("--rebuild", action="store_true", help="rebuild the demo bucket and wipe the store first")
    d.set_defaults(func=_demo)


def _materialize(args: argparse.Namespace) -> int:
    from vidassets.runner import local_instance, materialize_bucket

    settings = load_settings(args.config, overrides={
        "bucket.uri": args.bucket, "store.uri": args.store, "store.eval_vault_uri": args.eval_vault,
    })
    select = [s.strip() for s in args.select.split(",") if s.strip()] if args.select else None
    try:
        summary = materialize_bucket(settings, local_instance(args.dagster_home), select, args.complete_only,
                                     retry_quarantined=args.retry_quarantined)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(summary.render())
    return EXIT_OK if summary.ok else EXIT_FAILED


def _table(args: argparse.Namespace) -> int:
    from vidassets.storage import TableStore, open_object_store
    from vidassets.storage.schemas import SCHEMAS

    settings = load_settings(args.config, overrides={"store.uri": args.store})
    uri = settings.store.vault_uri() if args.eval_vault else settings.store.uri
    if args.name not in SCHEMAS:
        print(f"error: unknown table {args.name!r}; known: {sorted(SCHEMAS)}", file=sys.stderr)
        return EXIT_USAGE
    tables = TableStore(open_object_store(uri))
    if args.partition and not tables.exists(args.name, args.partition):
        print(f"error: no partition {args.partition!r} of table {args.name} in {uri}", file=sys.stderr)
        return EXIT_USAGE
    frame = _printable(tables.read(args.name, args.partition) if args.partition else tables.read_all(args.name),
                       args.binary)
    if args.format == "csv":
        frame.to_csv(sys.stdout, index=False)
    else:
        records = json.loads(frame.to_json(orient="records", date_format="iso"))
        json.dump(records, sys.stdout, indent=1)
        sys.stdout.write("\n")
    return EXIT_OK


def _printable(frame, binary: str):
    """Binary cells (float32 vectors, raw hashes) as base64 text, or their columns dropped: JSON and
    CSV hold text only."""
    import base64

    columns = [c for c in frame.columns if frame[c].map(lambda v: isinstance(v, bytes | bytearray)).any()]
    if binary == "omit":
        return frame.drop(columns=columns)
    frame = frame.copy()
    for column in columns:
        frame[column] = frame[column].map(
            lambda v: base64.b64encode(v).decode("ascii") if isinstance(v, bytes | bytearray) else v)
    return frame


def _instance_if_present(path: str | None):

    from vidassets.runner import local_instance

    home = dagster_home(path)
    return local_instance(home) if Path(home).is_dir() else None


def _plan_change(args: argparse.Namespace) -> int:
    from vidassets.change_plan import plan_change, render, to_json
    from vidassets.storage import TableStore, open_object_store

    settings = load_settings(args.config, overrides={"store.uri": args.store})
    plans = plan_change(TableStore(open_object_store(settings.store.uri)), settings,
                        _instance_if_present(args.dagster_home))
    print(to_json(plans) if args.json else render(plans))
    return EXIT_OK


def _report(args: argparse.Namespace) -> int:
    from vidassets.curate.selection import load_recipe
    from vidassets.report import build_report
    from vidassets.resources import EvalVaultResource
    from vidassets.storage import TableStore, open_object_store

    settings = load_settings(args.config, overrides={"store.uri": args.store, "store.eval_vault_uri": args.eval_vault})
    vault = EvalVaultResource(root=settings.store.vault_uri()).tables()  # the operator's report, not a training step
    page = build_report(TableStore(open_object_store(settings.store.uri)), load_recipe(settings.selection.recipe),
                        _instance_if_present(args.dagster_home) if args.dagster_home else None, vault, settings.train)
    Path(args.output).write_text(page)
    print(f"wrote {args.output} ({len(page) // 1024} KiB)")
    return EXIT_OK


def _store_tables(args: argparse.Namespace):
    from vidassets.storage import TableStore, open_object_store

    settings = load_settings(getattr(args, "config", None), overrides={"store.uri": args.store})
    return settings, TableStore(open_object_store(settings.store.uri))


def _snapshot_create(args: argparse.Namespace) -> int:
    from vidassets.runner import local_instance, materialize_bucket

    settings = load_settings(args.config, overrides={"store.uri": args.store})
    summary = materialize_bucket(settings, local_instance(args.dagster_home), ["dataset_snapshot"], add_partitions=False)
    print(summary.render())
    return EXIT_OK if summary.ok else EXIT_FAILED


def _snapshot_retire(args: argparse.Namespace) -> int:
    from vidassets.train.collect import retire_snapshot

    _, tables = _store_tables(args)
    try:
        retire_snapshot(tables.objects, args.version, args.reason)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"snapshot v{args.version} retired")
    return EXIT_OK


def _snapshot_collect(args: argparse.Namespace) -> int:
    from vidassets.train.collect import collect_shards

    _, tables = _store_tables(args)
    print(json.dumps(collect_shards(tables.objects, args.lease_hours * 3600), indent=1))
    return EXIT_OK


def _snapshot_diff(args: argparse.Namespace) -> int:
    from vidassets.train.snapshot import diff_snapshots

    _, tables = _store_tables(args)
    try:
        diff = diff_snapshots(tables.objects, args.a, args.b)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.format == "json":
        print(diff.to_json(orient="records", indent=1))
        return EXIT_OK
    counts = diff.groupby(["change", "reason"]).size() if len(diff) else {}
    print(f"v{args.a} -> v{args.b}: {int((diff.change == 'added').sum())} added, "
          f"{int((diff.change == 'removed').sum())} removed")
    for (change, reason), n in dict(counts).items():
        print(f"  {change:<8} {reason:<22} {n}")
    for row in diff.itertuples():
        print(f"{row.change:<8} {row.clip_id}  {row.reason}" + (f"  ({row.detail})" if row.detail else ""))
    return EXIT_OK


def _export(args: argparse.Namespace) -> int:
    from vidassets.train import exports
    from vidassets.train.snapshot import read_snapshot, resolve_snapshot

    _, tables = _store_tables(args)
    try:
        version = resolve_snapshot(tables.objects, args.snapshot)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    to = Path(args.to)
    if args.export_command == "vjepa" and any(c.isspace() for c in str(to.absolute())):
        print(f"error: --to {args.to!r}: V-JEPA 2's reader splits lines on spaces; choose a path without whitespace",
              file=sys.stderr)
        return EXIT_USAGE
    samples = read_snapshot(tables.objects, version)
    if args.export_command == "vjepa":
        done = exports.export_vjepa(tables, samples, version, to)
    elif args.export_command == "diffsynth":
        done = exports.export_diffsynth(tables, samples, version, to, args.short_side)
    else:
        done = exports.export_nemo(tables, samples, version, to, args.model_type, args.resolution)
    print(json.dumps(done, indent=1))
    return EXIT_OK


def _models_check(args: argparse.Namespace) -> int:
    from vidassets.model_check import as_json, check_models, endpoints, render
    from vidassets.resources import Models

    settings = load_settings(args.config)
    checks = check_models(settings, Models(settings).registry)
    servers = endpoints(settings)
    print(json.dumps(as_json(checks, servers), indent=1) if args.json else render(checks, servers))
    return EXIT_OK if all(c.ok for c in checks) else EXIT_FAILED


def _egress_render(args: argparse.Namespace) -> int:
    import yaml

    from vidassets.egress import policies

    print(EGRESS_HEADER + yaml.safe_dump_all(policies(load_settings(args.config)), sort_keys=False), end="")
    return EXIT_OK


EGRESS_HEADER = """\
# Egress NetworkPolicies of the step pods, by role (rendered by `vidassets egress render [--config F]`
# from the settings: compute.object_store_cidr / object_store_ports and the configured model
# endpoints). Media pods (label vidassets.io/egress=object-store-only) reach the object store, the
# Dagster database and cluster DNS; annotator pods (object-store-and-model-endpoints: the steps that
# call a configured VLM, transcription or judge server) reach those endpoints too. No ingress.
# The official dagster chart renders no extra manifests, so apply it beside the release:
#   vidassets egress render --config vidassets.yaml | kubectl apply -n <namespace> -f -
"""


def _takedown(args: argparse.Namespace) -> int:
    from vidassets.ingest.near_duplicates import regroup_drops
    from vidassets.storage.rows import records
    from vidassets.train.snapshot import add_tombstone, taken_down_assets

    _, tables = _store_tables(args)
    for kind in ("asset_id", "source_shard", "source_tier", "license"):
        value = getattr(args, kind)
        if value:
            stone = add_tombstone(tables.objects, kind, value, args.reason)
            print(f"tombstoned {stone.kind}={stone.value} ({stone.reason}); the next snapshot excludes it")
    stale = regroup_drops(records(tables.read_all("video_fingerprints")), taken_down_assets(tables.objects, tables))
    for drop, uris in stale.items():
        print(f"{drop}: {len(uris)} near-duplicate cop{'y' if len(uris) == 1 else 'ies'} of footage taken down "
              f"({', '.join(uris[:3])}{', ...' if len(uris) > 3 else ''}) decide again: the best copy still up is "
              "promoted and analysed (takedown_sensor, or the next `vidassets materialize`)")
    for run in runs_meeting_takedowns(tables):
        print(f"run {run['run_id']} (snapshot v{run['snapshot']}) holds {run['samples']} sample(s) taken down, from step "
              f"{run['first_step']} on: its loader skips them (counted), no restart needed")
    return EXIT_OK


def runs_meeting_takedowns(tables) -> list[dict]:
    """The registered runs whose steps hold samples taken down now."""
    from vidassets.train.runs import read_runs, runs_meeting
    from vidassets.train.snapshot import taken_down_clips

    out = []
    for snapshot in sorted({r.snapshot for r in read_runs(tables.objects)}):
        down = taken_down_clips(tables.objects, tables, snapshot)
        if down:
            out += [r for r in runs_meeting(tables.objects, down) if r["snapshot"] == snapshot]
    return out


def _run_register(args: argparse.Namespace) -> int:
    from vidassets.train.runs import register_run

    _, tables = _store_tables(args)
    steps = None
    if args.steps:
        first, _, last = args.steps.partition(":")
        steps = (int(first), int(last or first))
    try:
        run = register_run(tables.objects, args.run_id, args.snapshot, args.plan, steps, args.note)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"registered run {run.run_id}: snapshot v{run.snapshot}, plan {run.plan}, steps {run.first_step}:{run.last_step}")
    return EXIT_OK


def _run_list(args: argparse.Namespace) -> int:
    from vidassets.train.runs import training_runs

    _, tables = _store_tables(args)
    frame = training_runs(tables.objects)
    print(frame.to_csv(index=False) if args.format == "csv" else frame.to_json(orient="records", indent=1), end="")
    return EXIT_OK


def _lineage_sample(args: argparse.Namespace) -> int:
    from vidassets.train.lineage import sample_lineage

    _, tables = _store_tables(args)
    try:
        print(json.dumps(sample_lineage(tables, args.clip_id), indent=1, default=str))
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def _lineage_steps(args: argparse.Namespace) -> int:
    from vidassets.train.build import build_plan
    from vidassets.train.snapshot import read_snapshot

    overrides = {"store.uri": args.store, "train.seed": args.seed, "train.world_size": args.world_size,
                 "train.global_batch": args.global_batch}
    settings = load_settings(args.config, overrides=overrides)
    objects = _store_tables(argparse.Namespace(config=args.config, store=args.store))[1].objects
    try:
        plan = build_plan(objects, args.snapshot, settings.train)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    first, _, last = args.steps.partition(":")
    steps = range(int(first), int(last) if last else int(first) + 1)
    samples = read_snapshot(objects, args.snapshot).set_index("clip_id")
    world = settings.train.world_size
    out = []
    for step in steps:
        sl = plan.step(step)
        for rank in range(world):
            for clip, level in zip(sl.clip_ids[rank::world], sl.caption_levels[rank::world], strict=True):
                s = samples.loc[clip]
                out.append({"step": step, "rank": rank, "phase": sl.phase, "bucket": sl.bucket, "clip_id": clip,
                            "stream": s.stream, "caption_level": level,
                            "source_uri": s.source_uri, "first_frame": int(s.first_frame),
                            "last_frame": int(s.last_frame), "license": s.license})
    print(json.dumps(out, indent=1))
    return EXIT_OK


def _golden_import(args: argparse.Namespace) -> int:
    import hashlib
    from datetime import UTC, datetime

    import pandas as pd

    from vidassets.storage import TableStore, open_object_store

    settings = load_settings(args.config, overrides={"store.uri": args.store, "store.eval_vault_uri": args.eval_vault})
    vault = TableStore(open_object_store(settings.store.vault_uri()))
    added = datetime.now(UTC).isoformat(timespec="seconds")
    rows = []
    for n, line in enumerate(Path(args.file).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            key = [item["asset_id"], int(item["first_frame"]), int(item["last_frame"])]
            if not isinstance(item["captions"], dict) or not item["captions"]:
                raise ValueError("captions must be an object of level -> text")
        except (KeyError, ValueError, TypeError) as exc:
            print(f"error: {args.file}:{n}: {exc.__class__.__name__}: {exc}", file=sys.stderr)
            return EXIT_USAGE
        rows.append({"golden_id": item.get("golden_id") or hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16],
                     "asset_id": key[0], "first_frame": key[1], "last_frame": key[2],
                     "captions": json.dumps(item["captions"], sort_keys=True), "added": added})
    known = vault.read_or_empty("golden_captions")
    new = pd.DataFrame(rows)
    merged = pd.concat([known[~known.golden_id.isin(set(new.golden_id))] if len(known) else known, new],
                       ignore_index=True)
    try:
        vault.write_groups("golden_captions", merged, None)
    except Exception as exc:  # noqa: BLE001 - a bad line is reported, nothing is written
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(json.dumps({"imported": len(new), "golden_clips": len(merged)}))
    return EXIT_OK


def _plan_inspect(args: argparse.Namespace) -> int:
    from vidassets.train.build import build_plan, snapshot_recipe
    from vidassets.train.monitor import inspect_plan, plot_report

    settings = load_settings(args.config, overrides={"store.uri": args.store, "train.seed": args.seed,
                                                     "train.global_batch": args.global_batch, "train.world_size": 1})
    objects = _store_tables(argparse.Namespace(config=args.config, store=args.store))[1].objects
    first, _, last = args.steps.partition(":")
    try:
        plan = build_plan(objects, args.snapshot, settings.train)
        report = inspect_plan(plan, int(first), int(last or int(first) + 1),
                              snapshot_recipe(objects, args.snapshot).curriculum.monitor)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.plot:
        plot_report(report, plan, args.plot)
        report["plot"] = str(Path(args.plot).absolute())
    print(json.dumps(report, indent=1, default=str))
    return EXIT_OK if report["passed"] else EXIT_FAILED


def _demo(args: argparse.Namespace) -> int:
    import shutil

    from vidassets.demo.bucket import build_demo_bucket
    from vidassets.runner import local_instance, materialize_bucket

    home = Path(args.home).absolute()
    if args.rebuild:
        for part in ("store", "eval_vault", "dagster_home"):
            shutil.rmtree(home / part, ignore_errors=True)
    print(f"building the demo bucket in {home / 'demo_bucket'} …")
    build_demo_bucket(home / "demo_bucket", home / "cache", force=args.rebuild)
    settings = load_settings(
        Path(__file__).parent / "demo" / "demo.yaml",
        env={},
        overrides={"bucket.uri": str(home / "demo_bucket"), "store.uri": str(home / "store"),
                   "store.eval_vault_uri": str(home / "eval_vault")},
    )
    summary = materialize_bucket(settings, local_instance(str(home / "dagster_home")), complete_only=True)
    print(summary.render())
    print(f"\ntables: vidassets table raw_inventory --store {home / 'store'}")
    print(f"UI:     VIDASSETS_CONFIG={Path(__file__).parent / 'demo' / 'demo.yaml'} DAGSTER_HOME={home / 'dagster_home'} "
          f"VIDASSETS_BUCKET={home / 'demo_bucket'} VIDASSETS_STORE={home / 'store'} dagster dev -m vidassets.definitions")
    return EXIT_OK if summary.ok else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
