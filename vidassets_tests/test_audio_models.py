"""The audio model slots against their upstream libraries, on real audio (espeak-ng speech, a
synthetic tune): an AST AudioSet tagger and Whisper, each built from its published configuration
shrunk to tiny dimensions (random weights, fixed seed), saved in the published directory layout,
loaded through vidassets and compared with the upstream processor + forward / generate."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from vidassets.models.placement import Placement
from vidassets_tests.media_files import music_samples, speech_samples

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

RATE = 16000
# real AudioSet label names (ontology display names, as in the published id2label)
AUDIOSET_LABELS = ["Speech", "Music", "Vehicle", "Dog", "Silence", "Musical instrument", "Narration, monologue"]
# MIT/ast-finetuned-audioset-10-10-0.4593's config.json, shrunk in width and depth (input shape as published)
AST_CONFIG = dict(architectures=["ASTForAudioClassification"], attention_probs_dropout_prob=0.0, frequency_stride=10,
                  hidden_act="gelu", hidden_dropout_prob=0.0, hidden_size=32, initializer_range=0.02,
                  intermediate_size=64, layer_norm_eps=1e-12, max_length=1024, num_attention_heads=2,
                  num_hidden_layers=1, num_mel_bins=128, patch_size=16, qkv_bias=True, time_stride=10)
# its preprocessor_config.json, as published
AST_EXTRACTOR = dict(feature_size=1, sampling_rate=16000, num_mel_bins=128, max_length=1024, padding_value=0.0,
                     do_normalize=True, mean=-4.2677393, std=4.5689974, return_attention_mask=False)
WHISPER_LANGUAGES = ["en", "de", "fr", "es", "it"]
SPECIALS = ["<|endoftext|>", "<|startoftranscript|>", *[f"<|{code}|>" for code in WHISPER_LANGUAGES], "<|translate|>",
            "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]


class BatchingCpu(Placement):
    """The CPU running frames in GPU-sized runs (the batched code path, tested here)."""

    def run_frames(self, batch_frames: int) -> int:
        return batch_frames


def _speech(text: str, rate: int = RATE) -> np.ndarray:
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed: no real speech to test on (apt-get install espeak-ng)")
    return speech_samples(text, rate)


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    return _speech("The quick brown fox jumps over the lazy dog near the river bank.")


# --- AST ------------------------------------------------------------------------------------------

def build_ast_dir(path):
    """A tiny random AST AudioSet tagger (fixed seed) saved at ``path`` in the published layout."""
    from transformers import ASTConfig, ASTFeatureExtractor, ASTForAudioClassification

    config = ASTConfig(**AST_CONFIG, id2label=dict(enumerate(AUDIOSET_LABELS)),
                       label2id={name: i for i, name in enumerate(AUDIOSET_LABELS)})
    torch.manual_seed(0)
    model = ASTForAudioClassification(config).eval()
    torch.nn.init.normal_(model.classifier.dense.weight, std=2.0)  # spread the scores over (0, 1)
    model.save_pretrained(path)
    ASTFeatureExtractor(**AST_EXTRACTOR).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def ast_dir(tmp_path_factory):
    return build_ast_dir(tmp_path_factory.mktemp("ast"))


@pytest.fixture(scope="module")
def ast_upstream(ast_dir):
    from transformers import ASTFeatureExtractor, ASTForAudioClassification

    model = ASTForAudioClassification.from_pretrained(ast_dir, local_files_only=True).eval()
    extractor = ASTFeatureExtractor.from_pretrained(ast_dir, local_files_only=True)

    def scores(samples: np.ndarray) -> np.ndarray:
        inputs = extractor(samples, sampling_rate=RATE, return_tensors="pt")
        with torch.inference_mode():
            return torch.sigmoid(model(**inputs).logits)[0].numpy()

    return scores


def test_ast_scores_speech_like_upstream(ast_dir, ast_upstream, speech):
    from vidassets.models.audio_tagger import AudioTagger

    tagger = AudioTagger(Placement(), ast_dir, threshold=0.5, top_k=3)
    assert len(speech) < 10 * RATE  # one window: upstream's own input
    tags = tagger(speech, RATE)
    expected = ast_upstream(speech)
    np.testing.assert_allclose(tags.scores, expected, rtol=0, atol=1e-5)
    above = sorted((i for i in range(len(expected)) if expected[i] >= 0.5), key=lambda i: -expected[i])[:3]
    assert [name for name, _ in tags.labels] == [AUDIOSET_LABELS[i] for i in above]
    assert tags.labels and 0 < len(tags.labels) <= 3 and tags.windows == 1
    assert tagger.calls == 1


def test_ast_long_music_max_pools_windows(ast_dir, ast_upstream):
    from vidassets.models.audio_tagger import AudioTagger

    music = music_samples(25.0, RATE)  # 400000 samples; a window is 1023 * 160 + 400 = 164080
    tags = AudioTagger(Placement(), ast_dir, threshold=0.0, top_k=None)(music, RATE)
    windows = [music[0:164080], music[163840:327920], music[400000 - 164080:]]
    expected = np.max([ast_upstream(w) for w in windows], axis=0)
    np.testing.assert_allclose(tags.scores, expected, rtol=0, atol=1e-5)
    assert tags.windows == 3 and len(tags.labels) == len(AUDIOSET_LABELS)
    assert [s for _, s in tags.labels] == sorted((s for _, s in tags.labels), reverse=True)


def test_ast_batched_runs_score_like_single_windows(ast_dir):
    from vidassets.models.audio_tagger import AudioTagger

    clips = [music_samples(12.0, RATE), music_samples(3.0, RATE)]  # 2 + 1 windows: runs of 2, the last padded
    single = AudioTagger(Placement(), ast_dir).tag_many(clips, RATE)
    batched_tagger = AudioTagger(BatchingCpu(), ast_dir, batch_frames=2)
    batched = batched_tagger.tag_many(clips, RATE)
    assert batched_tagger.batches == 2 and batched_tagger.calls == 3 and [t.windows for t in batched] == [2, 1]
    for one, many in zip(single, batched, strict=True):
        np.testing.assert_allclose(many.scores, one.scores, rtol=0, atol=1e-5)


def test_ast_resamples_other_rates(ast_dir, speech):
    from scipy.signal import resample_poly

    from vidassets.models.audio_tagger import AudioTagger

    tagger = AudioTagger(Placement(), ast_dir)
    at_22k = resample_poly(speech, 441, 320).astype(np.float32)
    np.testing.assert_allclose(tagger(at_22k, 22050).scores,
                               tagger(resample_poly(at_22k, 320, 441).astype(np.float32), RATE).scores, atol=1e-6)


def test_ast_bad_input_and_missing_dir(ast_dir, tmp_path):
    from vidassets.models.audio_tagger import AudioTagger

    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        AudioTagger(Placement(), missing)
    tagger = AudioTagger(Placement(), ast_dir)
    with pytest.raises(ValueError, match="mono"):
        tagger(np.zeros((2, RATE), np.float32), RATE)
    with pytest.raises(ValueError, match="empty"):
        tagger(np.zeros(0, np.float32), RATE)
    with pytest.raises(ValueError, match="threshold"):
        AudioTagger(Placement(), ast_dir, threshold=2.0)


# --- Whisper --------------------------------------------------------------------------------------

def _tiny_whisper_tokenizer():
    """A valid byte-level BPE Whisper tokenizer: the 256 byte symbols (no merges) and the special
    tokens generate and the processor need, ids in Whisper's order."""
    from transformers import WhisperTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokenizer = WhisperTokenizer(vocab={symbol: i for i, symbol in enumerate(bytes_to_unicode().values())}, merges=[])
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIALS[1:]})
    return tokenizer, {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIALS}


def build_whisper_dir(path):
    """A tiny random multilingual Whisper (fixed seed) saved at ``path`` in the published layout."""
    from transformers import GenerationConfig, WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

    tokenizer, ids = _tiny_whisper_tokenizer()
    eos, sot = ids["<|endoftext|>"], ids["<|startoftranscript|>"]
    # openai/whisper-tiny's config.json shrunk: width 32, one layer each side, its vocabulary
    config = WhisperConfig(vocab_size=len(tokenizer), num_mel_bins=80, d_model=32, encoder_layers=1, decoder_layers=1,
                           encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                           max_source_positions=1500, max_target_positions=448, pad_token_id=eos, bos_token_id=eos,
                           eos_token_id=eos, decoder_start_token_id=sot, begin_suppress_tokens=[220, eos],
                           suppress_tokens=[1, 2])
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(config).eval()
    # wider random weights than the 0.02 init: the tokens then follow the audio, not only the prompt
    for weight in [*model.model.decoder.parameters(), model.model.encoder.conv1.weight, model.model.encoder.conv2.weight]:
        if weight.dim() >= 2:
            torch.nn.init.normal_(weight, std=1.0)
    # its generation_config.json shrunk the same way; all but printable ASCII, space and the end of
    # text suppressed, so that the random model writes readable text
    readable = {*range(94), 220, eos}  # byte-level symbols of "!".."~", then "Ġ" (space)
    model.generation_config = GenerationConfig(
        decoder_start_token_id=sot, eos_token_id=eos, pad_token_id=eos, bos_token_id=eos, max_length=24,
        begin_suppress_tokens=[220, eos], suppress_tokens=[t for t in range(len(tokenizer)) if t not in readable],
        is_multilingual=True, lang_to_id={f"<|{c}|>": ids[f"<|{c}|>"] for c in WHISPER_LANGUAGES},
        task_to_id={"translate": ids["<|translate|>"], "transcribe": ids["<|transcribe|>"]},
        no_timestamps_token_id=ids["<|notimestamps|>"], prev_sot_token_id=ids["<|startofprev|>"],
        return_timestamps=False)
    model.save_pretrained(path)
    WhisperFeatureExtractor(feature_size=80).save_pretrained(path)  # preprocessor_config.json, as published
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory):
    return build_whisper_dir(tmp_path_factory.mktemp("whisper"))


@pytest.fixture(scope="module")
def whisper_upstream(whisper_dir):
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    model = WhisperForConditionalGeneration.from_pretrained(whisper_dir, local_files_only=True).eval()
    processor = WhisperProcessor.from_pretrained(whisper_dir, local_files_only=True)

    def run(samples: np.ndarray, **options) -> tuple[str, list[int], str]:
        """(language token generate detects, generated ids, text) of at most 30 s of audio."""
        features = processor(samples, sampling_rate=RATE, return_tensors="pt").input_features
        with torch.inference_mode():
            language = processor.tokenizer.convert_ids_to_tokens(int(model.detect_language(features)[0]))
            ids = model.generate(features, do_sample=False, num_beams=1, **options)[0].tolist()
        if model.generation_config.eos_token_id in ids:
            ids = ids[: ids.index(model.generation_config.eos_token_id) + 1]
        return language, ids, processor.decode(ids, skip_special_tokens=True).strip()

    return run


def test_whisper_detects_and_transcribes_like_upstream(whisper_dir, whisper_upstream, speech):
    from vidassets.models.whisper import WhisperTranscriber

    found = WhisperTranscriber(Placement(), whisper_dir)(speech, RATE)
    language, ids, text = whisper_upstream(speech, task="transcribe")  # generate's own language detection
    assert found.ok and found.language == language.strip("<|>") and 0 < found.language_probability <= 1
    assert found.token_ids == [ids] and found.text == text and text


def test_whisper_forced_language_and_long_audio_in_chunks(whisper_dir, whisper_upstream, speech):
    from vidassets.models.whisper import WhisperTranscriber

    gap = np.zeros(31 * RATE - len(speech), np.float32)
    long_audio = np.concatenate([speech, gap, speech[::-1].copy()])  # 31 s + the speech reversed: two chunks
    found = WhisperTranscriber(Placement(), whisper_dir, language="it")(long_audio, RATE)
    first, second = (whisper_upstream(chunk, task="transcribe", language="it")
                     for chunk in (long_audio[: 30 * RATE], long_audio[30 * RATE:]))
    assert found.language == "it" and found.language_probability is None
    assert found.token_ids == [first[1], second[1]]
    assert found.text == " ".join(t for t in (first[2], second[2]) if t)


def test_whisper_batched_chunks_decode_like_upstream(whisper_dir, whisper_upstream, speech):
    from vidassets.models.whisper import WhisperTranscriber

    audio = np.concatenate([np.zeros(30 * RATE, np.float32), speech])  # a silent chunk, then speech: one run of 2
    transcriber = WhisperTranscriber(BatchingCpu(), whisper_dir, language="en", batch_frames=2)
    found = transcriber(audio, RATE)
    expected = [whisper_upstream(chunk, task="transcribe", language="en")[1] for chunk in (audio[: 30 * RATE],
                                                                                      audio[30 * RATE:])]
    assert found.token_ids == expected and transcriber.batches == 1


def test_whisper_bad_settings_and_missing_dir(whisper_dir, tmp_path):
    from vidassets.models.whisper import WhisperTranscriber

    missing = tmp_path / "no-such-whisper"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        WhisperTranscriber(Placement(), missing)
    with pytest.raises(ValueError, match="task"):
        WhisperTranscriber(Placement(), whisper_dir, task="summarise")
    with pytest.raises(ValueError, match="'xx'"):
        WhisperTranscriber(Placement(), whisper_dir, language="xx")


def test_tokens_end_at_end_of_text():
    from vidassets.models.whisper import until_end

    assert until_end([5, 7, 256, 256, 256], 256) == [5, 7, 256]  # a batch row: padding after the end dropped
    assert until_end([5, 7], [256, 3]) == [5, 7]


def test_tagger_and_whisper_through_the_graph(tmp_path, ast_dir, whisper_dir, speech) -> None:
    """audio_annotations with both local models configured, on a real clip with speech: the tags rows
    carry AudioSet labels from the AST checkpoint, the language rows Whisper's detection, and each
    kind's version names the model that made it."""
    import json

    from vidassets.config import ConfigError, load_settings
    from vidassets.demo.bucket import decode_rgb
    from vidassets.storage import TableStore, open_object_store
    from vidassets_tests.conftest import graph_settings, run_graph
    from vidassets_tests.media_files import video_with_audio
    from vidassets_tests.test_audio import SAMPLE_CACHE

    drop = tmp_path / "bucket/raw/licensed/drop-0001"
    drop.mkdir(parents=True)
    frames = list(decode_rgb(SAMPLE_CACHE / "bikes.mp4", limit=75, start=76))  # one real shot, 3 s
    video_with_audio(drop / "talk.mp4", frames, np.pad(speech, (0, max(0, 3 * RATE - len(speech))))[: 3 * RATE])
    recipe = tmp_path / "all.yaml"
    recipe.write_text(json.dumps({"score_rules": [], "perceptual_dedup": {"enabled": False},
                                  "semantic_dedup": {"enabled": False}}))
    models = {"audio_annotations.tagger": {"model_dir": str(ast_dir), "threshold": 0.01, "top_k": 3},
              "audio_annotations.whisper": {"model_dir": str(whisper_dir), "max_new_tokens": 8}}
    settings = graph_settings(tmp_path / "bucket", tmp_path, **{"selection.recipe": str(recipe), "clips.min_seconds": 1.0,
                                                                **models})
    run_graph(settings, tmp_path)
    rows = TableStore(open_object_store(str(tmp_path / "store"))).read("audio_annotations", "licensed/drop-0001")
    tags, language = rows[rows.kind == "tags"], rows[rows.kind == "language"]
    assert len(tags) and (tags.status == "ok").all() and tags.producer_version.str.contains("ast-audioset@transformers").all()
    for value in tags.value:
        found = json.loads(value)
        assert found["label"] in ("speech", "music", "ambience", "silence")  # the rule-based shares stay
        assert 1 <= len(found["audioset"]["labels"]) <= 3
        assert {name for name, _ in found["audioset"]["labels"]} <= set(AUDIOSET_LABELS)
    assert language.producer_version.str.startswith("whisper@transformers").all()
    spoken = [json.loads(v) for v in language.value]
    assert any(v.get("language") in WHISPER_LANGUAGES for v in spoken)
    with pytest.raises(ConfigError, match="whisper or transcription"):
        load_settings(env={}, overrides={**models, "audio_annotations.transcription": {"endpoint": "http://asr/v1",
                                                                                       "model": "whisper"}})
