"""Run decode-touching media tasks in an isolated worker process.

The worker is a separate Python process started with a scrubbed environment (no cloud
credentials, no tokens), an address-space limit, and a per-task CPU-time limit; the parent adds a
wall-clock watchdog per task. A worker that hangs, crashes, or exceeds a limit is killed and
replaced; the task comes back as a failure with a reason, never as an exception in the caller.

Messages cross the pipe in a small framed format (JSON header + raw byte blobs, numpy arrays as
dtype/shape + bytes): the parent never unpickles anything a worker that parsed hostile input sent.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

TRANSIENT_ERRORS = ("MemoryError", "TimeoutError", "ConnectionError", "BrokenPipeError")
"""Exceptions raised in the worker that say nothing about the input."""
_HEADER = struct.Struct(">QQ")  # json length, blob section length
_ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "PYTHONPATH", "PYTHONHASHSEED")


@dataclass
class TaskResult:
    ok: bool
    value: Any = None
    error: str | None = None
    seconds: float = 0.0
    transient: bool = False
    """A failure of the run, not of the input (timeout, memory, a worker lost): worth trying again later."""


# ---------------------------------------------------------------- framing (both sides)

def encode_message(obj: Any) -> bytes:
    blobs: list[bytes] = []

    def walk(x: Any) -> Any:
        if isinstance(x, dict):
            return {str(k): walk(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [walk(v) for v in x]
        if isinstance(x, bytes | bytearray | memoryview):
            blobs.append(bytes(x))
            return {"__blob__": len(blobs) - 1}
        if isinstance(x, np.ndarray):
            arr = np.ascontiguousarray(x)
            blobs.append(arr.tobytes())
            return {"__nd__": len(blobs) - 1, "dtype": arr.dtype.str, "shape": list(arr.shape)}
        if isinstance(x, np.generic):
            return x.item()
        if isinstance(x, float) and x != x:
            return {"__nan__": True}
        return x

    header = json.dumps(walk(obj)).encode()
    lengths = struct.pack(f">{len(blobs)}Q", *(len(b) for b in blobs))
    body = struct.pack(">Q", len(blobs)) + lengths + b"".join(blobs)
    return _HEADER.pack(len(header), len(body)) + header + body


def decode_message(header: bytes, body: bytes) -> Any:
    (count,) = struct.unpack_from(">Q", body, 0)
    lengths = struct.unpack_from(f">{count}Q", body, 8)
    blobs, pos = [], 8 + 8 * count
    for n in lengths:
        blobs.append(body[pos : pos + n])
        pos += n

    def walk(x: Any) -> Any:
        if isinstance(x, dict):
            if "__blob__" in x:
                return blobs[x["__blob__"]]
            if "__nd__" in x:
                return np.frombuffer(blobs[x["__nd__"]], dtype=np.dtype(x["dtype"])).reshape(x["shape"]).copy()
            if "__nan__" in x:
                return float("nan")
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        return x

    return walk(json.loads(header))


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_message(fd: int, deadline: float | None = None) -> Any:
    json_len, body_len = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
    header = _read_exact(fd, json_len, deadline)
    body = _read_exact(fd, body_len, deadline)
    return decode_message(header, body)


def write_message(fd: int, obj: Any) -> None:
    data = memoryview(encode_message(obj))
    while data:
        n = os.write(fd, data)
        data = data[n:]


# ---------------------------------------------------------------- parent side

def clean_environment() -> dict[str, str]:
    """The worker's whole environment: an allowlist, so no credential can leak in."""
    env = {k: os.environ[k] for k in _ENV_ALLOW if k in os.environ}
    paths = [p for p in sys.path if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["OMP_NUM_THREADS"] = "1"
    env["HOME"] = "/nonexistent"
    return env


class Sandbox:
    """One worker process, reused across tasks and replaced after any failure."""

    tasks_total = 0  # every media task run in this process (decodes included), for metadata checks

    def __init__(self, memory_mb: int = 4096):
        self.memory_mb = memory_mb
        self._proc: subprocess.Popen | None = None
        self.restarts = 0

    def _start(self) -> subprocess.Popen:
        memory = self.memory_mb * 1024 * 1024

        def limit() -> None:  # runs in the child before exec
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            os.setsid()

        return subprocess.Popen(
            [sys.executable, "-m", "vidassets.runtime.worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=clean_environment(), preexec_fn=limit, close_fds=True,
        )

    def run(self, task: str, args: dict[str, Any], cpu_seconds: float, wall_seconds: float) -> TaskResult:
        started = time.monotonic()
        Sandbox.tasks_total += 1
        if self._proc is None or self._proc.poll() is not None:
            self._proc = self._start()
        proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None
        try:
            write_message(proc.stdin.fileno(), {"task": task, "args": args, "cpu_seconds": cpu_seconds})
            reply = read_message(proc.stdout.fileno(), deadline=started + wall_seconds)
        except TimeoutError:
            self._kill()
            return TaskResult(False, error=f"timed out after {wall_seconds:.0f} s wall clock; worker killed",
                              seconds=time.monotonic() - started, transient=True)
        except (EOFError, BrokenPipeError, OSError):
            code = self._kill()
            # a decoder that crashes on a file crashes on it every time; anything else may pass later
            return TaskResult(False, error=f"worker died ({_describe_exit(code)})", seconds=time.monotonic() - started,
                              transient=code != -signal.SIGSEGV)
        seconds = time.monotonic() - started
        if reply.get("ok"):
            return TaskResult(True, reply.get("value"), seconds=seconds)
        error = reply.get("error") or "unknown worker error"
        return TaskResult(False, error=error, seconds=seconds, transient=error.startswith(TRANSIENT_ERRORS))

    def _kill(self) -> int | None:
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        self.restarts += 1
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            return proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            try:
                proc.stdin.close()  # type: ignore[union-attr]
                proc.wait(timeout=5)
            except Exception:  # noqa: BLE001
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        sig = -code
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        hint = {"SIGXCPU": "CPU-time limit exceeded", "SIGKILL": "killed (memory limit or watchdog)",
                "SIGSEGV": "decoder crashed"}.get(name, "")
        return f"signal {name}{': ' + hint if hint else ''}"
    return f"exit code {code}"
