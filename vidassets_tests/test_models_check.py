"""``vidassets models check``: every configured model slot loaded once and run once, its version the
version rows get; a missing file or a refused layout fails naming the setting; the production model
set, checked on this machine (no GPU, no checkpoints), fails with each missing path named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from vidassets.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, main
from vidassets.config import load_settings
from vidassets.model_check import check_slot, configured_slots
from vidassets.models.placement import Placement
from vidassets.models.registry import ModelRegistry
from vidassets.versions import Versions
from vidassets_tests.test_image_towers import _siglip
from vidassets_tests.test_text_tokens import tiny_wan_text_encoder

REPO = Path(__file__).resolve().parents[1]


def _check(capsys, *argv: str) -> tuple[int, dict]:
    code = main(["models", "check", "--json", *argv])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else {}


def test_the_default_models_all_load_and_run(capsys, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # no vidassets.yaml here: the defaults
    code, found = _check(capsys)
    assert code == EXIT_OK
    slots = {m["slot"]: m for m in found["models"]}
    assert {"scores.text", "scores.quality", "scores.nsfw", "embeddings", "latents.vae", "text_embeddings",
            "audio_annotations.vad"} <= set(slots)
    assert all(m["ok"] and m["device"] == "cpu" and m["forward_ms"] is not None for m in slots.values())
    assert "random-init" in slots["latents.vae"]["version"]  # the placeholder says so
    assert slots["scores.nsfw"]["provider"] == "CPUExecutionProvider"
    assert slots["embeddings"]["provider"] == "torch:cpu"
    table = main(["models", "check"])
    assert table == EXIT_OK and "(PLACEHOLDER)" in capsys.readouterr().out


def test_the_production_model_set_names_every_missing_path_here(capsys) -> None:
    """On this machine none of the production checkpoints (nor a GPU) exist: a usage error naming them."""
    code = main(["models", "check", "--config", str(REPO / "deployments/models.production.yaml")])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE
    for field in ("models.device", "latents.vae_path", "text_embeddings.model_path"):
        assert field in err
    production = yaml.safe_load((REPO / "deployments/models.production.yaml").read_text())
    assert production["text_embeddings"]["model"] == "t5_encoder" and production["latents"]["vae_path"]


def test_configured_models_load_and_a_missing_head_fails_naming_its_setting(capsys, tmp_path: Path) -> None:
    tower = _siglip(tmp_path / "siglip")
    text = tiny_wan_text_encoder(tmp_path / "wan")
    config = {"embeddings": {"model": "siglip", "weights": str(tower)},
              "text_embeddings": {"model": "t5_encoder", "model_path": str(text), "max_tokens": 16},
              "scores": {"quality_model": "aesthetic_v2_5", "aesthetic_head": str(tmp_path / "missing.pth"),
                         "aesthetic_tower": str(tower)}}
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(config))
    code, found = _check(capsys, "--config", str(path))
    assert code == EXIT_FAILED
    slots = {m["slot"]: m for m in found["models"]}
    assert not slots["scores.quality"]["ok"] and slots["scores.quality"]["error"].startswith("scores.aesthetic_head")
    assert "missing.pth" in slots["scores.quality"]["error"]
    assert slots["embeddings"]["ok"] and slots["text_embeddings"]["ok"]  # one bad slot hides no other
    versions = Versions(load_settings(path))
    assert slots["text_embeddings"]["version"] in versions.own("text_embeddings")  # the version rows get
    assert slots["embeddings"]["version"].startswith("siglip")


def test_a_vae_of_an_unsupported_class_fails_naming_the_path(tmp_path: Path) -> None:
    vae = tmp_path / "vae"
    vae.mkdir()
    (vae / "config.json").write_text(json.dumps({"_class_name": "AutoencoderKL"}))  # an image VAE
    settings = load_settings(overrides={"latents.vae_path": str(vae)}, env={})
    slot = next(s for s in configured_slots(settings) if s.name == "latents.vae")
    result = check_slot(slot, ModelRegistry("cpu"))
    assert not result.ok and result.error.startswith("latents.vae_path") and "AutoencoderKL" in result.error


def test_a_gpu_placed_model_computing_on_the_cpu_fails(tmp_path: Path) -> None:
    """No GPU here: a registry whose model says cuda but keeps its weights on the CPU stands in for a
    pod that reserved a GPU and computes on its CPU (a stand-in: the real case needs a GPU)."""
    registry = ModelRegistry("cpu")
    settings = load_settings(overrides={"embeddings.model": "siglip", "embeddings.weights": str(_siglip(tmp_path / "s"))},
                             env={})
    slot = next(s for s in configured_slots(settings) if s.name == "embeddings")
    model = registry.get(slot.kind, *slot.args)
    object.__setattr__(model, "placement", Placement("cuda:0", "fp32"))
    result = check_slot(slot, registry)
    assert not result.ok and "placed on cuda:0 but runs on torch:cpu" in result.error
    assert result.error.startswith("embeddings.weights")


@pytest.mark.parametrize("missing", ["audio_annotations.tagger", "audio_annotations.whisper"])
def test_an_audio_model_directory_without_a_model_fails_naming_it(missing: str, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    settings = load_settings(overrides={f"{missing}.model_dir": str(empty)}, env={})
    slot = next(s for s in configured_slots(settings) if s.name == missing)
    result = check_slot(slot, ModelRegistry("cpu"))
    assert not result.ok and result.error.startswith(f"{missing}.model_dir")
