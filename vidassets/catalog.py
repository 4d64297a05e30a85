"""The asset catalog: every asset of the graph declared once.

Each entry says where the asset sits (group, partitioned / global / on request, what it depends on),
which tables it writes, which upstream assets' *outputs* its rows are computed from (``reads``: their
versions are the input versions of its rows), which settings it consumes, its compute profile and
the metadata key that counts the rows a step computed. The Dagster graph (deps, code versions,
op_tags), plan-change, the schema checks, the runner's phases and lineage are all derived from it.

``deps`` is ordering (what must be materialized first); ``reads`` is data (what a row is a function
of). They differ where an asset only reads *which* items to work on from an upstream (``selection``
chooses the clips annotations are computed for, but an annotation does not change when the
selection does).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Kind = Literal["partitioned", "global", "on_request"]


@dataclass(frozen=True)
class AssetEntry:
    name: str
    group: str
    kind: Kind
    description: str
    tables: tuple[str, ...] = ()
    """Catalog tables it writes under the store root."""
    vault_tables: tuple[str, ...] = ()
    """Tables it keeps in the eval vault (only vault assets have any)."""
    deps: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()
    settings: tuple[str, ...] = ()
    """Settings it consumes (dotted prefixes of the settings tree): a change to any of them changes
    its version (keys in ``INERT_SETTINGS`` excepted)."""
    gates: tuple[str, ...] = ()
    """Settings among ``settings`` that only decide which items pass (a verdict such as a
    quarantine), never the values readers take from a row: they change this asset's version but not
    the input version of the rows that read it."""
    window: bool = False
    """Its rows read a clip's frames from the source (or a rung): the clip's window (asset_id,
    first_pts, last_pts: container timestamps of those bytes) is part of each row's input version
    instead of the version of ``clips``, so a new analysis that leaves a window unchanged leaves
    the rows of that window current."""
    profile: str = "light"
    """Compute profile of its step pod (``compute.profiles``; ``compute.assets`` may override it)."""
    vault: bool = False
    """It is given the eval vault (its resource, and its credentials on Kubernetes); no other asset is."""
    rows_computed: str = "rows_computed"
    """Materialization metadata key counting the rows a step computed."""

    @property
    def partitioned(self) -> bool:
        return self.kind == "partitioned"


TORCH = ("models.compute_dtype", "models.torch_threads")
"""The settings of the torch models an asset runs: the compute dtype and the intra-op thread count
both move the last bits of their outputs, so both are in those models' versions (``models.registry``)."""

ASSETS: tuple[AssetEntry, ...] = (
    AssetEntry("raw_inventory", "ingest", "partitioned",
               "One row per video file and tar member of a drop: uri, size, sha256 asset_id, provenance from the "
               "drop's sidecar, and duplicate_of for exact copies seen first elsewhere.",
               tables=("raw_inventory",), settings=("ingest",)),
    AssetEntry("eval_split", "ingest", "partitioned",
               "Salted-hash carve-out of eval assets into the eval vault (a separate root); this table holds the "
               "train side only, which is all any later stage reads.",
               tables=("eval_split",), vault_tables=("eval_assets",), deps=("raw_inventory",), settings=("eval",),
               vault=True),
    AssetEntry("video_probe", "media", "partitioned",
               "Validated media facts per train-side video (codec, size, rotation, fps, VFR, counted frames, audio) "
               "and a verdict: ok / salvaged / quarantined with a reason. Sandboxed, one retry in safe mode; "
               "transient failures are retried by later runs.",
               tables=("video_probe",), deps=("eval_split",), settings=("probe",), gates=("probe",),
               profile="decode"),
    AssetEntry("frame_index", "media", "partitioned",
               "Per-video packet index (pts, dts, duration, byte position, size, keyframe, frame type, reference "
               "flag) as a Parquet blob, plus the encode profile. Demux only, no decode.",
               tables=("frame_index",), deps=("video_probe",), reads=("video_probe",)),
    AssetEntry("video_fingerprint", "media", "partitioned",
               "A cheap per-video fingerprint taken before the analysis pass (PDQ hashes of keyframes and of the "
               "reference frames nearest a time grid within a decode budget, planned from the packet index; "
               "Chromaprint of the audio; the whole grid retaken for pairs the budget cannot decide) and "
               "the near-duplicate decision against every drop: near_duplicate_of the group's canonical copy (never "
               "a copy another copy holds, then rights first: tier, then quality), or contains (a compilation holding another video, with the span); real videos "
               "matching model-generated (synthetic) ones are kept out of training; videos matching a configured PDQ "
               "hash list of known abusive material (and their copies) are blocked and reported (safety_reports).",
               tables=("video_fingerprints", "safety_reports"), deps=("frame_index",),
               reads=("video_probe", "frame_index"),
               settings=("near_duplicates", "ingest.tier_priority", "safety"),
               gates=("near_duplicates.enabled", "near_duplicates.max_hamming", "near_duplicates.min_share",
                      "near_duplicates.min_share_longer", "near_duplicates.max_speed_change",
                      "near_duplicates.firewall_generated", "near_duplicates.retake_undecided",
                      "near_duplicates.canonical", "ingest.tier_priority", "safety.hash_lists", "safety.max_hamming"),
               profile="decode"),
    AssetEntry("video_analysis", "media", "partitioned",
               "The one decode pass per video: shot boundaries (frame indices), per-frame luma/motion/scene-change "
               "signals, and context frames at a fixed rate with PDQ hashes (table context_frames). Near-duplicate "
               "copies are not analysed (their earlier rows are parked, reused if they become canonical).",
               tables=("video_analysis", "context_frames"), deps=("video_probe", "video_fingerprint"),
               reads=("video_probe",), settings=("analysis", *TORCH),
               profile="decode"),
    AssetEntry("clips", "media", "partitioned",
               "Shots cut into training windows (default 2-20 s): clip_id, asset_id, first/last frame (inclusive, "
               "presentation order), pts and seconds. Frame indices, not re-encoded files.",
               tables=("clips",), deps=("video_analysis",), reads=("video_analysis",), settings=("clips",)),
    AssetEntry("eval_features", "eval", "partitioned",
               "Probe, analysis (PDQ-hashed context frames) and one embedding per segment of each eval video "
               "(its shots, windowed), written only to the eval vault: the material decontamination matches "
               "train clips against.",
               vault_tables=("eval_video_probe", "eval_video_analysis", "eval_context_frames", "eval_embeddings"),
               deps=("eval_split",),
               settings=("probe", "analysis", "embeddings", "decontamination.eval_segment_s", *TORCH),
               profile="gpu", vault=True),
    AssetEntry("clip_scores", "curate", "partitioned",
               "Per clip and score (optical, motion, static, bitrate, text, quality, nsfw, faces): value in [0, 1], "
               "evidence, status and the score's own version. NSFW above the threshold is a hard kill.",
               tables=("clip_scores",), deps=("clips", "frame_index"),
               reads=("clips", "frame_index", "video_probe"),
               settings=("scores", *TORCH, "selection.recipe"), gates=("scores.cascade", "selection.recipe"),
               profile="gpu"),
    AssetEntry("clip_embeddings", "curate", "partitioned",
               "One L2-normalised visual embedding per clip, mean-pooled over its context frames.",
               tables=("clip_embeddings",), deps=("clips",), reads=("clips",), settings=("embeddings", *TORCH),
               profile="gpu"),
    AssetEntry("dedup_groups", "curate", "global",
               "Perceptual (PDQ Hamming) and semantic (cosine) near-duplicate groups over all partitions, each with "
               "its own group id, size and evidence. Incremental: new partitions query stored indexes.",
               tables=("dedup_groups",), deps=("clip_embeddings", "clip_scores"),
               reads=("clips", "clip_embeddings"), settings=("dedup",), profile="decode"),
    AssetEntry("clip_clusters", "curate", "global",
               "Each clip's semantic cluster: spherical k-means centroids over the clip embeddings, trained once per "
               "clustering version (clusters.version bumps re-cluster); new drops are assigned to them.",
               tables=("clip_clusters",), deps=("clip_embeddings",), reads=("clip_embeddings",),
               settings=("clusters",)),
    AssetEntry("decontamination", "curate", "global",
               "Every train clip matched against eval-vault material (PDQ frames and embeddings); matches are "
               "recorded here and excluded by selection.",
               tables=("decontamination",), deps=("eval_features", "clip_embeddings", "clips"),
               reads=("clips", "clip_embeddings", "eval_features"), settings=("decontamination",), vault=True),
    AssetEntry("selection", "curate", "global",
               "The selection recipe applied to saved scores and groups: pass/reject per clip, the first rule that "
               "rejected it (error:<score> when a score could not be computed; generated_copy for a real clip in a "
               "duplicate group with a model-generated one), every rule's outcome and the tier.",
               tables=("selection", "selection_pass", "selection_reject"),
               deps=("dedup_groups", "clip_scores", "decontamination"),
               reads=("clip_scores", "dedup_groups", "decontamination"),
               settings=("selection", "near_duplicates.firewall_generated")),
    AssetEntry("annotations", "derive", "partitioned",
               "Camera motion, four-level captions and tags per selected clip (T0 first), each row with model id, "
               "prompt and schema versions. New versions are appended beside old ones.",
               tables=("annotations",), deps=("selection", "clips", "video_analysis", "clip_scores"),
               reads=("video_probe", "clips", "clip_scores"), settings=("annotations",), profile="gpu"),
    AssetEntry("clip_ladder", "outputs", "partitioned",
               "Every configured rung (short side x frame rate, H.264/H.265 MP4) of each selected clip, produced "
               "from ONE decode of the clip; content-addressed blobs, nearest aspect ratio and crop recorded.",
               tables=("clip_ladder",), deps=("selection", "clips", "video_analysis", "frame_index"),
               reads=("video_probe", "frame_index"), window=True, settings=("ladder",), profile="decode"),
    AssetEntry("clip_audio", "outputs", "partitioned",
               "Each selected clip's audio span (16 kHz mono Opus by default; music kept at a higher profile), its "
               "sync status against the video track, loudness, silence and clipping shares.",
               tables=("clip_audio",), deps=("selection", "clips", "video_probe"), reads=("video_probe",),
               window=True, settings=("audio",)),
    AssetEntry("audio_annotations", "derive", "partitioned",
               "What is in each selected clip's kept audio, one row per kind with its own version: speech spans "
               "(Silero VAD), speech/music/ambience/silence tags, EBU R128 loudness, spoken language (a "
               "transcription endpoint; offline a placeholder), an audio caption and an audio-visual caption.",
               tables=("audio_annotations",), deps=("clip_audio", "annotations", "selection"),
               reads=("clip_audio", "annotations"), window=True,
               settings=("audio_annotations", "annotations.vlm", "selection.recipe")),
    AssetEntry("latents", "derive", "partitioned",
               "VAE latents per selected clip in its shape bucket (frames 4k+1 x aspect ratio), frames read from the "
               "clip's ladder rung (else the raw file), keyed by (clip_id, VAE version, bucket).",
               tables=("latents",), deps=("selection", "clips", "video_analysis", "frame_index", "clip_ladder"),
               reads=("video_probe", "frame_index", "clip_ladder"), window=True, settings=("latents", *TORCH),
               profile="gpu"),
    AssetEntry("text_embeddings", "derive", "partitioned",
               "The recipe's caption level (of the recipe's captioner version) embedded by the text encoder, per "
               "selected clip; reused while the caption text is unchanged.",
               tables=("text_embeddings",), deps=("annotations", "selection"), reads=("annotations",),
               settings=("text_embeddings", "selection.recipe", *TORCH), profile="gpu"),
    AssetEntry("caption_qc", "derive", "on_request",
               "Caption QC per captioner version (eval vault): the golden set's clips captioned by the current "
               "captioner and judged against their human references, and a seeded sample of selected clips' "
               "captions judged against their frames, by a judge of another model family. On request.",
               vault_tables=("caption_qc", "golden_captions"), deps=("annotations", "eval_features"),
               reads=("annotations", "eval_features"),
               settings=("caption_qc", "annotations"), vault=True),
    AssetEntry("dataset_snapshot", "train", "on_request",
               "A frozen, versioned manifest snapshots/v<N>/: every training sample (selected clip with latents) "
               "with provenance (and every copy of its footage with its license), bucket, stream, tier and the "
               "version of everything it uses; takedowns applied; never copies media. Materialized on request.",
               deps=("selection", "latents", "annotations", "text_embeddings", "audio_annotations", "clip_clusters"),
               reads=("raw_inventory", "video_fingerprint", "selection", "latents", "annotations", "text_embeddings",
                      "audio_annotations", "clip_clusters"),
               settings=("selection.recipe", "clusters.k"),
               rows_computed="rows_out"),
    AssetEntry("training_shards", "train", "on_request",
               "WebDataset tar shards of a snapshot, one directory per shape bucket (the mixture is not baked in), "
               "samples scattered by a snapshot-seeded order, each directory indexed for megatron-energon "
               "(.nv-meta), plus index.parquet (byte offsets) and a V-JEPA-2-style video list. On request.",
               deps=("dataset_snapshot",), reads=("dataset_snapshot", "text_embeddings", "clip_ladder"),
               settings=("train.snapshot", "train.shard_mb"),
               profile="decode", rows_computed="rows_out"),
    AssetEntry("train_plan", "train", "on_request",
               "The deterministic step plan over a snapshot's shards: (seed, step) -> the exact samples of every "
               "rank; the snapshot recipe's phases and stream mixtures, one shape bucket per step, per-stream "
               "epochs, a caption level per sample and epoch. On request.",
               deps=("training_shards",), reads=("training_shards",),
               settings=("train.snapshot", "train.seed", "train.global_batch", "train.world_size", "train.total_steps"),
               rows_computed="rows_out"),
)

INERT_SETTINGS: tuple[str, ...] = (
    # where things live and how they run: never part of what a row holds
    "deployment", "models.device", "models.onnx_threads", "bucket", "store", "compute", "checks", "freshness", "execution",
    # resource limits: exceeding one is a transient failure (retried), never a different output
    "eval.vault_shared_credentials",  # who may read the vault, never what is in it
    "probe.memory_mb", "probe.isolation", "probe.wall_base_seconds", "probe.wall_seconds_per_video_second",
    # parallelism and batching: outputs are bit-identical across their values (tested). Not the text
    # encoder's batch size: padding to the longest sentence of a batch moves the last float bits.
    "analysis.decode_threads", "analysis.batch_frames", "models.batch_frames",
    # transport to the VLM server: the model and its revision are what the rows depend on
    "annotations.vlm.endpoint", "annotations.vlm.api_key_env", "annotations.vlm.max_concurrency",
    "annotations.vlm.timeout_seconds", "annotations.vlm.retries", "annotations.vlm.backoff_seconds",
    # a check threshold reads rows, it produces none
    "latents.max_abs_robust_z",
)
"""Settings that cannot change any output: no asset's version depends on them."""

BY_NAME: dict[str, AssetEntry] = {a.name: a for a in ASSETS}
NAMES: tuple[str, ...] = tuple(BY_NAME)


def entry(name: str) -> AssetEntry:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"no asset {name!r} in the catalog; known: {', '.join(NAMES)}") from None


def of_kind(*kinds: Kind) -> list[AssetEntry]:
    return [a for a in ASSETS if a.kind in kinds]


def downstream(names: Iterable[str], via: str = "deps") -> set[str]:
    """Every asset reachable from ``names`` along ``deps`` (or ``reads``) edges, ``names`` included."""
    found = set(names)
    changed = True
    while changed:
        changed = False
        for a in ASSETS:
            if a.name not in found and set(getattr(a, via)) & found:
                found.add(a.name)
                changed = True
    return found


def after_global() -> list[AssetEntry]:
    """Partitioned assets that depend on a global one (the work for a drop's selected clips): they run
    for a drop only once the global assets reflect it, and only for the drops whose decisions
    changed (``vidassets.sensors.selected_clips_sensor``), never for every drop at once."""
    global_names = {a.name for a in of_kind("global")}
    return [a for a in ASSETS if a.partitioned and set(a.deps) & global_names]


def feeding_global() -> list[AssetEntry]:
    """Partitioned assets upstream of a global one (a drop's chain up to its scores and embeddings):
    the global assets run once these are done for the drops in flight
    (``vidassets.sensors.global_stages_sensor``)."""
    global_names = {a.name for a in of_kind("global")}
    upstream: set[str] = set()
    for a in of_kind("global"):
        upstream |= _upstream(a.name)
    return [a for a in ASSETS if a.partitioned and a.name in upstream and a.name not in global_names]


def _upstream(name: str) -> set[str]:
    found: set[str] = set()
    todo = list(entry(name).deps)
    while todo:
        dep = todo.pop()
        if dep not in found:
            found.add(dep)
            todo.extend(entry(dep).deps)
    return found


def tables_of(name: str) -> tuple[str, ...]:
    return entry(name).tables


def all_tables() -> tuple[str, ...]:
    return tuple(t for a in ASSETS for t in a.tables)


def consumes(a: AssetEntry, leaf: str) -> bool:
    """Whether the settings leaf (dotted path) is one of the asset's inputs."""
    if any(leaf == k or leaf.startswith(k + ".") for k in INERT_SETTINGS):
        return False
    return any(leaf == k or leaf.startswith(k + ".") for k in a.settings)


def gates(a: AssetEntry, leaf: str) -> bool:
    """Whether the settings leaf only decides the asset's verdicts (see ``AssetEntry.gates``)."""
    return any(leaf == k or leaf.startswith(k + ".") for k in a.gates)


def _check() -> None:
    """The catalog is a DAG listed in dependency order, and reads are upstream of the asset."""
    seen: set[str] = set()
    for a in ASSETS:
        missing = [d for d in (*a.deps, *a.reads) if d not in seen]
        if missing:
            raise AssertionError(f"catalog: {a.name} depends on {missing}, declared later or unknown")
        seen.add(a.name)


_check()
