"""Caption QC on real footage: a golden set in the eval vault (an eval clip of carphone.mp4 with a
human reference caption, imported through the CLI) is captioned by the current captioner and judged
against its reference; a seeded sample of the selected clips' captions is judged against their
frames. Offline the judge is the rule-based placeholder (golden set only); with a judge endpoint
(a local stand-in for an OpenAI-compatible server, said so) every row is judged from frames, and
nothing is judged twice. The judge must be of another model family than the captioner."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vidassets.config import ConfigError, load_settings
from vidassets.runner import local_instance, materialize_bucket
from vidassets.storage import TableStore, open_object_store
from vidassets_tests.conftest import SMALL_LATENTS
from vidassets_tests.test_decontamination import _salt_routing_only
from vidassets_tests.test_derive import ChatServer

REFERENCE = "A man talks on a mobile phone while sitting in a car, trees passing the window behind him."


class JudgeServer(ChatServer):
    """The stand-in server also grades captions (its replies name a score and one finding)."""

    def reply(self, body: dict) -> str:
        if body.get("response_format", {}).get("json_schema", {}).get("name") == "caption_judge":
            return json.dumps({"score": 0.75, "errors": ["the car's colour is not visible"]})
        return super().reply(body)


def test_caption_qc_judges_the_golden_set_and_a_sample(demo_bucket: Path, tmp_path: Path) -> None:
    drop = tmp_path / "bucket/raw/licensed/drop-0001"
    drop.mkdir(parents=True)
    for name in ("carphone.mp4", "bikes.mp4"):
        shutil.copy(demo_bucket / "raw/licensed/drop-0001" / name, drop / name)
    salt = _salt_routing_only(drop / "carphone.mp4", [drop / "bikes.mp4"], 0.5)
    base = {"bucket.uri": str(tmp_path / "bucket"), "store.uri": str(tmp_path / "store"),
            "store.eval_vault_uri": str(tmp_path / "vault"), "eval.fraction": 0.5, "eval.salt": salt,
            "selection.recipe": str(_all_pass(tmp_path)), **SMALL_LATENTS}
    instance = local_instance(str(tmp_path / "home"))
    assert materialize_bucket(load_settings(env={}, overrides=base), instance, log=lambda _: None).ok
    vault = TableStore(open_object_store(str(tmp_path / "vault")))
    carphone = vault.read_all("eval_assets").asset_id.iloc[0]
    golden = tmp_path / "golden.jsonl"
    golden.write_text(json.dumps({"asset_id": carphone, "first_frame": 0, "last_frame": 40,
                                  "captions": {"level_1": REFERENCE}}) + "\n")
    cli = str(Path(sys.executable).parent / "vidassets")
    proc = subprocess.run([cli, "golden", "import", str(golden), "--store", str(tmp_path / "store"),
                           "--eval-vault", str(tmp_path / "vault")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and json.loads(proc.stdout) == {"imported": 1, "golden_clips": 1}, proc.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"asset_id": "x", "first_frame": 0}\n')
    proc = subprocess.run([cli, "golden", "import", str(bad), "--store", str(tmp_path / "store"),
                           "--eval-vault", str(tmp_path / "vault")], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "bad.jsonl:1" in proc.stderr and "last_frame" in proc.stderr

    # offline: the placeholder judge scores the golden clip against its reference, not the sample
    summary = materialize_bucket(load_settings(env={}, overrides=base), instance, select=["caption_qc"],
                                 log=lambda _: None)
    assert summary.ok, summary.render()
    rows = vault.read("caption_qc")
    gold = rows[rows.kind == "golden"].iloc[0]
    # (the rule-based placeholder captioner cannot name a phone or a man: its words rarely meet the reference)
    assert gold.status == "ok" and 0.0 <= gold.score <= 1.0 and gold.reference == REFERENCE and gold.caption
    assert gold.judge_version == "caption-judge-rules-v1-placeholder"
    sample = rows[rows.kind == "sample"]
    assert len(sample) > 0 and (sample.status == "skipped").all() and sample.reason.str.contains("placeholder").all()
    store = TableStore(open_object_store(str(tmp_path / "store")))
    assert not set(sample.item_id) - set(store.read_all("selection").query("decision == 'pass'").clip_id)

    # a judge endpoint of another family grades every row from the frames (and the golden reference)
    server = JudgeServer()
    try:
        judged = {**base, "caption_qc.judge": {"endpoint": server.endpoint, "model": "llava-judge-7b"}}
        assert materialize_bucket(load_settings(env={}, overrides=judged), instance, select=["caption_qc"],
                                  log=lambda _: None).ok
        rows = vault.read("caption_qc")
        now = rows[rows.judge_version.str.startswith("caption-judge-vlm-llava-judge-7b")]
        assert (now.status == "ok").all() and (now.score == 0.75).all() and set(now.kind) == {"golden", "sample"}
        assert len(rows[rows.judge_version == "caption-judge-rules-v1-placeholder"]) == len(now)  # kept beside
        asks = [r["body"] for r in server.requests if r["body"]["response_format"]["json_schema"]["name"] == "caption_judge"]
        assert len(asks) == len(now)
        parts = [p for ask in asks for p in ask["messages"][1]["content"]]
        assert any(p["type"] in ("image_url", "video_url") for p in parts)
        assert sum(REFERENCE in p.get("text", "") for p in parts) == 1  # only the golden clip has a reference
        # unchanged captioner, judge and inputs: nothing is judged again
        before = len(server.requests)
        assert materialize_bucket(load_settings(env={}, overrides=judged), instance, select=["caption_qc"],
                                  log=lambda _: None).ok
        assert len(server.requests) == before
        from vidassets.report import caption_qc_section

        page = caption_qc_section(vault)
        assert "caption-judge-rules-v1-placeholder" in page and "0.75" in page
    finally:
        server.close()


def test_the_placeholder_judge_scores_content_words_against_the_reference() -> None:
    from vidassets.derive.caption_judge import RuleBasedJudge

    judge = RuleBasedJudge()
    assert judge.judge(REFERENCE, [], [], REFERENCE).score == 1.0
    assert judge.judge("Cyclists race down a dirt hill.", [], [], REFERENCE).score == 0.0
    partial = judge.judge("A man sits in a car.", [], [], REFERENCE)
    assert 0.0 < partial.score < 1.0 and partial.status == "ok"
    assert judge.judge("A man sits in a car.", [], [], None).status == "skipped"


def test_the_judge_must_be_of_another_family_than_the_captioner(tmp_path: Path) -> None:
    vlm = {"endpoint": "http://vlm:8000/v1", "model": "Qwen/Qwen2.5-VL-7B-Instruct"}
    with pytest.raises(ConfigError, match="caption_qc.judge.model"):
        load_settings(env={}, overrides={"annotations.captions": "vlm", "annotations.vlm": vlm,
                                         "caption_qc.judge": {**vlm, "model": "Qwen/Qwen2.5-VL-72B-Instruct"}})
    load_settings(env={}, overrides={"annotations.captions": "vlm", "annotations.vlm": vlm,
                                     "caption_qc.judge": {**vlm, "model": "OpenGVLab/InternVL3-78B"}})


def _all_pass(tmp_path: Path) -> Path:
    from vidassets.curate.selection import load_recipe

    recipe = load_recipe().model_dump()
    recipe.update(score_rules=[], perceptual_dedup={"enabled": False}, semantic_dedup={"enabled": False})
    path = tmp_path / "all.yaml"
    path.write_text(json.dumps(recipe))
    return path
