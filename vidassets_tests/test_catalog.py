"""The asset catalog is the one place the graph is declared: every settings leaf expires exactly the
assets that consume it (and what reads them), inert settings expire nothing, nothing below the
stages imports upward and there are no import cycles, and everything that lists assets (Dagster,
plan-change, checks, runner, lineage, the docs' expiry table) agrees with the catalog."""

from __future__ import annotations

import ast
import json
import typing
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import BaseModel

from vidassets import catalog
from vidassets.config import Settings, parse_settings
from vidassets.versions import Versions, expiry_closure, settings_leaves

REPO = Path(__file__).resolve().parents[1]

# A base where every producer is in use (a VLM backend, so its settings matter), and the leaves that
# need a real file or directory to change (their versions digest the files).
BASE: dict[str, Any] = {"annotations": {"captions": "vlm", "vlm": {"endpoint": "http://127.0.0.1:9/v1", "model": "m"}}}
CONDITIONAL = {
    "models.compute_dtype": "reaches an asset only through the torch models it runs (video_analysis with a network "
                            "detector, clip_scores with an aesthetic head): test_compute_dtype_expires_only_assets_running_torch_models",
    "models.torch_threads": "reaches an asset only through the torch models it runs, as models.compute_dtype: "
                            "test_torch_threads_name_themselves_in_the_torch_models_versions",
    "scores.aesthetic_head": "read only when scores.quality_model is an aesthetic head (covered with it)",
    "scores.aesthetic_tower": "read only when scores.quality_model is an aesthetic head (covered with it)",
    "embeddings.video_frames": "read only when embeddings.model is vjepa2 (covered with it)",
    "text_embeddings.max_tokens": "read only when text_embeddings.model is t5_encoder (covered with it)",
    "text_embeddings.states_dtype": "read only when text_embeddings.model is t5_encoder (covered with it)",
    "audio_annotations.captions": "vlm needs annotations.vlm, which reaches annotations only when one of its kinds "
                                  "is vlm: test_audio runs the vlm captions and their versions",
}


def _files(tmp: Path) -> dict[str, Any]:
    weights = tmp / "weights.pth"
    weights.write_bytes(b"other weights")
    for name in ("vae", "encoder", "clip", "aesthetic_clip"):
        (tmp / name).mkdir(exist_ok=True)
        config = {"_class_name": "AutoencoderKLWan"} if name == "vae" else {"name": name}
        (tmp / name / "config.json").write_text(json.dumps(config))
    hashes = tmp / "hashes.txt"
    hashes.write_text("ab" * 32 + "\n")
    head = tmp / "head.pth"
    head.write_bytes(b"head")
    recipe = tmp / "recipe.yaml"
    recipe.write_text((REPO / "vidassets/curate/recipes/default.yaml").read_text()
                      .replace("min: 0.9}", "min: 0.8}").replace("level: level_1", "level: level_2"))
    return {"weights": str(weights), "vae": str(tmp / "vae"), "encoder": str(tmp / "encoder"),
            "clip": str(tmp / "clip"), "head": str(head), "aesthetic_clip": str(tmp / "aesthetic_clip"),
            "recipe": str(recipe), "hashes": str(hashes)}


def _set(data: dict, leaf: str, value: Any) -> None:
    node = data
    parts = leaf.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value


def _annotation(leaf: str) -> Any:
    model: Any = Settings
    for part in leaf.split("."):
        ann = model.model_fields[part].annotation
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        model = args[0] if args and isinstance(args[0], type) and issubclass(args[0], BaseModel) else ann
    return model


def _changes(leaf: str, value: Any, files: dict[str, Any]) -> dict[str, Any]:
    """Other valid values for one leaf (and any leaf it cannot change without)."""
    special = {
        "embeddings.weights": {leaf: files["weights"]},
        "embeddings.model": {leaf: "clip", "embeddings.weights": files["clip"]},
        "latents.vae_path": {leaf: files["vae"]},
        "latents.vae_class": {leaf: "AutoencoderKLWan", "latents.vae_path": files["vae"]},
        "safety.hash_lists": {leaf: [files["hashes"]]},
        "text_embeddings.model_path": {leaf: files["encoder"]},
        "selection.recipe": {leaf: files["recipe"]},
        "scores.quality_model": {leaf: "aesthetic_laion", "scores.aesthetic_head": files["head"],
                                 "scores.aesthetic_tower": files["aesthetic_clip"]},
        "text_embeddings.model": {leaf: "t5_encoder", "text_embeddings.model_path": files["encoder"]},
        "train.snapshot": {leaf: 3},
        "models.device": {leaf: "cpu"},
        "audio.rate": {leaf: 24000},
        "audio.music_codec": {leaf: "flac"},
        "train.global_batch": {leaf: 96},
        "train.world_size": {leaf: 4},
        "compute.assets": {leaf: {"clips": "gpu"}},
        "eval.fraction_by_tier": {leaf: {"licensed": 0.5}},
        "compute.profiles": {leaf: {"light": {"cpu": "1"}, "decode": {}, "gpu": {"gpus": 2}}},
        "audio.music_rate": {leaf: 48000} if value != 48000 else {leaf: 24000},
        "audio_annotations.transcription": {leaf: {"endpoint": "http://asr:8000/v1", "model": "whisper"}},
        "audio_annotations.caption_tiers": {leaf: ["T0"]},
        "execution.ray.address": {leaf: "auto"},
        "caption_qc.judge": {leaf: {"endpoint": "http://judge:8000/v1", "model": "llava-judge"}},
        "audio_annotations.tagger": {leaf: {"model_dir": files["encoder"]}},
        "audio_annotations.whisper": {leaf: {"model_dir": files["encoder"]}},
    }
    if leaf in special:
        return special[leaf]
    annotation = _annotation(leaf)
    choices = typing.get_args(annotation) if typing.get_origin(annotation) is typing.Literal else ()
    if choices:
        others = [c for c in choices if c != value]
        return {leaf: others[0]} if others else {}  # a one-choice field cannot change
    if isinstance(value, bool):
        return {leaf: not value}
    if isinstance(value, int):
        return {leaf: value + 1 if "max" in leaf or "min" not in leaf else value + 1}
    if isinstance(value, float):
        return {leaf: round(value * 0.9 if value > 0.05 else value + 0.01, 6)}
    if isinstance(value, str):
        return {leaf: value + "-other"}
    if isinstance(value, tuple):
        if value and isinstance(value[0], int):
            return {leaf: (*value, max(value) * 2 + 1) if leaf != "latents.frame_buckets" else (*value, 9)}
        return {leaf: (*value[:-1],) or ("x",)} if len(value) > 1 else {leaf: (*value, ".other")}
    if isinstance(value, list) and value:
        return {leaf: value[:-1]}
    if isinstance(value, dict):
        return {leaf: {**{k: (v.model_dump() if isinstance(v, BaseModel) else v) for k, v in value.items()},
                       "extra": 1.0 if leaf.startswith("train.") else {"cpu": "1"}}}
    if value is None:
        return {leaf: {"store.eval_vault_uri": "/tmp/other-vault",
                       "store.near_duplicate_index": "sqlite:////tmp/other-index.sqlite", "ladder.high_fps": 60.0, "latents.fps": 8.0,
                       "annotations.vlm.api_key_env": "VLM_KEY"}.get(leaf, 1)}
    raise AssertionError(f"no way to change {leaf}={value!r}; add it to _changes")


def test_every_settings_leaf_expires_exactly_its_declared_consumers(tmp_path: Path) -> None:
    files = _files(tmp_path)
    base = parse_settings(BASE)
    before = Versions(base).code_versions()
    checked = 0
    for leaf, value in settings_leaves(base).items():
        if leaf in CONDITIONAL:
            continue
        data = base.model_dump(mode="json")
        change = _changes(leaf, value, files)
        if not change:
            continue
        for key, new in change.items():
            _set(data, key, new)
        changed_settings = parse_settings(data)
        after = Versions(changed_settings).code_versions()
        moved = {name for name in catalog.NAMES if after[name] != before[name]}
        assert moved == expiry_closure(Versions(base), list(change)), (leaf, change)
        checked += 1
    assert checked > 100  # every leaf, not a sample


def test_inert_settings_are_real_leaves() -> None:
    leaves = settings_leaves(parse_settings(BASE))
    for key in catalog.INERT_SETTINGS:
        assert any(leaf == key or leaf.startswith(key + ".") for leaf in leaves), key
    for entry in catalog.ASSETS:
        for key in entry.settings:
            assert any(leaf == key or leaf.startswith(key + ".") for leaf in leaves), (entry.name, key)


def _modules() -> dict[str, Path]:
    out = {}
    for path in (REPO / "vidassets").rglob("*.py"):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Every vidassets module each module imports, at any depth (lazy imports included)."""
    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vidassets"):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    deps.add(sub if sub in modules else node.module)
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("vidassets")}
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def test_no_import_cycles_and_lower_layers_import_nothing_above_them() -> None:
    modules = _modules()
    graph = _imports(modules)
    # cycles: depth-first search with colours
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(dep):] + [dep]))
            if dep not in state:
                visit(dep)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert graph["vidassets.config"] == set(), "config.py is settings only"
    allowed = {"storage": {"storage", "config"}, "models": {"models", "config"},
               "runtime": {"runtime", "storage", "config", "models"},
               "media": {"media", "runtime", "storage", "config", "models"}}
    for name, deps in graph.items():
        layer = name.split(".")[1] if name.count(".") >= 1 else ""
        if layer in allowed:
            above = {d for d in deps if d.split(".")[1] not in allowed[layer]}
            assert not above, f"{name} imports {above}"
    dagster_free = [n for n in modules if n.split(".")[1:2] and n.split(".")[1] in ("runtime", "media", "models", "storage", "curate", "derive")]
    for name in dagster_free:
        tree = ast.parse(modules[name].read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not any(m.split(".")[0] == "dagster" for m in names), name


def test_dagster_plan_change_checks_runner_and_lineage_follow_the_catalog(tmp_path: Path) -> None:
    from vidassets.change_plan import plan_change
    from vidassets.graph import build_definitions
    from vidassets.runner import ON_REQUEST
    from vidassets.storage import TableStore, open_object_store

    settings = parse_settings({"store": {"uri": str(tmp_path / "s")}, "bucket": {"uri": str(tmp_path / "b")}})
    defs = build_definitions(settings)
    graph = defs.resolve_asset_graph()
    versions = Versions(settings)
    for entry in catalog.ASSETS:
        node = graph.get(_key(entry.name))
        assert {k.to_user_string() for k in node.parent_keys} == set(entry.deps), entry.name
        assert node.code_version == versions.full(entry.name)
        assert (node.partitions_def is not None) == entry.partitioned
    plans = plan_change(TableStore(open_object_store(settings.store.uri)), settings)
    assert [p.asset for p in plans] == list(catalog.NAMES)  # ladder, audio, snapshot, shards included
    assert ON_REQUEST == {"caption_qc", "dataset_snapshot", "training_shards", "train_plan"}
    schema_checks = {k.asset_key.to_user_string() for c in defs.asset_checks for k in c.check_keys if k.name == "schema"}
    assert schema_checks == {a.name for a in catalog.ASSETS if a.tables}


def _key(name: str):
    from dagster import AssetKey

    return AssetKey(name)


def test_the_docs_expiry_table_is_the_catalogs() -> None:
    """docs/concepts.md asks for the table; the site's build fills it in from the catalog."""
    import sys

    sys.path.insert(0, str(REPO / "docs"))
    import gen

    from vidassets.versions import expiry_table

    assert "<!-- generated: expiry-table -->" in (REPO / "docs" / "concepts.md").read_text()
    assert gen.fill("<!-- generated: expiry-table -->") == expiry_table()


@pytest.mark.parametrize("asset", ["clip_scores", "clip_embeddings", "latents", "annotations"])
def test_gpu_profile_comes_from_the_catalog(asset: str) -> None:
    settings = parse_settings({})
    tags = settings.compute.op_tags(asset, catalog.entry(asset).profile)
    limits = tags["dagster-k8s/config"]["container_config"]["resources"]["limits"]
    assert limits.get("nvidia.com/gpu") == "1"


def test_inert_settings_leave_outputs_bit_identical(demo_bucket: Path) -> None:
    """The parallelism, batching and resource-limit keys declared inert change no output."""
    from vidassets.config import AnalysisSettings, ProbeSettings
    from vidassets.media.analysis import analyze_source
    from vidassets.media.probe import probe_source
    from vidassets.models.registry import ModelRegistry
    from vidassets.runtime import tasks
    from vidassets.runtime.sandbox import Sandbox

    spec = {"path": str(demo_bucket / "raw/licensed/drop-0001/bikes.mp4"), "offset": None, "size": None}
    facts = probe_source(spec, ProbeSettings().model_dump())
    runs = []
    for threads, batch in ((1, 1), (2, 16), (2, 7)):
        params = AnalysisSettings(decode_threads=threads, batch_frames=batch).model_dump()
        out = analyze_source(spec, {**params, "safe_mode": False}, facts)
        runs.append((np.asarray(out["frame_pts"]).tobytes(), json.dumps(out["cuts"]), json.dumps(out["shots"]),
                     [bytes(c["jpeg"]) for c in out["context"]], [c["pdq"] for c in out["context"]],
                     np.asarray(out["signals"]).tobytes()))
    assert runs[0] == runs[1] == runs[2]

    probes = []
    for memory, wall in ((2048, 30.0), (4096, 120.0)):
        limits = ProbeSettings(memory_mb=memory, wall_base_seconds=wall).model_dump()
        with Sandbox(memory) as sandbox:
            probes.append(tasks.probe(sandbox, spec, limits, Path(spec["path"]).stat().st_size))
    assert probes[0] == probes[1]

    # the text encoder's batch size is NOT inert (padding moves the last bits), so it is versioned
    sentences = ["cyclists ride past a fence", "a rabbit in a meadow at dawn", "short", "a phone call in a car"]
    vectors = [ModelRegistry("cpu").get("sentence-transformer", None, batch)(sentences) for batch in (1, 64)]
    assert vectors[0].tobytes() != vectors[1].tobytes() and np.allclose(vectors[0], vectors[1], atol=1e-5)

    # ONNX Runtime's intra-op threads (models.onnx_threads) leave every model output identical
    from vidassets.demo.bucket import decode_rgb

    frames = list(decode_rgb(Path(spec["path"]), limit=60))[::20]
    outputs = []
    for threads in (1, 2):
        registry = ModelRegistry("cpu", onnx_threads=threads)
        outputs.append([registry.get(k, *a)(frames) for k, a in (("ppocrv4-det", (256, 0.5)), ("open_nsfw", ()),
                                                                 ("nudenet-faces", (0.5,)))])
    assert outputs[0] == outputs[1]
    assert not any(k.startswith("text_embeddings") for k in catalog.INERT_SETTINGS)
