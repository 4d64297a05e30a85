"""Media outputs on real footage: the resolution ladder (every rung from one decode per clip,
retimed to 24 fps, sizes as configured) and the audio path (Big Buck Bunny's AAC track, a source
without audio, and a copy whose audio track was muxed 200 ms late)."""

from __future__ import annotations

import json
import shutil
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from vidassets.curate.selection import load_recipe
from vidassets.media.audio import audio_signals
from vidassets.media.ladder import center_crop, output_ticks, rung_size
from vidassets.storage import TableStore, open_object_store
from vidassets_tests.conftest import graph_settings, run_graph


def shift_audio(src: Path, dst: Path, seconds: float) -> None:
    """Remux ``src`` with its audio packets' timestamps moved ``seconds`` later (no re-encode)."""
    with av.open(str(src)) as inp, av.open(str(dst), "w") as out:
        streams = {s.index: out.add_stream_from_template(s) for s in (inp.streams.video[0], inp.streams.audio[0])}
        audio = inp.streams.audio[0]
        shift = int(round(seconds / float(audio.time_base)))
        for packet in inp.demux(*[inp.streams[i] for i in streams]):
            if packet.dts is None:
                continue
            if packet.stream.index == audio.index:
                packet.pts += shift
                packet.dts += shift
            packet.stream = streams[packet.stream.index]
            out.mux(packet)


@pytest.fixture(scope="module")
def outputs(demo_bucket: Path, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("outputs")
    drop = tmp / "bucket/raw/licensed/drop-0001"
    drop.mkdir(parents=True)
    for name in ("bigbuckbunny.mp4", "bikes.mp4", "_SUCCESS"):
        shutil.copy(demo_bucket / "raw/licensed/drop-0001" / name, drop / name)
    shift_audio(drop / "bigbuckbunny.mp4", drop / "bunny_audio_late.mp4", 0.2)
    recipe = load_recipe().model_dump()
    recipe.update(score_rules=[], perceptual_dedup={"enabled": False}, semantic_dedup={"enabled": False})
    (tmp / "all.yaml").write_text(json.dumps(recipe))
    # the late-audio remux is the same picture as bigbuckbunny.mp4: ingest would take it for a
    # near-duplicate and never cut it into clips, so near-duplicates at ingest are off here
    settings = graph_settings(tmp / "bucket", tmp, **{"selection.recipe": str(tmp / "all.yaml"),
                                                       "near_duplicates.enabled": False})
    summary = run_graph(settings, tmp)
    return {"tmp": tmp, "summary": summary, "settings": settings}


def _tables(tmp: Path) -> TableStore:
    return TableStore(open_object_store(str(tmp / "store")))


def _by_file(tmp: Path, table: str):
    tables = _tables(tmp)
    frame = tables.read_all(table).merge(tables.read_all("clips")[["clip_id", "uri"]], on="clip_id")
    frame["file"] = frame.uri.str.rsplit("/", n=1).str[-1]
    return frame


def test_ladder_rungs_decode_to_the_configured_sizes_and_rate(outputs: dict) -> None:
    tmp = outputs["tmp"]
    ladder = _by_file(tmp, "clip_ladder")
    objects = open_object_store(str(tmp / "store"))
    selected = set(_tables(tmp).read("selection").query("decision == 'pass'").clip_id)
    assert set(ladder.clip_id) == selected and (ladder.status == "ok").all()
    tiers = _tables(tmp).read("selection").set_index("clip_id").tier
    for row in ladder.itertuples():
        expected = {64, 128} | ({144} if tiers[row.clip_id] == "T0" else set())
        assert set(ladder[ladder.clip_id == row.clip_id].short_side) == expected
        path = objects.local_path(row.blob_key)
        with av.open(path) as c:
            vs = c.streams.video[0]
            frames = [f for f in c.decode(vs)]
            assert len(frames) == row.frames and vs.average_rate == Fraction(24)
            assert (frames[0].width, frames[0].height) == (row.width, row.height)
        assert min(row.width, row.height) == row.short_side
        assert row.frames == round(row.duration_s * 24) and row.fps == 24.0 and row.source_fps == 25.0
    bunny = ladder[ladder.file == "bigbuckbunny.mp4"].iloc[0]
    assert bunny.aspect_ratio == "16:9" and json.loads(bunny.crop) == [0, 0, 1280, 720] and not bunny.crop_baked


def test_one_decode_per_clip_for_all_rungs(outputs: dict) -> None:
    summary, tmp = outputs["summary"], outputs["tmp"]
    ladder = _tables(tmp).read_all("clip_ladder")
    clips = ladder.clip_id.nunique()
    assert ladder.groupby("clip_id").frames_decoded.nunique().max() == 1
    stage = summary.stages["clip_ladder"]
    assert stage.extra["frames_decoded"] == ladder.drop_duplicates("clip_id").frames_decoded.sum()
    clip_rows = _tables(tmp).read_all("clips").set_index("clip_id")
    skipped_some = False
    for row in ladder.drop_duplicates("clip_id").itertuples():
        # every source frame a rung shows (one per output frame, or every clip frame when the clip's rate
        # is below the rung's), plus at most the GOP lead-in; non-reference frames no rung shows are skipped
        shown = min(clip_rows.loc[row.clip_id, "num_frames"], ladder[ladder.clip_id == row.clip_id].frames.max())
        assert shown <= row.frames_decoded <= clip_rows.loc[row.clip_id, "last_frame"] + 1
        skipped_some |= row.frames_decoded < clip_rows.loc[row.clip_id, "num_frames"]
    assert skipped_some  # 25-30 fps sources retimed to 24: the dropped non-reference frames were never decoded
    assert clips >= 3


def test_audio_status_loudness_and_sync(outputs: dict) -> None:
    tmp = outputs["tmp"]
    audio = _by_file(tmp, "clip_audio")
    bunny = audio[audio.file == "bigbuckbunny.mp4"]
    assert len(bunny) and (bunny.audio_status == "ok").all(), bunny[["audio_status", "reason"]]
    assert bunny.loudness_dbfs.between(-50, -5).all() and bunny.drift_ms.abs().max() <= 50
    assert (bunny.codec == "libopus").all() and (bunny.rate == 16000).all()
    objects = open_object_store(str(tmp / "store"))
    row = bunny.iloc[0]
    with av.open(objects.local_path(row.blob_key)) as c:
        assert c.streams.audio[0].codec_context.name == "opus"
        assert abs(float(c.duration / 1e6) - row.duration_s) < 0.1
    bikes = audio[audio.file == "bikes.mp4"]
    assert len(bikes) and (bikes.audio_status == "none").all() and bikes.reason.notna().all()
    late = audio[audio.file == "bunny_audio_late.mp4"]
    assert len(late) and (late.audio_status == "unsynced").all()
    assert late.drift_ms.between(170, 260).all()


def test_rerun_reuses_every_rung_and_audio_row(outputs: dict) -> None:
    summary = run_graph(outputs["settings"], outputs["tmp"], select=["clip_ladder", "clip_audio"])
    assert summary.stages["clip_ladder"].extra["rows_computed"] == 0
    assert summary.stages["clip_ladder"].extra["frames_decoded"] == 0
    assert summary.stages["clip_audio"].extra["rows_computed"] == 0


def test_retiming_sizes_crops_and_audio_signals() -> None:
    times = [i / 25 for i in range(50)]  # 2 s at 25 fps
    ticks = output_ticks(times, 0, 49, 24.0)
    assert len(ticks) == 48 and ticks[0] == 0 and ticks[-1] == 48 and len(set(ticks)) == 48  # one frame dropped
    assert len(output_ticks(times, 0, 49, 48.0)) == 96  # frames repeated
    assert rung_size(1280, 720, 512) == (910, 512) and rung_size(640, 272, 720) == (640, 272)
    assert rung_size(720, 1280, 256) == (256, 456)
    assert center_crop(1920, 1080, "1:1") == (420, 0, 1080, 1080) and center_crop(720, 1280, "16:9") == (0, 437, 720, 405)
    rate = 16000
    t = np.arange(rate * 2) / rate
    tone = 0.5 * np.sin(2 * np.pi * 440 * t).astype(np.float32)
    sig = audio_signals(tone, rate)
    assert -10 < sig["loudness_dbfs"] < -8 and sig["silence_share"] == 0 and sig["clipping_share"] == 0
    assert sig["content_guess"] == "music"
    quiet = audio_signals(np.zeros(rate, np.float32), rate)
    assert quiet["silence_share"] == 1.0 and quiet["content_guess"] == "silence"
    clipped = audio_signals(np.clip(tone * 4, -1, 1), rate)
    assert clipped["clipping_share"] > 0.3


def test_rung_choice_by_tier_source_size_and_rate() -> None:
    from vidassets.config import load_settings
    from vidassets.media.clip_outputs import rungs_for

    settings = load_settings(env={})
    names = lambda tier, fps, short: [r["name"] for r in rungs_for(settings.ladder, tier, fps, short)]  # noqa: E731
    assert names("T1", 25, 720) == ["256p24", "512p24", "720p24"]
    assert names("T0", 25, 1080) == ["256p24", "512p24", "720p24", "1080p24"]
    assert names("T0", 25, 720) == ["256p24", "512p24", "720p24"]  # never above the source
    assert names("T2", 50, 720) == ["256p24", "512p24", "720p24", "512p48"]  # fast sources get a 48 fps rung
    assert names("T2", 25, 144) == ["256p24"]  # tiny sources still get the smallest rung (not upscaled)


def test_a_failing_rung_encoder_fails_the_clip_without_hanging(demo_bucket: Path, tmp_path: Path) -> None:
    """Rung encoders run on their own threads: one that cannot start must surface its error (the clip's
    row becomes an error with that reason) instead of blocking the decode that feeds it."""
    from vidassets.media.ladder import ladder_clip

    path = demo_bucket / "raw/licensed/drop-0001/carphone.mp4"
    with av.open(str(path)) as c:
        vs = c.streams.video[0]
        pts = sorted(int(p.pts) for p in c.demux(vs) if p.pts is not None)
        tb = float(vs.time_base)
    times = [(p - pts[0]) * tb for p in pts]
    rungs = [{"name": "64p24", "short_side": 64, "fps": 24.0}, {"name": "128p24", "short_side": 128, "fps": 24.0}]
    with pytest.raises(av.error.ArgumentError, match="preset"):
        ladder_clip({"path": str(path)}, pts, times, 5, len(pts) - 1, 0, rungs, "libx264", 23, "no-such-preset",
                    None, str(tmp_path))
    ok = ladder_clip({"path": str(path)}, pts, times, 5, len(pts) - 1, 90, rungs, "libx264", 23, "ultrafast",
                     None, str(tmp_path))  # the threaded path with rotation (numpy frames)
    assert [(r["width"], r["height"]) for r in ok["rungs"]] == [(64, 78), (128, 156)]
