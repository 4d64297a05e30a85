"""The caption token-distribution check (no Dagster): the captions one captioner version wrote for
each drop (a cohort) are profiled — mojibake, language shares (``langid``), word counts — and a
cohort whose text is garbled or whose language mix jumps away from the version's typical drop
(the per-language median over the version's drops) fails, named, before its captions reach a
snapshot. The profiles are also the per-version length
and language monitors the report shows."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from vidassets.derive.labels import current_captions

# U+FFFD, C0/C1 control characters, and the marks UTF-8 read as Latin-1/cp1252 leaves behind
MOJIBAKE = re.compile(r"[\ufffd\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]|Ã[\x80-\xbf©¨¤¶§¼½¾±³²¹ºª«»¢£¥¦¯°´µ·¸¿]|â€|Â[\xa0-\xbf]")


def language(text: str) -> str:
    import langid

    return langid.classify(text)[0]


def profile(texts: Iterable[str]) -> dict[str, Any]:
    """Captions, share with mojibake, share per detected language, mean and 95th-percentile words."""
    texts = [t for t in texts if isinstance(t, str) and t.strip()]
    if not texts:
        return {"captions": 0, "mojibake_share": 0.0, "languages": {}, "mean_words": 0.0, "p95_words": 0}
    words = pd.Series([len(t.split()) for t in texts])
    langs = Counter(language(t) for t in texts)
    return {"captions": len(texts), "mojibake_share": round(sum(bool(MOJIBAKE.search(t)) for t in texts) / len(texts), 4),
            "languages": {k: round(v / len(texts), 4) for k, v in sorted(langs.items())},
            "mean_words": round(float(words.mean()), 2), "p95_words": int(words.quantile(0.95))}


def caption_texts_by_drop(annotations: pd.DataFrame, version: str) -> dict[str, list[str]]:
    """Every usable caption text (all levels) of ``version``, per drop."""
    out: dict[str, list[str]] = {}
    if not len(annotations):
        return out
    rows = current_captions(annotations, version)
    rows = rows[rows.value.notna()]
    for r in rows.itertuples():
        levels = json.loads(r.levels) if getattr(r, "levels", None) else {}
        for level, text in json.loads(r.value).items():
            if isinstance(text, str) and (not levels or str(levels.get(level, "ok")).startswith("ok")):
                out.setdefault(r.source_shard, []).append(text)
    return out


def check(by_drop: Mapping[str, list[str]], max_mojibake: float, max_language_jump: float,
          min_captions: int) -> dict[str, Any]:
    """Each drop's profile, and the drops that fail: mojibake above ``max_mojibake``, or a language
    whose share differs by more than ``max_language_jump`` from the version's typical drop (per
    language, the median share over its drops with at least ``min_captions`` captions: a minority of
    bad drops cannot move it). Language shares are compared once three such drops exist."""
    profiles = {drop: profile(texts) for drop, texts in sorted(by_drop.items())}
    judged = {d: p for d, p in profiles.items() if p["captions"] >= min_captions}
    languages = sorted({lang for p in judged.values() for lang in p["languages"]})
    typical = {lang: float(pd.Series([p["languages"].get(lang, 0.0) for p in judged.values()]).median())
               for lang in languages} if len(judged) >= 3 else {}
    failed: dict[str, list[str]] = {}
    for drop, p in profiles.items():
        problems = []
        if p["captions"] and p["mojibake_share"] > max_mojibake:
            problems.append(f"{p['mojibake_share']:.1%} of captions garbled (mojibake / control characters)")
        if drop in judged:
            for lang, usual in typical.items():
                share = p["languages"].get(lang, 0.0)
                if abs(share - usual) > max_language_jump:
                    problems.append(f"language {lang}: {share:.0%} of captions here, {usual:.0%} in the "
                                    "version's typical drop")
        if problems:
            failed[drop] = problems
    return {"profiles": profiles, "typical_languages": typical, "failed": failed}
