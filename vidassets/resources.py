"""Dagster resources, each built once per process from the settings (``build_resources``) and taken
by the assets as parameters:

- ``bucket``: the read-only input bucket; ``store``: where vidassets writes (tables and blobs);
  ``eval_vault``: the eval side's own root and credentials, given only to the vault assets;
  ``near_index``: the near-duplicate index's database (a cache of the fingerprint tables);
  ``dedup_state``, ``selection_state``: dedup's and selection's state (their databases, read in pieces).
- ``pipeline``: the settings and versions, and for each asset run the views of what its catalog entry
  declares it reads (``vidassets.stages.declared``): an undeclared read raises.
- ``execution``: how per-item work runs (the local or Ray engine, retries, the decode limits).
- ``models``: every model and model endpoint (the registry and its built models, the shot model, the
  VAE, the text encoder, the audio models, one chat client per configured endpoint), built on first use.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from dagster import ConfigurableResource
from dagster_aws.s3 import S3Resource

from vidassets.config import ConfigError, ProbeSettings, Settings, credentials, model_cache, s3_endpoint_url
from vidassets.curate.dedup_state import DedupState
from vidassets.curate.selection_state import SelectionState
from vidassets.ingest.near_dup_index import NearDuplicateIndex
from vidassets.runtime.engine import Engine, engine_for
from vidassets.stages.declared import DeclaredTables, ReadLog, SettingsView
from vidassets.storage import ReadOnlyBucket, TableStore, open_object_store
from vidassets.storage.objects import ObjectStore
from vidassets.versions import Versions


def _client_factory(uri: str, s3: S3Resource | None):
    if urlparse(uri).scheme != "s3":
        return None
    return lambda: (s3 or S3Resource()).get_client()


def _s3(endpoint_url: str | None) -> S3Resource:
    return S3Resource(endpoint_url=endpoint_url) if endpoint_url else S3Resource()


class StoreResource(ConfigurableResource):
    """Where vidassets writes: ``root`` holds tables and blobs. It cannot reach the eval vault:
    that is a separate resource (``eval_vault``) that only the eval-side steps are given."""

    root: str
    s3_endpoint_url: str | None = None

    def objects(self) -> ObjectStore:
        return open_object_store(self.root, _client_factory(self.root, _s3(self.s3_endpoint_url)))

    def tables(self) -> TableStore:
        return TableStore(self.objects())


class EvalVaultResource(ConfigurableResource):
    """The eval vault: its own root (a second bucket or prefix) and its own credentials, given only
    to the vault assets (catalog entries with ``vault``). On S3 the client uses
    ``<credentials_env>AWS_ACCESS_KEY_ID`` / ``…SECRET_ACCESS_KEY`` / ``…SESSION_TOKEN`` when set
    (the vault's own key pair). Sealed by default: on S3 it refuses to start without that pair or
    with the store's own key, unless ``shared_credentials`` (``eval.vault_shared_credentials``) says
    the store's credentials are allowed on purpose."""

    root: str
    s3_endpoint_url: str | None = None
    credentials_env: str = "VIDASSETS_VAULT_"
    shared_credentials: bool = False

    def sealing(self) -> str | None:
        """Why the vault is not sealed from the training side (None when it is): an S3 vault read
        with the store's credentials."""
        if urlparse(self.root).scheme != "s3":
            return None
        keys = credentials(self.credentials_env)
        if not (keys.get("aws_access_key_id") and keys.get("aws_secret_access_key")):
            return (f"the eval vault {self.root} has no credentials of its own: set {self.credentials_env}"
                    f"AWS_ACCESS_KEY_ID / {self.credentials_env}AWS_SECRET_ACCESS_KEY (a key pair the training side "
                    "lacks; on Kubernetes the compute.vault_secret Secret)")
        if keys["aws_access_key_id"] == _store_access_key():
            return f"the eval vault {self.root} is given the store's own access key"
        return None

    def _client(self):
        import boto3

        problem = self.sealing()
        if problem and not self.shared_credentials:
            raise ConfigError(f"eval.vault_shared_credentials: {problem}; or set eval.vault_shared_credentials: true "
                              "on purpose (the eval_vault_is_sealed check then warns on every run)")
        keys = credentials(self.credentials_env)
        if keys.get("aws_access_key_id") and keys.get("aws_secret_access_key"):
            return boto3.session.Session().client("s3", endpoint_url=self.s3_endpoint_url, **keys)
        return _s3(self.s3_endpoint_url).get_client()

    def tables(self) -> TableStore:
        factory = self._client if urlparse(self.root).scheme == "s3" else None
        return TableStore(open_object_store(self.root, factory))


class NearDuplicateIndexResource(ConfigurableResource):
    """The near-duplicate index (``store.near_duplicate_index``): opened once per process."""

    url: str

    def open(self) -> NearDuplicateIndex:
        return _open_index(self.url)


@functools.cache
def _open_index(url: str) -> NearDuplicateIndex:
    return NearDuplicateIndex(url)


class DedupStateResource(ConfigurableResource):
    """Dedup's state (``store.near_duplicate_index``'s database): opened once per process."""

    url: str

    def open(self) -> DedupState:
        return _open_dedup_state(self.url)


@functools.cache
def _open_dedup_state(url: str) -> DedupState:
    return DedupState(url)


class SelectionStateResource(ConfigurableResource):
    """Selection's state (``store.near_duplicate_index``'s database): opened once per process."""

    url: str

    def open(self) -> SelectionState:
        return _open_selection_state(self.url)


@functools.cache
def _open_selection_state(url: str) -> SelectionState:
    return SelectionState(url)


class BucketResource(ConfigurableResource):
    """The input bucket (local directory or ``s3://bucket/prefix``); read-only by construction."""

    root: str
    s3_endpoint_url: str | None = None

    def open(self) -> ReadOnlyBucket:
        return ReadOnlyBucket(open_object_store(self.root, _client_factory(self.root, _s3(self.s3_endpoint_url))))


class StageRun:
    """One asset's run: its partition key and the views of what its catalog entry declares it reads."""

    def __init__(self, pipeline: Pipeline, name: str, key: str | None, store: StoreResource,
                 vault: EvalVaultResource | None = None):
        log = pipeline.reads
        self.name, self.key, self.versions = name, key, pipeline.versions
        self.settings: Any = SettingsView(pipeline.settings, name, log)
        stored = store.tables()
        self.objects = stored.objects
        self.tables: Any = DeclaredTables(stored, name, "tables", log)
        self.which: Any = DeclaredTables(stored, name, "which", log)
        self.vault: Any = None
        self.vault_which: Any = None
        if vault is not None:
            in_vault = vault.tables()
            self.vault = DeclaredTables(in_vault, name, "tables", log, vault=True)
            self.vault_which = DeclaredTables(in_vault, name, "which", log, vault=True)

    @property
    def recipe(self):
        """The selection recipe (``selection.recipe``: declared by the assets that read it)."""
        self.settings.selection.recipe  # noqa: B018 - the declared read, logged (raises when undeclared)
        return self.versions.recipe


class Pipeline:
    """The settings and versions of this code location, and what each asset read in this process."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.versions = Versions(settings)
        self.reads = ReadLog()

    def run(self, context: Any, store: StoreResource, vault: EvalVaultResource | None = None) -> StageRun:
        name = context.asset_key.to_user_string()
        key = context.partition_key if context.has_partition_key else None
        return StageRun(self, name, key, store, vault)


class Execution:
    """How per-item work runs: the engine ``execution.engine`` names (a Ray engine joins or starts its
    cluster on first use), how often a failed item is tried, and the limits every decode task keeps
    (the probe's: a file the probe passed is within them, so they never change another step's rows)."""

    def __init__(self, settings: Settings):
        self._execution = settings.execution
        self.max_runs = settings.execution.max_runs
        self.limits: ProbeSettings = settings.probe

    @functools.cached_property
    def engine(self) -> Engine:
        ex = self._execution
        if ex.engine == "local":
            return engine_for("local")
        r = ex.ray
        return engine_for("ray", r.address, r.max_in_flight, r.num_cpus_per_task, r.task_retries, r.model_actors,
                          r.gpus_per_model_actor)

    @property
    def vault_engine(self) -> Engine | None:
        """Where eval material may be matched: the Ray engine only with ``execution.ray.vault_matching``
        (else None: in the step's own process)."""
        ex = self._execution
        return self.engine if ex.engine == "ray" and ex.ray.vault_matching else None


class Models:
    """Every model and model endpoint, placed on ``models.device`` in ``models.compute_dtype``; each is
    built on first use and kept (the registry holds the built models, this resource the clients). An
    asset names the model it wants by the settings section it declares (``run.settings.latents``),
    so the settings a model is built from are read through the asset's declared reads."""

    def __init__(self, settings: Settings):
        from vidassets.models.registry import ModelRegistry

        m = settings.models
        self.registry = ModelRegistry(m.device, m.compute_dtype, m.onnx_threads, m.torch_threads, m.batch_frames)
        self.batch_frames = m.batch_frames
        self._clients: dict[tuple, Any] = {}

    def __getstate__(self) -> dict:  # what travels to a Ray worker: no built model, no client holding a key
        return {**self.__dict__, "_clients": {}}

    def shot_model(self, analysis: Any):
        """TransNetV2 for the analysis pass when ``analysis.detector`` reads it (else None)."""
        from vidassets.media.analysis import MODEL_DETECTORS

        if analysis.detector not in MODEL_DETECTORS:
            return None
        registry = self.registry
        return lambda frames: registry.get("transnetv2")(frames)

    def embedder(self, embeddings: Any):
        """The visual embedder ``embeddings.model`` (``embeddings.weights``) names."""
        from vidassets.curate.embeddings import embedder

        return embedder(self.registry, embeddings)

    def vae(self, latents: Any):
        """The video VAE ``latents.vae_class`` / ``latents.vae_path`` name (a random-init placeholder without weights)."""
        from vidassets.derive.latents import vae_model

        return self.registry.get(*vae_model(latents), cache_root=model_cache())

    def text_encoder(self, text_embeddings: Any):
        """The caption encoder ``text_embeddings.model`` names (pooled, or umT5/T5 per-token states)."""
        from vidassets.derive.text_embeddings import encoder_model

        kind, args = encoder_model(text_embeddings)
        return self.registry.get(kind, *args)

    def chat(self, endpoint: Any):
        """The chat-completions client of one configured endpoint (``annotations.vlm``,
        ``caption_qc.judge``): one per endpoint, model and request format."""
        from vidassets.models.vlm import OpenAIChatClient, endpoint_format

        key = (endpoint.endpoint, endpoint.model, *endpoint_format(endpoint).values())
        if key not in self._clients:
            self._clients[key] = OpenAIChatClient.for_endpoint(endpoint)
        return self._clients[key]

    def audio_models(self, audio_annotations: Any, vlm: Any):
        """Silero VAD, the transcription endpoint (or the offline placeholder) and, for
        ``audio_annotations.captions: vlm``, the chat client of ``vlm``; each built on first use."""
        from vidassets.derive.audio_annotations import AudioModels, tagger_model, whisper_model
        from vidassets.models.transcriber import NoTranscriber, OpenAITranscriber

        a = audio_annotations

        def transcriber():
            if a.whisper is not None:
                return self.registry.get(*whisper_model(a))
            t = a.transcription
            key = ("asr", t.endpoint, t.model) if t else ("asr",)
            if key not in self._clients:
                self._clients[key] = OpenAITranscriber(t.endpoint, t.model, t.model_revision, t.api_key_env,
                                                       t.timeout_seconds, t.retries, t.backoff_seconds) \
                    if t else NoTranscriber()
            return self._clients[key]

        return AudioModels(vad=lambda: self.registry.get("silero-vad", a.vad_threshold), transcriber=transcriber,
                           captioner=(lambda: self.chat(vlm)) if a.captions == "vlm" else None,
                           tagger=(lambda: self.registry.get(*tagger_model(a))) if a.tagger is not None else None)

    def judge(self, caption_qc: Any):
        """The caption-QC judge ``caption_qc.judge`` names, or the rule-based placeholder."""
        from vidassets.derive.caption_judge import judge_for

        judge = caption_qc.judge
        return judge_for(judge, self.chat(judge) if judge is not None else None)


def _store_access_key() -> str | None:
    """The access key id of the default credential chain (the store's), if any."""
    import boto3

    found = boto3.Session().get_credentials()
    return found.access_key if found is not None else None


def absolute_uri(uri: str) -> str:
    """Local paths become absolute (runs may start in another working directory)."""
    return uri if urlparse(uri).scheme in ("s3", "file") else str(Path(uri).expanduser().absolute())


def build_resources(settings: Settings) -> dict[str, Any]:
    endpoint = s3_endpoint_url()
    bucket_uri, store_uri, vault_uri = (absolute_uri(u) for u in
                                        (settings.bucket.uri, settings.store.uri, settings.store.vault_uri()))
    return {
        "bucket": BucketResource(root=bucket_uri, s3_endpoint_url=endpoint),
        "store": StoreResource(root=store_uri, s3_endpoint_url=endpoint),
        "eval_vault": EvalVaultResource(root=vault_uri, s3_endpoint_url=endpoint,
                                        shared_credentials=settings.eval.vault_shared_credentials),
        "near_index": NearDuplicateIndexResource(url=settings.store.index_url()),
        "dedup_state": DedupStateResource(url=settings.store.index_url("dedup")),
        "selection_state": SelectionStateResource(url=settings.store.index_url("selection")),
        "pipeline": Pipeline(settings),
        "execution": Execution(settings),
        "models": Models(settings),
    }
