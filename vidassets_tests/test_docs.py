"""The documentation: the site builds strictly (generated pages, figures from current results, no
broken link, no page outside the navigation), the README stays short and its links resolve, no
hand-typed measured figure hides in the prose, a results file goes stale when the code it measured
changes, and every bench writes a results file."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "docs"))

import gen  # noqa: E402

from vidassets.config import Settings, parse_settings  # noqa: E402

HAND_WRITTEN = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# A measured figure typed by hand: a ratio (3.2x), a duration in ms or with decimals (1.5 s), or a
# rate (120 clips/s). Limits and targets (≤ 10 s, < 2x) and figures filled in from results
# (``{{ figure ... }}``) are not measurements.
MEASURED = re.compile(
    r"(?<![\w.])\d+(?:\.\d+)?\s?(?:[x×](?!\w)|ms\b|CPU-ms\b|(?:clips|videos|frames|items|rows|drops|MB|GB|MiB|GiB|samples|it)/s\b)"
    r"|(?<![\w.])\d+\.\d+\s?(?:s|CPU-s|min|h)\b")


def hand_typed_figures(text: str) -> list[tuple[int, str]]:
    found, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        prose = re.sub(r"\{\{.*?\}\}", "", line)
        for match in MEASURED.finditer(prose):
            if not re.search(r"[≤≥<>]\s?$", prose[:match.start()]):
                found.append((number, match.group(0)))
    return found


@pytest.mark.parametrize("text,expected", [
    ("the tick takes 1.12 s at 10^4 drops", ["1.12 s"]),
    ("dedup is 6.2x faster, 40 ms a drop, 120 clips/s", ["6.2x", "40 ms", "120 clips/s"]),
    ("target: ≤ 10 s, under < 2x", []),
    ("{{ figure step_start | figures | load_s }} s to load", []),
    ("```\n3.5 s in a code block\n```", []),
    ("H.264 at 720p, 10^5 drops, x264, 1x1 conv", []),
])
def test_the_figure_lint_finds_measurements(text: str, expected: list[str]) -> None:
    assert [f for _, f in hand_typed_figures(text)] == expected


@pytest.mark.parametrize("page", HAND_WRITTEN, ids=lambda p: p.name)
def test_no_hand_typed_figures(page: Path) -> None:
    found = hand_typed_figures(page.read_text())
    assert not found, (f"{page.relative_to(REPO)} states measured figures by hand (lines {found}): "
                       "read them from bench/results with {{ figure RESULTS | KEY ... }}")


def test_no_hand_typed_figures_in_the_generated_references() -> None:
    """The configuration reference is the settings' docstrings: a figure there needs a results file too."""
    for name, text in (("settings", gen.settings_reference()), ("cli", gen.cli_reference())):
        found = hand_typed_figures(text)
        assert not found, f"the {name} reference states measured figures: {[f for _, f in found]}"


def test_readme_is_short_and_its_links_resolve() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    for target in re.findall(r"\]\(([^)]+)\)", text):
        if target.startswith(("http://", "https://", "#")):
            continue
        assert (REPO / target.split("#")[0]).exists(), f"README links to missing {target}"
    for command in ("make demo", "make test"):
        assert command in text


def _settings_blocks() -> list[tuple[str, dict]]:
    sections = set(Settings.model_fields)
    blocks = []
    for page in HAND_WRITTEN:
        for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S):
            data = yaml.safe_load(block)
            if isinstance(data, dict) and data and set(data) <= sections:
                blocks.append((page.name, data))
    return blocks


def test_every_settings_example_in_the_docs_is_valid() -> None:
    blocks = _settings_blocks()
    assert any(name == "README.md" for name, _ in blocks) and any(name == "configuration.md" for name, _ in blocks)
    for name, data in blocks:
        parse_settings(data, source=name)


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """``mkdocs build --strict``: every generated part and figure filled in (a stale figure fails),
    every page in the navigation, every link and anchor found."""
    site = tmp_path / "site"
    done = subprocess.run([str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "--site-dir", str(site)],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    home = (site / "index.html").read_text()
    assert 'src="images/asset-graph.png"' in home and (site / "images" / "asset-graph.png").exists()
    configuration = (site / "configuration" / "index.html").read_text()
    assert "near_duplicate_index" in configuration and "<!-- generated" not in configuration
    assert "vidassets snapshot" in (site / "cli" / "index.html").read_text()
    assert "{{ figure" not in (site / "scale" / "index.html").read_text()


def test_the_generated_references_follow_the_code() -> None:
    reference = gen.settings_reference()
    for name in Settings.model_fields:
        assert f"`{name}." in reference or f"`{name}`" in reference, name
    assert "| `bucket.uri` |" in reference
    dedup = next(line for line in reference.splitlines() if line.startswith("| `dedup."))
    assert "dedup_groups" in dedup.rsplit("|", 2)[1]  # what a change to the key re-runs
    commands = gen.cli_reference()
    for command in ("materialize", "plan-change", "snapshot create", "lineage sample", "models check"):
        assert f"vidassets {command}" in commands
    concepts = (REPO / "docs" / "concepts.md").read_text()
    assert "<!-- generated: expiry-table -->" in concepts


# -- results files and their staleness ------------------------------------------------------------

def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True,
                          env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}).stdout.strip()


@pytest.fixture
def bench_repo(tmp_path: Path) -> Path:
    """A repository with one bench (importing a bench helper and a vidassets module), committed,
    and a results file measured at that commit."""
    repo = tmp_path / "repo"
    (repo / "bench" / "results").mkdir(parents=True)
    (repo / "vidassets" / "curate").mkdir(parents=True)
    (repo / "vidassets" / "__init__.py").write_text("")
    (repo / "vidassets" / "curate" / "__init__.py").write_text("")
    (repo / "vidassets" / "curate" / "dedup.py").write_text('"""Dedup."""\n\ndef run(x):\n    return x + 1\n')
    (repo / "vidassets" / "other.py").write_text("A = 1\n")
    (repo / "bench" / "common.py").write_text("def write_results(*a):\n    pass\n")
    (repo / "bench" / "dedup.py").write_text(
        '"""Times dedup."""\nfrom common import write_results\nfrom vidassets.curate import dedup\n')
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "a")
    commit = _git(repo, "rev-parse", "--short", "HEAD")
    (repo / "bench" / "results" / "dedup.json").write_text(json.dumps({
        "commit": commit, "date": "2026-12-06", "machine": {"cpu_count": 2}, "command": "python bench/dedup.py",
        "figures": {"update_s": 0.25, "rows": [{"n": 10, "s": 1.5}]}, "verdict": {"fast": {"value": 1.2, "met": True}}}))
    return repo


def _staleness(repo: Path, name: str = "dedup") -> str | None:
    data = json.loads((repo / "bench" / "results" / f"{name}.json").read_text())
    return gen.staleness(data, gen.bench_script(name, data, repo / "bench"), repo)


def test_results_are_current_until_the_measured_code_changes(bench_repo: Path) -> None:
    assert gen.measured_files(bench_repo / "bench" / "dedup.py", bench_repo) == [
        "bench/common.py", "bench/dedup.py", "vidassets/curate/__init__.py", "vidassets/curate/dedup.py"]
    assert _staleness(bench_repo) is None
    assert gen.figure("dedup | figures | update_s", bench_repo) == "[0.25](benchmarks.md#dedup)"
    assert gen.figure("dedup | figures | rows | 0 | s", bench_repo) == "[1.5](benchmarks.md#dedup)"

    (bench_repo / "vidassets" / "other.py").write_text("A = 2\n")  # not imported by the bench
    (bench_repo / "vidassets" / "curate" / "dedup.py").write_text(
        '"""Dedup, with its words edited."""\n\ndef run(x):\n    # a comment\n    return x + 1\n')
    _git(bench_repo, "commit", "-qam", "words")
    assert _staleness(bench_repo) is None

    (bench_repo / "vidassets" / "curate" / "dedup.py").write_text('"""Dedup."""\n\ndef run(x):\n    return x + 2\n')
    _git(bench_repo, "commit", "-qam", "code")
    assert _staleness(bench_repo) == f"changed since {json.loads((bench_repo / 'bench/results/dedup.json').read_text())['commit']}: vidassets/curate/dedup.py"
    with pytest.raises(ValueError, match="stale"):
        gen.figure("dedup | figures | update_s", bench_repo)
    page = gen.benchmarks_page(bench_repo)
    assert "**Stale**" in page and "python bench/dedup.py" in page and "0.25" not in page


def test_a_bench_names_the_modules_it_reaches_through_a_runner(bench_repo: Path) -> None:
    (bench_repo / "bench" / "dedup.py").write_text((bench_repo / "bench" / "dedup.py").read_text()
                                                    + 'MEASURES = ("vidassets.other",)\n')
    assert "vidassets/other.py" in gen.measured_files(bench_repo / "bench" / "dedup.py", bench_repo)


def test_a_helper_change_stales_the_benches_that_use_what_changed(bench_repo: Path) -> None:
    """A bench helper counts by what a bench uses of it (and what that reaches): a function another
    bench uses changes without staling this one."""
    (bench_repo / "bench" / "common.py").write_text("def write_results(*a):\n    return _shared()\n\n\n"
                                                      "def _shared():\n    pass\n")
    (bench_repo / "bench" / "other.py").write_text("import common as c\nc.write_results()\n")
    _git(bench_repo, "add", "-A")
    _git(bench_repo, "commit", "-qm", "helper grows")
    assert "bench/common.py" in _staleness(bench_repo)  # write_results itself changed
    (bench_repo / "bench" / "results" / "dedup.json").write_text(json.dumps({
        **json.loads((bench_repo / "bench" / "results" / "dedup.json").read_text()),
        "commit": _git(bench_repo, "rev-parse", "--short", "HEAD")}))
    assert gen.helper_names(bench_repo / "bench" / "other.py") == {"bench/common.py": {"write_results"}}
    source = (bench_repo / "bench" / "common.py").read_text()
    (bench_repo / "bench" / "common.py").write_text(source + "\n\ndef unused_here():\n    return 2\n")
    _git(bench_repo, "commit", "-qam", "another helper")
    assert _staleness(bench_repo) is None
    (bench_repo / "bench" / "common.py").write_text(source.replace("pass", "return 3") + "\n\ndef unused_here():\n    return 2\n")
    _git(bench_repo, "commit", "-qam", "what write_results reaches")
    assert "bench/common.py" in _staleness(bench_repo)


def test_a_helper_change_stales_its_benches(bench_repo: Path) -> None:
    (bench_repo / "bench" / "common.py").write_text("def write_results(*a):\n    return 1\n")
    _git(bench_repo, "commit", "-qam", "helper")
    assert "bench/common.py" in _staleness(bench_repo)


@pytest.mark.parametrize("edit,reason", [
    (lambda d: d.pop("machine"), "lacks machine"),
    (lambda d: d.update(commit="0123456"), "not in this history"),
    (lambda d: d.update(commit=d["commit"] + "-dirty"), None),
])
def test_a_results_file_without_provenance_is_stale(bench_repo: Path, edit, reason: str | None) -> None:
    path = bench_repo / "bench" / "results" / "dedup.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    stale = _staleness(bench_repo)
    assert (stale is None) if reason is None else (reason in stale)


def test_a_verdict_reads_whether_its_target_was_met(bench_repo: Path) -> None:
    assert gen.verdict("dedup | fast", bench_repo) == "met"
    path = bench_repo / "bench" / "results" / "dedup.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "verdict": {"fast": {"value": 2, "met": False}}}))
    assert gen.verdict("dedup | fast", bench_repo) == "**not met**"
    with pytest.raises(KeyError):
        gen.verdict("dedup | slow", bench_repo)


def test_a_missing_figure_fails(bench_repo: Path) -> None:
    with pytest.raises(KeyError):
        gen.figure("nothing | figures | x", bench_repo)
    with pytest.raises(KeyError):
        gen.figure("dedup | figures | not_there", bench_repo)


def test_every_bench_writes_a_results_file_with_provenance() -> None:
    for script in sorted((REPO / "bench").glob("*.py")):
        if script.name == "common.py":
            continue
        source = script.read_text()
        writes = "write_results(" in source or "provenance(" in source or all(
            f'"{key}"' in source for key in gen.REQUIRED)
        assert writes, f"{script.name} writes no results file with {', '.join(gen.REQUIRED)}"


def test_make_bench_runs_existing_benches() -> None:
    scripts = gen.make_bench_scripts()
    assert scripts and all((REPO / "bench" / s).exists() for s in scripts)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_every_results_file_names_its_bench() -> None:
    for result in gen.results():
        assert result.script is not None, f"bench/results/{result.name}.json: no bench script writes it"
