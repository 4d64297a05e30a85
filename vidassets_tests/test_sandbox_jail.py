"""The decode workers' bubblewrap jail (Debian's bubblewrap, installed by .ci/run and the image): what a
decoder exploit could do from inside it, tried for real, beside the plain-process worker that can."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from vidassets.config import ProbeSettings
from vidassets.runtime import tasks
from vidassets.runtime.sandbox import Sandbox, bwrap_works, clean_environment, jail_command, resolve_isolation
from vidassets_tests.conftest import SAMPLE_CACHE

pytestmark = pytest.mark.skipif(not bwrap_works(), reason="bubblewrap cannot run on this machine")

PROBE = """
import json, os, socket, sys
out = {}
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3).close(); out["socket"] = "connected"
except OSError as exc:
    out["socket"] = type(exc).__name__
for name, path in (("secret_file", sys.argv[2]), ("input", sys.argv[3]), ("parent_environ", f"/proc/{sys.argv[5]}/environ")):
    try:
        out[name] = open(path, "rb").read(64).decode("latin-1")
    except OSError as exc:
        out[name] = type(exc).__name__
try:
    open(os.path.join(sys.argv[4], "written"), "w").write("x"); out["scratch"] = "written"
except OSError as exc:
    out["scratch"] = type(exc).__name__
try:
    open(os.path.join(os.path.dirname(sys.argv[3]), "planted"), "w").write("x"); out["input_dir"] = "written"
except OSError as exc:
    out["input_dir"] = type(exc).__name__
out["secret_env"] = os.environ.get("VIDASSETS_TEST_SECRET")
print(json.dumps(out))
"""


@pytest.fixture()
def world(tmp_path: Path, monkeypatch):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    threading.Thread(target=lambda: [server.accept()[0].close() for _ in range(4)], daemon=True).start()
    secret = tmp_path / "outside" / "credentials"
    secret.parent.mkdir()
    secret.write_text("aws_secret_access_key=hunter2")
    inputs, scratch = tmp_path / "input", tmp_path / "scratch"
    inputs.mkdir()
    scratch.mkdir()
    (inputs / "video.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 not really a video")
    monkeypatch.setenv("VIDASSETS_TEST_SECRET", "hunter2")
    yield server.getsockname()[1], secret, inputs / "video.mp4", scratch
    server.close()


def _run(command: list[str], env: dict[str, str]) -> dict:
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_jailed_worker_reaches_no_socket_no_other_file_and_no_secret(world) -> None:
    port, secret, video, scratch = world
    argv = ["-c", PROBE, str(port), str(secret), str(video), str(scratch), str(os.getpid())]
    binds = frozenset({("ro", str(video.parent)), ("rw", str(scratch))})
    jailed = _run(jail_command([sys.executable, *argv], binds, clean_environment()), {"PATH": os.environ["PATH"]})
    assert jailed["socket"] != "connected"  # no network namespace route: not even loopback
    assert jailed["secret_file"] == "FileNotFoundError" and jailed["parent_environ"] == "FileNotFoundError"
    assert jailed["input"].startswith("\x00\x00\x00\x18ftyp") and jailed["scratch"] == "written"
    assert jailed["input_dir"] == "OSError" or jailed["input_dir"].endswith("Error")  # read-only
    assert jailed["secret_env"] is None
    # the same code as a plain process (probe.isolation: process) does reach them: what the jail adds
    plain = _run([sys.executable, *argv], {**clean_environment(), "VIDASSETS_TEST_SECRET": "hunter2"})
    assert plain["socket"] == "connected" and plain["secret_file"].startswith("aws_secret")


def test_the_worker_decodes_in_the_jail_and_a_hostile_input_is_a_failure_with_a_reason(world, tmp_path: Path) -> None:
    _, _, hostile, _ = world
    real = {"path": str(SAMPLE_CACHE / "bikes.mp4"), "offset": None, "size": None, "media_type": "video"}
    with Sandbox(4096, "bwrap") as sandbox:
        assert sandbox.isolation == "bwrap"
        facts = tasks.probe(sandbox, real, ProbeSettings().model_dump(), 1_000_000)
        assert facts["status"] == "ok" and facts["codec"] == "h264" and facts["frames_decoded"] >= 1
        bad = tasks.probe(sandbox, {**real, "path": str(hostile)}, ProbeSettings().model_dump(), 100)
        assert bad["status"] == "quarantined" and bad["reason"]  # a row with a reason, never an exception
        assert ("ro", str(hostile.parent)) in sandbox._binds and ("ro", str(SAMPLE_CACHE)) in sandbox._binds


def test_the_jailed_worker_starts_when_python_was_named_through_an_unbound_directory(monkeypatch, tmp_path: Path) -> None:
    """``python`` started as ``bench/../.venv/bin/python`` (running a script from a subdirectory): the
    jail binds the interpreter's directories, not ``bench/``, so the worker is started by the
    normalised path (it once died at exec and every video of the run was quarantined)."""
    detour = tmp_path / "detour"
    detour.mkdir()
    python = os.path.abspath(sys.executable)
    monkeypatch.setattr(sys, "executable", f"{detour}/{'../' * (len(detour.parts) - 1)}{python[1:]}")
    assert os.path.exists(sys.executable) and os.path.abspath(sys.executable) == python
    real = {"path": str(SAMPLE_CACHE / "bikes.mp4"), "offset": None, "size": None, "media_type": "video"}
    with Sandbox(4096, "bwrap") as sandbox:
        assert tasks.probe(sandbox, real, ProbeSettings().model_dump(), 1_000_000)["status"] == "ok"


def test_bwrap_asked_for_where_it_cannot_run_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # no bwrap on the PATH: what a machine without the package sees
    bwrap_works.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="probe.isolation"):
            resolve_isolation("bwrap")
        assert resolve_isolation("auto") == "process" and resolve_isolation("process") == "process"
    finally:
        bwrap_works.cache_clear()


def test_the_jailed_worker_starts_when_vidassets_lives_under_tmp(tmp_path: Path) -> None:
    """The package (or the virtual environment) under /tmp, as in a git worktree or a scratch checkout
    there: the jail's own empty /tmp must not hide it (it once did, and every probe of a run failed
    with 'worker died (exit code 1)')."""
    import shutil

    package = Path(__file__).resolve().parents[1] / "vidassets"
    shutil.copytree(package, tmp_path / "checkout" / "vidassets", ignore=shutil.ignore_patterns("__pycache__"))
    script = (
        "import json, vidassets\n"
        "from vidassets.config import ProbeSettings\n"
        "from vidassets.runtime import tasks\n"
        "from vidassets.runtime.sandbox import Sandbox\n"
        f"real = {{'path': {str(SAMPLE_CACHE / 'bikes.mp4')!r}, 'offset': None, 'size': None, 'media_type': 'video'}}\n"
        "with Sandbox(4096, 'bwrap') as sandbox:\n"
        "    facts = tasks.probe(sandbox, real, ProbeSettings().model_dump(), 1_000_000)\n"
        "print(json.dumps({'package': vidassets.__file__, 'status': facts['status'], 'reason': facts.get('reason')}))\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "checkout")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["package"].startswith(str(tmp_path)) and str(tmp_path).startswith("/tmp/")
    assert found["status"] == "ok", found["reason"]
