"""Run decode-touching media tasks in an isolated worker process.

The worker is a separate Python process started with a scrubbed environment (no cloud
credentials, no tokens), an address-space limit, and a per-task CPU-time limit; the parent adds a
wall-clock watchdog per task. A worker that hangs, crashes, or exceeds a limit is killed and
replaced; the task comes back as a failure with a reason, never as an exception in the caller.

Where bubblewrap runs (``isolation``: ``bwrap``, or ``auto`` when it works on this machine), the
worker runs in a jail: new network, PID, IPC, UTS and cgroup namespaces (no network at all, not
even loopback), every capability dropped, the system directories and Python read-only, a private
/tmp, and of the machine's files only the directories its tasks need: each task's input directory
read-only, its output directory read-write (a task naming a directory the jail lacks restarts the
worker with it bound). A decoder exploit there can read neither the pod's environment nor its
other files, nor open a socket.

Messages cross the pipe in a small framed format (JSON header + raw byte blobs, numpy arrays as
dtype/shape + bytes): the parent never unpickles anything a worker that parsed hostile input sent.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import select
import shutil
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


@functools.cache
def bwrap_works() -> bool:
    """Whether bubblewrap is installed and may create its namespaces here (a container without user
    namespaces or CAP_SYS_ADMIN may forbid it)."""
    found = shutil.which("bwrap")
    if not found:
        return False
    try:
        done = subprocess.run([found, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "--cap-drop", "ALL",
                               "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def resolve_isolation(isolation: str) -> str:
    """``bwrap`` or ``process`` for a setting (``auto``: bwrap where it works); ``bwrap`` asked for
    where it cannot run is a RuntimeError saying why."""
    if isolation == "process":
        return "process"
    if bwrap_works():
        return "bwrap"
    if isolation == "bwrap":
        raise RuntimeError("probe.isolation is bwrap but bubblewrap cannot run here (install Debian's bubblewrap "
                           "package; in a container, allow user namespaces): set probe.isolation: auto or process")
    return "process"


def _system_binds() -> list[str]:
    """bwrap arguments for the read-only system: /usr, the merged-/usr links (or directories), the
    dynamic linker's cache, Python (base install, virtual environment, the vidassets package)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for f in ("/etc/ld.so.cache", "/etc/ld.so.conf"):
        if os.path.exists(f):
            args += ["--ro-bind", f, f]
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../vidassets
    roots = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, package)} | \
        {os.path.realpath(p) for p in sys.path if p and os.path.isdir(p) and "site-packages" in p}
    for root in sorted(r for r in roots if not r.startswith("/usr/")):
        args += ["--ro-bind", root, root]
    return args


def task_dirs(args: Any) -> set[tuple[str, str]]:
    """The directories a task's arguments name: ("ro", the input's directory) for each source spec,
    ("rw", the directory holding ``out_dir`` / ``out_path``: the step's scratch directory)."""
    found: set[tuple[str, str]] = set()

    def walk(x: Any, key: str = "") -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, k)
        elif isinstance(x, list | tuple):
            for v in x:
                walk(v, key)
        elif isinstance(x, str) and key in ("path", "paths"):  # a source spec's file
            found.add(("ro", os.path.dirname(os.path.abspath(x))))
        elif isinstance(x, str) and key in ("out_dir", "out_path"):  # the step's scratch directory: every
            found.add(("rw", os.path.dirname(os.path.abspath(x))))  # later output lands there too

    walk(args)
    return found


def _covered(binds: frozenset[tuple[str, str]], wanted: set[tuple[str, str]]) -> bool:
    def ok(mode: str, path: str) -> bool:
        return any((m == "rw" or mode == "ro") and (path == b or path.startswith(b.rstrip("/") + "/"))
                   for m, b in binds)

    return all(ok(mode, path) for mode, path in wanted)


def jail_command(command: list[str], binds: frozenset[tuple[str, str]], env: dict[str, str]) -> list[str]:
    """``command`` inside a bubblewrap jail holding only the system, Python and ``binds``. Its own
    empty /tmp is mounted first: bwrap mounts in order, so a bind under /tmp (a checkout or virtual
    environment there, a step's scratch directory) stays visible on top of it."""
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", *_system_binds(), "--clearenv"]
    for mode, path in sorted(binds):
        args += ["--ro-bind" if mode == "ro" else "--bind", path, path]
    for key, value in sorted(env.items()):
        args += ["--setenv", key, value]
    return [*args, "--chdir", "/", *command]


class Sandbox:
    """One worker process, reused across tasks and replaced after any failure."""

    tasks_total = 0  # every media task run in this process (decodes included), for metadata checks

    def __init__(self, memory_mb: int = 4096, isolation: str = "auto"):
        self.memory_mb = memory_mb
        self.isolation = resolve_isolation(isolation)
        self._proc: subprocess.Popen | None = None
        self._binds: frozenset[tuple[str, str]] = frozenset()
        self.restarts = 0

    def _start(self) -> subprocess.Popen:
        memory = self.memory_mb * 1024 * 1024

        def limit() -> None:  # runs in the child before exec
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            os.setsid()

        # normalised: a path through a directory the jail does not bind (``bench/../.venv``) is not there
        command, env = [os.path.abspath(sys.executable), "-m", "vidassets.runtime.worker"], clean_environment()
        if self.isolation == "bwrap":
            command, env = jail_command(command, self._binds, env), {"PATH": env.get("PATH", "/usr/bin:/bin")}
        return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                env=env, preexec_fn=limit, close_fds=True)

    def run(self, task: str, args: dict[str, Any], cpu_seconds: float, wall_seconds: float) -> TaskResult:
        started = time.monotonic()
        Sandbox.tasks_total += 1
        if self.isolation == "bwrap":
            wanted = task_dirs(args)
            if not _covered(self._binds, wanted):  # the jail lacks a directory this task needs
                self.close()
                self._binds = self._binds | frozenset(wanted)
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
            code = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return None
        if self.isolation == "bwrap" and code > 128:  # bwrap exits 128 + the signal that killed the worker
            return -(code - 128)
        return code

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
