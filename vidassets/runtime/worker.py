"""Worker process entry point (``python -m vidassets.runtime.worker``), started by ``Sandbox``.

Reads framed task messages on stdin, runs the named media task, writes the framed result on a
private copy of stdout (fd 1 itself is pointed at stderr so stray prints cannot corrupt replies).
"""

from __future__ import annotations

import importlib
import os
import resource
import sys
import traceback

from vidassets.runtime.sandbox import read_message, write_message

TASKS = {
    "probe": "vidassets.media.probe:probe_source",
    "index": "vidassets.media.packet_index:index_source",
    "analyze": "vidassets.media.analysis:analyze_source",
    "fingerprint": "vidassets.media.fingerprint:fingerprint_source",
    "read_clip": "vidassets.media.clip_reader:read_clip_frames",
    "read_frames": "vidassets.media.clip_reader:read_frames",
    "read_sequential_frames": "vidassets.media.clip_reader:read_sequential_frames",
    "ladder": "vidassets.media.ladder:ladder_clip",
    "audio": "vidassets.media.audio:extract_audio",
    "read_audio": "vidassets.media.audio:read_audio",
    "sleep": "vidassets.runtime.worker:_sleep_task",  # used by tests of the watchdog
    "burn": "vidassets.runtime.worker:_burn_task",  # used by tests of the CPU limit
    "environment": "vidassets.runtime.worker:_environment_task",  # used by tests of the scrubbed env
}


def _environment_task() -> dict:
    return {"keys": sorted(os.environ), "address_space_limit": resource.getrlimit(resource.RLIMIT_AS)[0]}


def _sleep_task(seconds: float) -> dict:
    import time

    time.sleep(seconds)
    return {"slept": seconds}


def _burn_task(seconds: float) -> dict:
    x = 0
    while True:
        x += 1


def _resolve(name: str):
    module, _, attr = TASKS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def main() -> None:
    reply_fd = os.dup(1)
    os.dup2(2, 1)
    request_fd = 0
    try:
        import av
        import cv2

        av.logging.set_level(None)
        cv2.setNumThreads(1)  # tiny images: OpenCV's thread pool costs more CPU than it saves
    except Exception:  # noqa: BLE001
        pass
    while True:
        try:
            message = read_message(request_fd)
        except EOFError:
            return
        used = resource.getrusage(resource.RUSAGE_SELF)
        used_cpu = used.ru_utime + used.ru_stime
        budget = float(message.get("cpu_seconds") or 0)
        if budget > 0:
            _, hard = resource.getrlimit(resource.RLIMIT_CPU)
            resource.setrlimit(resource.RLIMIT_CPU, (int(used_cpu + budget) + 1, hard))
        try:
            value = _resolve(message["task"])(**message["args"])
            reply = {"ok": True, "value": value}
        except Exception as exc:  # noqa: BLE001 - reported to the parent as data
            tb = traceback.extract_tb(exc.__traceback__)
            where = f" at {tb[-1].name}:{tb[-1].lineno}" if tb else ""
            reply = {"ok": False, "error": f"{exc.__class__.__name__}: {exc}{where}"}
        write_message(reply_fd, reply)


if __name__ == "__main__":
    sys.exit(main())
