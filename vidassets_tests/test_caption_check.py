"""The caption token-distribution check: drops of one captioner version whose captions read as the
version's other drops pass; a drop whose captions switched language, and one whose text is
mojibake (UTF-8 read as cp1252), fail and are named."""

from __future__ import annotations

import json

import pandas as pd

from vidassets.derive.caption_check import MOJIBAKE, caption_texts_by_drop, check

ENGLISH = ["A cyclist rides along a dirt track past trees on a bright day.",
           "A man talks on a phone while sitting in a moving car.",
           "Several riders race downhill through a forest as the camera pans to follow them.",
           "A close view of a person speaking, the background passing by the car window.",
           "Bikes jump over a small ramp while spectators watch from the side of the course."]
GERMAN = ["Ein Radfahrer fährt auf einem Feldweg an Bäumen vorbei an einem hellen Tag.",
          "Ein Mann telefoniert, während er in einem fahrenden Auto sitzt.",
          "Mehrere Fahrer rasen durch einen Wald bergab, die Kamera schwenkt mit ihnen.",
          "Eine Nahaufnahme einer sprechenden Person, der Hintergrund zieht am Fenster vorbei.",
          "Räder springen über eine kleine Rampe, Zuschauer sehen vom Rand der Strecke zu."]


def _rows(drop: str, texts: list[str], version: str = "captions-v") -> list[dict]:
    return [{"clip_id": f"{drop}-{i}", "source_shard": drop, "kind": "captions", "producer_version": version,
             "status": "ok", "levels": None,
             "value": json.dumps({"level_0": t.split(",")[0], "level_1": t})} for i, t in enumerate(texts)]


def test_a_drop_that_switched_language_or_garbled_its_text_fails_named() -> None:
    table = pd.DataFrame(_rows("a/drop-1", ENGLISH * 3) + _rows("a/drop-2", ENGLISH[::-1] * 3)
                         + _rows("a/drop-3", GERMAN * 3) + _rows("a/drop-9", GERMAN * 3, version="other"))
    by_drop = caption_texts_by_drop(table, "captions-v")
    assert set(by_drop) == {"a/drop-1", "a/drop-2", "a/drop-3"}  # other versions are not this cohort's
    found = check(by_drop, 0.01, 0.25, 10)
    assert set(found["failed"]) == {"a/drop-3"}, found["failed"]
    assert any("language de" in p for p in found["failed"]["a/drop-3"])
    assert found["profiles"]["a/drop-1"]["languages"].get("en", 0) > 0.8
    garbled = [f"“{t}”".encode().decode("cp1252", errors="replace") for t in ENGLISH * 2]  # curly quotes read wrong
    assert all(MOJIBAKE.search(t) for t in garbled) and not any(MOJIBAKE.search(t) for t in ENGLISH + GERMAN)
    found = check({**by_drop, "a/drop-4": garbled}, 0.01, 0.25, 10)
    assert "a/drop-4" in found["failed"] and "garbled" in found["failed"]["a/drop-4"][0]
    # too few captions to compare languages: no verdict on language, mojibake still judged
    assert check({"a/drop-1": ENGLISH, "a/drop-3": GERMAN[:2]}, 0.01, 0.25, 10)["failed"] == {}
