"""Versions of every producer, and of what each row read.

Each producer's version constant sits beside its code (``media/analysis.py: VERSION``, …). Here
they are combined with digests of the settings the producer consumes (its catalog entry's
``settings``) and with model versions into the producer's *own* version. An asset's *full* version
adds the full versions of the assets its rows read (catalog ``reads``), so it changes whenever
anything its rows are computed from changes: it is the Dagster ``code_version``. Rows carry the own
version (``producer_version``) and a digest of what they read (``input_version``); a row is reused
only when both match.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from vidassets import catalog
from vidassets.config import ConfigError, Settings
from vidassets.ingest.hash_lists import lists_version
from vidassets.models import package_version
from vidassets.storage.objects import read_uri
from vidassets.storage.rows import RowVersion

__all__ = ["RowVersion", "Versions", "digest", "settings_leaves"]


def digest(obj: Any) -> str:
    return hashlib.sha256(repr(obj).encode()).hexdigest()[:12]


def consumed(settings: Settings, name: str) -> dict[str, Any]:
    """The values of every settings leaf the asset consumes (inert keys left out)."""
    entry = catalog.entry(name)
    return {leaf: value for leaf, value in settings_leaves(settings).items() if catalog.consumes(entry, leaf)}


def settings_leaves(settings: Settings) -> dict[str, Any]:
    """Every leaf of the settings tree by dotted path (mappings and lists are leaves)."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, BaseModel):
            for key in type(value).model_fields:
                walk(f"{prefix}.{key}" if prefix else key, getattr(value, key))
        else:
            out[prefix] = value

    walk("", settings)
    return out


def _av() -> str:
    return f"av{package_version('av')}"


class Versions:
    """Own and full versions of every asset (and of each score / annotation kind) for one settings."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self._own: dict[str, str] = {}
        self._full: dict[str, str] = {}

    # ------------------------------------------------------------------ own versions per producer

    def params(self, name: str) -> str:
        """Digest of the settings ``name`` consumes; ``models.*`` reach a version only through the
        versions of the models an asset actually runs (a dtype change leaves a PySceneDetect pass as it is)."""
        return digest(sorted((k, v) for k, v in consumed(self.settings, name).items() if not k.startswith("models.")))

    @functools.cached_property
    def scores(self) -> dict[str, str]:
        """One own version per score, so a change to one formula or model re-runs that score only."""
        from vidassets.curate.formulas import VERSIONS
        from vidassets.curate.scores import MODEL_VERSIONS, model_kinds

        sc = self.settings.scores
        kinds = model_kinds(sc)
        models = {name: self.model(*kind, field=("scores.aesthetic_head" if kind[0] == "aesthetic" else None))
                  for name, kind in kinds.items()}
        quality_formula = (f"{MODEL_VERSIONS['quality']}+map{sc.quality_best:g}-{sc.quality_worst:g}"
                           if sc.quality_model == "brisque" else MODEL_VERSIONS["aesthetic"])
        return {
            "optical": VERSIONS["optical"],
            "motion": f"{VERSIONS['motion']}+cut{sc.motion_cut_threshold:g}x{sc.motion_cut_ratio:g}",
            "static": f"{VERSIONS['static']}+still{sc.still_motion:g}+jump{sc.jump_motion:g}",
            "bitrate": VERSIONS["bitrate"],
            "text": f"{MODEL_VERSIONS['text']}+{models['text']}+frames{sc.model_frames}",
            "quality": f"{quality_formula}+{models['quality']}+frames{sc.model_frames}",
            "nsfw": f"{MODEL_VERSIONS['nsfw']}+{models['nsfw']}+kill{sc.nsfw_kill_threshold:g}",
            "faces": f"{MODEL_VERSIONS['faces']}+{models['faces']}+frames{sc.model_frames}",
        }

    def model(self, kind: str, *args: Any, field: str | None = None) -> str:
        """A model's version from the registry (weights digest, compute dtype), computed without
        loading it; missing weights are a ConfigError naming ``field``."""
        from vidassets.models.registry import model_version

        try:
            return model_version(kind, *args, dtype=self.settings.models.compute_dtype,
                                 threads=self.settings.models.torch_threads)
        except FileNotFoundError as exc:
            raise ConfigError(f"{field or kind}: {exc}") from None
        except ValueError as exc:  # a layout the kind refuses: its message names the field
            raise ConfigError(str(exc)) from None

    @functools.cached_property
    def annotation_kinds(self) -> dict[str, str]:
        from vidassets.derive.annotations import kind_versions

        return kind_versions(self.settings.annotations)

    @functools.cached_property
    def audio_annotation_kinds(self) -> dict[str, str]:
        from vidassets.derive.audio_annotations import kind_versions, tagger_model, whisper_model
        from vidassets.models import package_version

        a = self.settings.audio_annotations
        captions = self.recipe.captions
        video_caption = f"{captions.version or self.annotation_kinds['captions']}:{captions.level}"
        tagger, whisper = tagger_model(a), whisper_model(a)
        return kind_versions(a, self.settings.annotations.vlm, self.model("silero-vad", a.vad_threshold),
                             video_caption, package_version("pyloudnorm"),
                             self.model(*tagger, field="audio_annotations.tagger.model_dir") if tagger else None,
                             self.model(*whisper, field="audio_annotations.whisper.model_dir") if whisper else None)

    def audio_annotation_row(self, audio: dict, kind: str) -> RowVersion:
        """A row reads the clip's audio window (and, for ``av_caption``, the video caption its own
        version names): not the versions of the other annotation kinds."""
        window = (audio["asset_id"], int(audio["first_pts"]), int(audio["last_pts"])) if "first_pts" in audio else \
            audio["clip_id"]
        return RowVersion(self.audio_annotation_kinds[kind], digest((window, self.inputs("clip_audio"))))

    @functools.cached_property
    def embedder(self) -> str:
        from vidassets.curate.embeddings import VERSION, embedder_kind

        e = self.settings.embeddings
        return f"{VERSION}+{self.model(*embedder_kind(e.model, e.weights, e.video_frames), field='embeddings.weights')}"

    @functools.cached_property
    def recipe(self):
        from vidassets.curate.selection import load_recipe

        return load_recipe(self.settings.selection.recipe)

    @functools.cache  # noqa: B019 - one Versions per settings
    def hash_lists(self) -> list:
        """The configured safety hash lists, read once (a ConfigError naming ``safety.hash_lists``)."""
        from vidassets.ingest.hash_lists import load

        try:
            return load(self.settings.safety.hash_lists, read_uri)
        except (FileNotFoundError, ValueError) as exc:
            raise ConfigError(str(exc) if "safety.hash_lists" in str(exc) else f"safety.hash_lists: {exc}") from None

    def own(self, name: str) -> str:
        if name not in self._own:
            self._own[name] = self._compute_own(name)
        return self._own[name]

    # producers whose own version is their code's VERSION (+ the PyAV build where they decode) + a
    # digest of the settings the catalog says they consume
    _PLAIN = {
        "raw_inventory": ("vidassets.ingest.inventory", False), "video_probe": ("vidassets.media.probe", True),
        "frame_index": ("vidassets.media.packet_index", True), "clips": ("vidassets.media.clips", False),
        "dedup_groups": ("vidassets.curate.dedup", False),
        "decontamination": ("vidassets.curate.decontamination", False),
        "clip_ladder": ("vidassets.media.ladder", True), "clip_audio": ("vidassets.media.audio", True),
        "training_shards": ("vidassets.train.shards", False), "train_plan": ("vidassets.train.plan", False),
        "caption_qc": ("vidassets.derive.caption_judge", False),
    }

    def _compute_own(self, name: str) -> str:
        s = self.settings
        if name in self._PLAIN:
            module, decodes = self._PLAIN[name]
            consumed_any = any(catalog.consumes(catalog.entry(name), k) for k in settings_leaves(s))
            parts = [importlib.import_module(module).VERSION, _av() if decodes else "",
                     self.params(name) if consumed_any else ""]
            return "+".join(x for x in parts if x)
        if name == "video_fingerprint":  # the hash lists' contents decide too (a list update re-checks)
            from vidassets.ingest.near_dup_index import PLAN
            from vidassets.ingest.near_duplicates import VERSION
            lists = self.hash_lists()  # (the index's plan decides which pairs are found)
            return "+".join(x for x in (VERSION, PLAN, self.params(name), lists_version(lists, s.safety.max_hamming)) if x)
        if name == "eval_split":
            from vidassets.ingest.eval_split import VERSION
            tiers = f"+tiers{digest(sorted(s.eval.fraction_by_tier.items()))}" if s.eval.fraction_by_tier else ""
            return f"{VERSION}+f{s.eval.fraction:g}{tiers}+salt{digest(s.eval.salt)}"
        if name == "video_analysis":
            from vidassets.media.analysis import MODEL_DETECTORS, VERSION
            network = f"+{self.model('transnetv2')}" if s.analysis.detector in MODEL_DETECTORS else ""
            return (f"{VERSION}+{_av()}+scenedetect{package_version('scenedetect')}"
                    f"+pdq{package_version('pdqhash')}{network}+{self.params(name)}")
        if name == "eval_features":
            from vidassets.curate.decontamination import EVAL_FEATURES_VERSION
            return (f"{EVAL_FEATURES_VERSION}+{self.own('video_probe')}+{self.own('video_analysis')}+{self.embedder}"
                    f"+seg{s.decontamination.eval_segment_s:g}")
        if name == "clip_scores":
            from vidassets.curate.scores import cascade_gates, gates_digest
            gates = cascade_gates(s.scores, self.recipe.score_rules)
            return f"clip-scores+{digest(sorted(self.scores.items()))}+cascade-{gates_digest(gates)}"
        if name == "clip_embeddings":
            return self.embedder
        if name == "clip_clusters":  # centroids mean something only in the space of one embedder
            from vidassets.curate.clusters import VERSION
            return f"{VERSION}+{self.embedder}+{self.params(name)}"
        if name == "selection":
            from vidassets.curate.selection import VERSION
            firewall = "" if self.settings.near_duplicates.firewall_generated else "+no-generated-firewall"
            return f"{VERSION}+recipe-{self.recipe.digest}{firewall}"
        if name == "annotations":
            return f"annotations+{digest(sorted(self.annotation_kinds.items()))}"
        if name == "audio_annotations":
            tiers = self.settings.audio_annotations.caption_tiers  # which clips get captions at all
            return f"audio_annotations+{digest((sorted(self.audio_annotation_kinds.items()), tiers))}"
        if name == "latents":  # its rows: one resolution each (latent_producer)
            if len(s.latents.resolutions) == 1:
                return self.latent_producer(s.latents.resolutions[0])
            return f"{self._latents_code}+{self.params(name)}"
        if name == "text_embeddings":
            from vidassets.derive.text_embeddings import VERSION, encoder_model

            kind, args = encoder_model(s.text_embeddings)
            encoder = self.model(kind, *args, field="text_embeddings.model_path")
            captions = self.recipe.captions  # which captions it encodes: the recipe's level and caption variants
            levels = "+".join(self.recipe.curriculum.caption_levels(captions.level))
            return f"{VERSION}+{encoder}+captions-{captions.version or 'current'}-{levels}"
        if name == "dataset_snapshot":
            from vidassets.curate.curriculum import Curriculum
            from vidassets.train.snapshot import VERSION
            captions, curriculum = self.recipe.captions, self.recipe.curriculum
            # the curriculum names each sample's stream and cluster group, and is frozen with the snapshot
            streams = f"+curriculum-{digest(curriculum.model_dump())}" if curriculum != Curriculum() else ""
            return f"{VERSION}+captions-{captions.version or 'current'}-{captions.level}{streams}"
        raise KeyError(f"no version rule for {name!r}")

    # ------------------------------------------------------------------ inputs and full versions

    def reads(self, name: str) -> tuple[str, ...]:
        """The assets whose outputs the rows of ``name`` are computed from, for these settings."""
        reads = catalog.entry(name).reads
        if name == "latents" and self.settings.latents.read_from == "raw":
            reads = tuple(r for r in reads if r != "clip_ladder")  # frames come from the source file
        return reads

    def inputs(self, *names: str) -> str:
        """Digest of the output versions of ``names`` (an ``input_version``)."""
        return digest(tuple(self.output(n) for n in sorted(names))) if names else ""

    def full(self, name: str) -> str:
        """The asset's own version and the versions of everything its rows read: its code_version."""
        if name not in self._full:
            reads = self.reads(name)
            self._full[name] = self.own(name) + (f"+in-{self.inputs(*reads)}" if reads else "")
        return self._full[name]

    def output(self, name: str) -> str:
        """The version readers of ``name`` depend on: its full version, computed as if its gate
        settings (verdicts only, see ``catalog.AssetEntry.gates``) were at their defaults."""
        entry = catalog.entry(name)
        if not entry.gates:
            return self.full(name)
        data = self.settings.model_dump()
        defaults = Settings().model_dump()
        for gate in entry.gates:
            node, base = data, defaults
            *parents, last = gate.split(".")
            for part in parents:
                node, base = node[part], base[part]
            node[last] = base[last]
        return Versions(Settings.model_validate(data)).full(name)

    def row(self, name: str) -> RowVersion:
        return RowVersion(self.own(name), self.inputs(*self.reads(name)))

    def fingerprint_row(self, whole_grid: bool = False) -> RowVersion:
        """A fingerprint row is a function of the bytes and the sampling only: the matching settings
        (the asset's gates) re-decide near-duplicates without taking fingerprints again. A row taken
        on the whole grid (``whole_grid``: retaken for an undecided pair, or no decode budget) has
        the version of the unbudgeted sampling."""
        from vidassets.media.fingerprint import VERSION
        n = self.settings.near_duplicates
        budget = f"+decode{n.max_decode_share:g}" if n.max_decode_share is not None and not whole_grid else ""
        own = f"{VERSION}+{_av()}+grid{n.grid_fps:g}{budget}" + ("+chromaprint" if n.audio else "")
        return RowVersion(own, self.inputs(*self.reads("video_fingerprint")))

    @functools.cached_property
    def _latents_code(self) -> str:
        from vidassets.derive.latents import VERSION, vae_model
        from vidassets.models.vae import read_layout

        s = self.settings
        vae = self.model(*vae_model(s.latents), field="latents.vae_path")
        try:  # the buckets must be frame counts this VAE encodes (LTX-Video: 8k+1)
            read_layout(s.latents.vae_class, s.latents.vae_path).check_frame_buckets(s.latents.frame_buckets)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        return f"{VERSION}+{vae}"

    @functools.cache  # noqa: B019 - one Versions per settings; called per clip and row
    def latent_producer(self, resolution: int) -> str:
        """The producer version of latents rows at ``resolution``: the settings digest holds that one
        short side (as ``latents.base_resolution``, the one-resolution setting it replaced, so rows
        written before ``resolutions`` existed stay current), never the list: adding a resolution
        leaves the rows of the others current."""
        leaves = [(k, v) for k, v in consumed(self.settings, "latents").items()
                  if not k.startswith("models.") and k != "latents.resolutions"]
        return f"{self._latents_code}+{digest(sorted([*leaves, ('latents.base_resolution', resolution)]))}"

    def latent_producers(self) -> dict[str, int]:
        """Producer version -> resolution, of every configured resolution's rows."""
        return {self.latent_producer(r): r for r in self.settings.latents.resolutions}

    def latent_rows(self, clip: dict) -> dict[int, RowVersion]:
        """Resolution -> the version of the clip's latents row at it (the clip's window read)."""
        window = self.window_row("latents", clip)
        return {r: RowVersion(self.latent_producer(r), window.inputs) for r in self.settings.latents.resolutions}

    def window_row(self, name: str, clip: dict) -> RowVersion:
        """A row that reads one clip's frames (catalog ``window``): what it read is the clip's
        window in the source's own timestamps, plus the versions of its other inputs."""
        window = (clip["asset_id"], int(clip["first_pts"]), int(clip["last_pts"]))
        return RowVersion(self.own(name), digest((window, self.inputs(*self.reads(name)))))

    # per-score and per-kind rows read only part of what the asset reads
    SCORE_READS: Mapping[str, tuple[str, ...]] = {
        "optical": ("clips",), "motion": ("clips",), "static": ("clips",),
        "bitrate": ("clips", "frame_index", "video_probe"),
        "text": ("clips",), "quality": ("clips",), "nsfw": ("clips",), "faces": ("clips",),
    }
    """Signals and context frames come from video_analysis, which clips' version includes."""

    def score_rows(self) -> dict[str, RowVersion]:
        return {name: RowVersion(v, self.inputs(*self.SCORE_READS[name])) for name, v in self.scores.items()}

    # the scores the rule-based captioner and tagger put into words
    RULE_BASED_SCORES = ("faces", "motion", "quality", "static", "text")

    def annotation_rows(self) -> dict[str, RowVersion]:
        """Every kind reads the clip's frames and its video's upright size (the probe's facts); captions
        (and rule-based tags) also read the camera record (their own version names it) and, when
        rule-based, the scores they put into words."""
        a = self.settings.annotations
        rows = {}
        for kind, version in self.annotation_kinds.items():
            inputs = self.inputs("clips", "video_probe")
            if kind != "camera" and getattr(a, kind) == "rule_based":
                scores = self.score_rows()
                inputs = digest((inputs, [scores[s] for s in self.RULE_BASED_SCORES]))
            rows[kind] = RowVersion(version, inputs)
        return rows

    def code_versions(self) -> dict[str, str]:
        return {name: self.full(name) for name in catalog.NAMES}


def expiry_closure(versions: Versions, leaves: list[str]) -> set[str]:
    """The assets whose code version changes with ``leaves``: their consumers and, transitively,
    the assets reading those (not through a consumer for which the leaves are only gates)."""
    direct = {a.name for a in catalog.ASSETS if any(catalog.consumes(a, k) for k in leaves)}
    spreading = {n for n in direct if not all(catalog.gates(catalog.entry(n), k) for k in leaves)}
    found = set(direct)
    grew = True
    while grew:
        grew = False
        for a in catalog.ASSETS:
            if a.name not in found and set(versions.reads(a.name)) & spreading:
                found.add(a.name)
                spreading.add(a.name)
                grew = True
    return found


def expiry_table(settings: Settings | None = None) -> str:
    """The expiry table (docs/concepts.md), from the catalog: for each settings key, the assets whose code
    version it changes (its consumers and everything that reads them). Rows are the settings
    sections (split where keys of one section reach different assets); inert keys come last."""
    settings = settings or Settings()
    versions = Versions(settings)
    closure: dict[str, tuple[str, ...]] = {}
    inert: list[str] = []
    for leaf in settings_leaves(settings):
        found = expiry_closure(versions, [leaf])
        if not found:
            inert.append(leaf)
            continue
        closure[leaf] = tuple(n for n in catalog.NAMES if n in found)
    rows: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for leaf, assets in closure.items():
        rows.setdefault((leaf.split(".")[0], assets), []).append(leaf)
    lines = ["| settings changed | code version changes (stale in Dagster; rows re-run only where their inputs changed) |",
             "|---|---|"]
    for (section, assets), leaves in rows.items():
        whole = len([k for k in closure if k.split(".")[0] == section]) == len(leaves)
        label = f"`{section}.*`" if whole and len(leaves) > 1 else ", ".join(f"`{k}`" for k in leaves)
        lines.append(f"| {label} | {', '.join(assets)} |")
    sections = sorted({k.split(".")[0] for k in inert if all(x.split(".")[0] != k.split(".")[0] for x in closure)})
    partial = [k for k in inert if k.split(".")[0] not in sections]
    lines.append(f"| {', '.join(f'`{s}.*`' for s in sections)}, {', '.join(f'`{k}`' for k in partial)} | "
                 "nothing (where data lives, how steps run, resource limits, batch sizes, check thresholds) |")
    return "\n".join(lines)
