"""Media tasks as the parent runs them: in the sandbox, with budgets scaled to the file, and with
the retry budget (one retry on the safer single-threaded path, then a recorded failure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vidassets.runtime.sandbox import Sandbox, TaskResult


def wall_budget(limits: Mapping[str, Any], duration_s: float | None, size_bytes: int) -> float:
    """Seconds a task may take: a base plus time proportional to the video's length (or, before
    the length is known, to its size at a pessimistic 2 MB per video second)."""
    seconds = duration_s if duration_s else size_bytes / 2e6
    return float(limits["wall_base_seconds"]) + float(limits["wall_seconds_per_video_second"]) * seconds


def probe(sandbox: Sandbox, spec: dict, limits: Mapping[str, Any], size_bytes: int) -> dict[str, Any]:
    """Facts + verdict. Worker failures and decode failures get one retry in safe mode; then the
    file is quarantined with both reasons, marked ``transient`` when neither failure was the file's
    fault (timeouts, memory, a lost worker) so that a later run tries again."""
    budget = wall_budget(limits, None, size_bytes)
    reasons: list[str] = []
    transient: list[bool] = []
    result: dict[str, Any] = {}
    for runs, safe_mode in enumerate((False, True), start=1):  # noqa: B007 - runs is read after the loop
        task = sandbox.run("probe", {"spec": spec, "limits": dict(limits), "safe_mode": safe_mode},
                           cpu_seconds=budget, wall_seconds=budget)
        if task.ok and (task.value["status"] != "quarantined" or not task.value.get("retryable")):
            result = task.value
            break
        reasons.append(task.value["reason"] if task.ok else (task.error or "worker failed"))
        transient.append(not task.ok and task.transient)
        result = task.value if task.ok else {"frames_decoded": 0}
    else:
        result = {**result, "status": "quarantined", "transient": all(transient),
                  "reason": f"failed twice (normal, then safe single-threaded decode): {reasons[0]} | {reasons[1]}"}
    result.pop("retryable", None)
    result["attempts"] = runs
    return result


def packet_index(sandbox: Sandbox, spec: dict, limits: Mapping[str, Any], facts: Mapping[str, Any]) -> TaskResult:
    budget = wall_budget(limits, facts.get("duration_s"), 0) / 4 + 30
    return sandbox.run("index", {"spec": spec}, cpu_seconds=budget, wall_seconds=budget)


def fingerprint(sandbox: Sandbox, spec: dict, limits: Mapping[str, Any], facts: Mapping[str, Any],
                packets: Mapping[str, list[int]], grid_fps: float, audio: bool,
                max_decode_share: float | None = None) -> TaskResult:
    """The ingest fingerprint (a share of the frames, planned from the packet index), retried once."""
    budget = wall_budget(limits, facts.get("duration_s"), 0)
    args = {"spec": spec, "packets": dict(packets), "grid_fps": grid_fps,
            "rotation": int(facts.get("rotation") or 0), "audio": audio, "max_decode_share": max_decode_share}
    return _run_retrying_once(sandbox, "fingerprint", args, budget)


def analyze(sandbox: Sandbox, spec: dict, limits: Mapping[str, Any], params: Mapping[str, Any],
            facts: Mapping[str, Any]) -> tuple[TaskResult, int]:
    """The analysis pass, retried once single-threaded. Returns (result, attempts)."""
    budget = wall_budget(limits, facts.get("duration_s"), 0)
    threads = int(params["decode_threads"])
    last = TaskResult(False, error="not run")
    for attempt, safe_mode in enumerate((False, True), start=1):
        args = {"spec": spec, "params": {**params, "safe_mode": safe_mode}, "facts": dict(facts)}
        last = sandbox.run("analyze", args, cpu_seconds=budget * (1 if safe_mode else threads), wall_seconds=budget)
        if last.ok and last.value["frames_decoded"] > 0:
            return last, attempt
        if last.ok:
            last = TaskResult(False, error="no frame decoded: " + "; ".join(last.value.get("decode_errors", [])[:3]))
    return last, 2


def read_frames(sandbox: Sandbox, spec: dict, limits: Mapping[str, Any], clip: Mapping[str, Any], frame_pts: list[int],
                indices: list[int], rotation: int, crop: tuple[int, int, int, int] | None,
                size: tuple[int, int] | None, nonref_pts: list[int] | None = None) -> TaskResult:
    """Selected frames of one clip (see ``clip_reader.read_frames``), retried once on failure."""
    budget = wall_budget(limits, float(clip.get("end_s") or 0.0), 0)
    args = {"spec": spec, "frame_pts": frame_pts, "indices": indices, "rotation": rotation,
            "crop": list(crop) if crop else None, "size": list(size) if size else None,
            "nonref_pts": list(nonref_pts or [])}
    return _run_retrying_once(sandbox, "read_frames", args, budget)


def read_sequential_frames(sandbox: Sandbox, spec: dict, limits: Mapping[str, Any], duration_s: float,
                           indices: list[int], crop: tuple[int, int, int, int] | None,
                           size: tuple[int, int] | None) -> TaskResult:
    """Frames of a file vidassets wrote (a ladder rung) by position (see ``clip_reader``), retried once."""
    budget = wall_budget(limits, duration_s, 0)
    args = {"spec": spec, "indices": indices, "crop": list(crop) if crop else None,
            "size": list(size) if size else None}
    return _run_retrying_once(sandbox, "read_sequential_frames", args, budget)


def read_audio(sandbox: Sandbox, spec: dict, limits: Mapping[str, Any], duration_s: float | None,
               rate: int) -> TaskResult:
    """A stored clip-audio file as mono float samples at ``rate`` (see ``audio.read_audio``), with a
    budget scaled to its length, retried once."""
    budget = wall_budget(limits, duration_s, 0)
    return _run_retrying_once(sandbox, "read_audio", {"spec": spec, "rate": rate}, budget)


def _run_retrying_once(sandbox: Sandbox, task: str, args: dict, budget: float) -> TaskResult:
    result = sandbox.run(task, args, cpu_seconds=budget * 2, wall_seconds=budget)
    return result if result.ok else sandbox.run(task, args, cpu_seconds=budget * 2, wall_seconds=budget)
