"""The generated parts of the docs: the configuration reference (from the pydantic settings), the
CLI reference (from the argument parser), the expiry table (from the catalog) and the benchmarks
page (from ``bench/results/*.json``, each checked against the commits since it was measured).

Pages ask for a part with a marker on a line of its own (``<!-- generated: NAME -->``) and for one
measured figure inline with ``{{ figure RESULTS | KEY | KEY ... }}`` (the path inside
``bench/results/RESULTS.json``) and for whether a target was met with ``{{ verdict RESULTS | TARGET }}``;
``hooks.py`` fills them in at ``mkdocs build``. A figure or verdict whose results are stale (or
missing) fails the build.
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import os
import re
import subprocess
import sys
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
RESULTS = BENCH / "results"
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.M)
FIGURE = re.compile(r"\{\{\s*figure\s+([^}]+?)\s*\}\}")
VERDICT = re.compile(r"\{\{\s*verdict\s+([^}]+?)\s*\}\}")
REQUIRED = ("commit", "date", "machine", "command", "figures")


# -- configuration reference ----------------------------------------------------------------------
def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a!r}`" for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The settings section an annotation holds (``X``, ``X | None``), if any."""
    for a in (annotation, *typing.get_args(annotation)):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def _default(field: Any) -> str:
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(section)"
    text = json.dumps(value, default=str)
    return f"`{text}`" if len(text) <= 60 else f"`{text[:57]}...`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


@functools.cache
def _expiry() -> dict[str, tuple[str, ...]]:
    """Settings leaf (dotted path) -> the assets whose code version it changes, in graph order."""
    from vidassets import catalog
    from vidassets.config import Settings
    from vidassets.versions import Versions, expiry_closure, settings_leaves

    settings = Settings()
    versions = Versions(settings)
    return {leaf: tuple(n for n in catalog.NAMES if n in expiry_closure(versions, [leaf]))
            for leaf in settings_leaves(settings)}


def _expires(path: str) -> str:
    expiry = _expiry()
    hit = [leaf for leaf in expiry if leaf == path or leaf.startswith(path + ".")]
    if not hit:  # a key inside an optional section that is unset by default: its section's consumers
        parents = [p for p in expiry if path.startswith(p + ".")]
        hit = parents[:1]
    assets: list[str] = []
    for leaf in hit:
        assets += [a for a in expiry[leaf] if a not in assets]
    return ", ".join(assets) if assets else "nothing"


@functools.cache
def _attribute_docs(module_file: str) -> dict[tuple[str, str], str]:
    """(class, field) -> the docstring written under the field in its class body."""
    tree = ast.parse(Path(module_file).read_text())
    docs = {}
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for field, doc in zip(cls.body, cls.body[1:], strict=False):
            if (isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name) and isinstance(doc, ast.Expr)
                    and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)):
                docs[(cls.name, field.target.id)] = doc.value.value
    return docs


def _description(model: type[BaseModel], name: str) -> str:
    for cls in model.__mro__:
        module = sys.modules.get(getattr(cls, "__module__", ""))
        if module is not None and getattr(module, "__file__", None):
            doc = _attribute_docs(module.__file__).get((cls.__name__, name))
            if doc:
                return _cell(doc)
    return _cell(model.model_fields[name].description or "")


def _rows(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, str, str, str, str]]:
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        section = _model_in(field.annotation)
        if section is not None and field.get_default(call_default_factory=True) is not None:
            yield from _rows(section, path + ".")
            continue
        yield (path, _type_name(field.annotation), _default(field), _description(model, name), _expires(path))
        if section is not None:  # optional section, unset by default: its keys when set
            yield from _rows(section, path + ".")


def settings_reference() -> str:
    """One table per settings section: key, type, default, description, what a change expires."""
    from vidassets.config import Settings

    out = []
    for name, field in Settings.model_fields.items():
        section = _model_in(field.annotation)
        if section is None:
            rows = [(name, _type_name(field.annotation), _default(field), _description(Settings, name),
                     _expires(name))]
        else:
            rows = list(_rows(section, name + "."))
        doc = _cell(section.__doc__ or "") if section is not None and section.__doc__ else ""
        out += [f"### `{name}`", "", *([doc, ""] if doc else []),
                "| key | type | default | description | a change re-runs |", "|---|---|---|---|---|"]
        out += [f"| `{p}` | {t} | {d} | {desc} | {e} |" for p, t, d, desc, e in rows]
        out.append("")
    return "\n".join(out)


def expiry_table() -> str:
    from vidassets.versions import expiry_table as table

    return table()


# -- CLI reference ----------------------------------------------------------------------------------
def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:  # noqa: SLF001 - argparse exposes subcommands no other way
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def cli_reference() -> str:
    """Every command's ``--help``, from the parser ``vidassets`` runs."""
    from vidassets.cli import build_parser

    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: the same page on every machine
    try:
        out = []
        for path, parser in _commands(build_parser(), ("vidassets",)):
            out += [f"{'#' * min(2 + len(path) - 1, 4)} `{' '.join(path)}`", "", "```text",
                    parser.format_help().rstrip(), "```", ""]
        return "\n".join(out)
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before


# -- benchmarks -------------------------------------------------------------------------------------
@dataclass
class Result:
    """One results file and whether its figures still describe the code."""

    name: str
    data: dict
    script: Path | None
    stale: str | None  # why the figures are not current (None: current)

    @property
    def verdicts(self) -> list[tuple[str, Any, Any, Any]]:
        """(figure, value, target, met) of each stated target."""
        out = []
        verdict = self.data.get("verdict") if isinstance(self.data, dict) else None
        for name, v in (verdict.items() if isinstance(verdict, dict) else []):
            if isinstance(v, dict):
                value = next((v[k] for k in ("value", "ratio", "measured") if k in v), "")
                out.append((name, value, v.get("target", ""), v.get("met")))
            else:
                out.append((name, "", "", v))
        return out


def git(*args: str, repo: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def bench_script(name: str, data: dict, bench: Path = BENCH) -> Path | None:
    """The bench that wrote ``name``.json: the script its command names, else the longest bench
    name the results name starts with (``scores_text_heavy`` -> ``scores.py``)."""
    command = data.get("command") if isinstance(data, dict) else None
    for word in (command.split() if isinstance(command, str) else []):
        if word.endswith(".py") and (bench / Path(word).name).exists():
            return bench / Path(word).name
    found = [p for p in bench.glob("*.py") if name == p.stem or name.startswith(p.stem + "_")]
    return max(found, key=lambda p: len(p.stem)) if found else None


def measured_files(script: Path, repo: Path = REPO) -> list[str]:
    """The bench itself, the bench helpers it imports and the vidassets modules it imports or names
    in a module-level ``MEASURES`` tuple (the code its figures describe, where a bench reaches it
    through a runner), as paths relative to ``repo``."""
    tree = ast.parse(script.read_text())
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
            modules |= {f"{node.module}.{a.name}" for a in node.names}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "MEASURES" for t in node.targets):
            modules |= set(ast.literal_eval(node.value))
    files = {script.relative_to(repo).as_posix()}
    for module in modules:
        parts = module.split(".")
        if parts[0] == "vidassets":
            base = repo.joinpath(*parts)
            for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                if candidate.exists():
                    files.add(candidate.relative_to(repo).as_posix())
                    break
        elif len(parts) == 1 and (script.parent / f"{module}.py").exists():
            files.add((script.parent / f"{module}.py").relative_to(repo).as_posix())
    return sorted(files)


def staleness(data: Any, script: Path | None, repo: Path = REPO) -> str | None:
    """Why figures measured as ``data`` says no longer describe ``repo``'s HEAD (None: they do)."""
    if not isinstance(data, dict):
        return "not a results object (no commit, machine or command)"
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        return f"results file lacks {', '.join(missing)}"
    if script is None:
        return "no bench script writes it"
    commit = re.split(r"[+-]dirty", str(data["commit"]))[0]
    try:
        git("cat-file", "-e", f"{commit}^{{commit}}", repo=repo)
    except subprocess.CalledProcessError:
        return f"measured commit {commit} is not in this history"
    used = helper_names(script)
    changed = [f for f in git("diff", "--name-only", commit, "HEAD", "--", *measured_files(script, repo),
                              repo=repo).split()
               if f and _code_changed(f, commit, repo, used.get(f) if f.startswith("bench/") else None)]
    return f"changed since {commit}: {', '.join(changed)}" if changed else None


def helper_names(script: Path) -> dict[str, set[str]]:
    """Per bench helper module a bench imports (``bench/<name>.py``), the names it uses of it:
    ``from automation import history`` and ``import automation as scale`` ... ``scale.clone``."""
    tree = ast.parse(script.read_text())
    siblings = {p.stem for p in script.parent.glob("*.py")} - {script.stem}
    used: dict[str, set[str]] = {}
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in siblings and node.level == 0:
            used.setdefault(node.module, set()).update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in siblings:
                    aliases[a.asname or a.name] = a.name
                    used.setdefault(a.name, set())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            used[aliases[node.value.id]].add(node.attr)
    return {f"bench/{module}.py": names for module, names in used.items()}


def _used_code(tree: ast.Module, names: set[str]) -> ast.Module:
    """The top-level definitions ``names`` reach (what they reference of the module's other top-level
    names, transitively) and the imported names those use, in source order."""
    defined: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        defined[name.id] = node
    reached, todo = set(), [n for n in names if n in defined]
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        reached.add(name)
        todo += [n.id for n in ast.walk(defined[name]) if isinstance(n, ast.Name) and n.id in defined]
    keep = {id(defined[n]) for n in reached}
    referenced = {n.id for name in reached for n in ast.walk(defined[name]) if isinstance(n, ast.Name)}
    body = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):  # only the imported names the kept code uses
            aliases = [a for a in node.names if (a.asname or a.name.split(".")[0]) in referenced]
            if aliases:
                body.append(ast.ImportFrom(node.module, aliases, node.level) if isinstance(node, ast.ImportFrom)
                            else ast.Import(aliases))
        elif id(node) in keep:
            body.append(node)
    return ast.Module(body=body, type_ignores=[])


def _code(source: str, names: set[str] | None = None) -> str | None:
    """A module's code without its comments and docstrings (None: it does not parse); with
    ``names``, only what those top-level names reach."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    if names is not None:
        tree = _used_code(tree, names)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
        if isinstance(node, ast.ClassDef):  # attribute docstrings (a string under a field)
            node.body = [b for b in node.body if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)
                                                      and isinstance(b.value.value, str))] or [ast.Pass()]
    return ast.dump(tree)


def _code_changed(path: str, commit: str, repo: Path, names: set[str] | None = None) -> bool:
    """Whether ``path`` changed since ``commit`` in more than its comments and docstrings (an edit to
    the words does not change what a bench measured); for a bench helper, in what the bench uses of
    it (``names``)."""
    if not path.endswith(".py") or not (repo / path).exists():
        return True
    try:
        before = git("show", f"{commit}:{path}", repo=repo)
    except subprocess.CalledProcessError:
        return True
    old, new = _code(before, names), _code((repo / path).read_text(), names)
    return old is None or old != new


def results(repo: Path = REPO) -> list[Result]:
    out = []
    for path in sorted((repo / "bench" / "results").glob("*.json")):
        data = json.loads(path.read_text())
        script = bench_script(path.stem, data, repo / "bench")
        out.append(Result(path.stem, data, script, staleness(data, script, repo)))
    return out


def _lead(script: Path | None) -> str:
    doc = ast.get_docstring(ast.parse(script.read_text())) if script else None
    return " ".join(doc.split("\n\n")[0].split()) if doc else ""


def _flat(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _flat(v, f"{prefix}{k} / ")
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        for i, v in enumerate(value):
            yield from _flat(v, f"{prefix}{i} / ")
    else:
        yield prefix.removesuffix(" / "), value


def _machine(data: dict) -> str:
    m = data.get("machine") or {}
    cores = m.get("cpu_count", m.get("cores", "?"))
    gpu = f", {m['gpu']}" if m.get("gpu") else ""
    return f"{cores} cores, {m.get('cpu_model', m.get('cpu', '?'))}{gpu}"


def _met(met: Any) -> str:
    return {True: "met", False: "**not met**"}.get(met, str(met) if met is not None else "")


def make_bench_scripts(repo: Path = REPO) -> list[str]:
    """The benches ``make bench`` runs, from the Makefile's recipe."""
    makefile = (repo / "Makefile").read_text() if (repo / "Makefile").exists() else ""
    recipe = makefile.split("\nbench:", 1)[1].split("\n\n", 1)[0] if "\nbench:" in makefile else ""
    return re.findall(r"bench/(\w+\.py)", recipe)


def benchmarks_page(repo: Path = REPO) -> str:
    """A summary table of every results file, then one section per file: its figures and targets
    when current; when stale, why, and the command that refreshes it (no figures)."""
    found = results(repo)
    in_make = set(make_bench_scripts(repo))
    out = ["| results | bench | `make bench` | measured at | machine | status | targets met |",
           "|---|---|---|---|---|---|---|"]
    for r in found:
        met = [v[3] for v in r.verdicts if isinstance(v[3], bool)]
        score = f"{sum(met)} / {len(met)}" if met else ""
        status = "current" if r.stale is None else "stale"
        at = f"`{r.data.get('commit')}` {str(r.data.get('date', ''))[:10]}" if isinstance(r.data, dict) else ""
        machine = _machine(r.data) if isinstance(r.data, dict) else ""
        made = "yes" if r.script and r.script.name in in_make else ""
        out.append(f"| [{r.name}](#{r.name}) | {r.script.name if r.script else ''} | {made} | {at} | "
                   f"{machine} | {status} | {score if r.stale is None else ''} |")
    for r in found:
        out += ["", f"## {r.name}", ""]
        if r.script:
            out += [_lead(r.script), ""]
        command = r.data.get("command") if isinstance(r.data, dict) else None
        if r.stale is not None:
            out += [f"**Stale** ({_cell(r.stale)}): its figures are not shown. Refresh with "
                    f"`{command or f'python bench/{r.script.name if r.script else r.name}'}`.", ""]
            continue
        out += [f"Measured at `{r.data['commit']}` on {r.data['date']}, {_machine(r.data)}: `{command}`", ""]
        if r.verdicts:
            out += ["| figure | value | target | |", "|---|---|---|---|"]
            out += [f"| {_cell(n)} | {_cell(json.dumps(v) if not isinstance(v, str) else v)} | {t} | {_met(m)} |"
                    for n, v, t, m in r.verdicts]
            out.append("")
        rows = list(_flat(r.data["figures"]))
        out += ["<details><summary>all figures</summary>", "", "| figure | value |", "|---|---|"]
        out += [f"| {_cell(k) or '(value)'} | {_cell(json.dumps(v))[:120]} |" for k, v in rows]
        out += ["", "</details>", ""]
    return "\n".join(out)


def _current(spec: str, repo: Path) -> tuple[str, list[str], dict]:
    """(results name, keys, data) of ``RESULTS | KEY | ...`` when that results file is current."""
    name, *keys = [s.strip() for s in spec.split("|")]
    path = repo / "bench" / "results" / f"{name}.json"
    if not path.exists():
        raise KeyError(f"{spec!r}: no results file bench/results/{name}.json")
    data = json.loads(path.read_text())
    stale = staleness(data, bench_script(name, data, repo / "bench"), repo)
    if stale:
        raise ValueError(f"{spec!r} is stale: {stale}")
    return name, keys, data


def figure(spec: str, repo: Path = REPO) -> str:
    """``RESULTS | KEY | ...``: the value at that path of a current results file (raises otherwise)."""
    name, keys, value = _current(spec, repo)
    for key in keys:
        value = value[int(key)] if isinstance(value, list) else value[key]
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return f"[{text}](benchmarks.md#{name})"


def verdict(spec: str, repo: Path = REPO) -> str:
    """``RESULTS | TARGET``: whether that target of a current results file was met."""
    name, keys, data = _current(spec, repo)
    return "met" if data["verdict"][" | ".join(keys)]["met"] else "**not met**"


def readme(repo: Path = REPO) -> str:
    """The README as the site's home page: its title dropped (the page has its own) and its links
    into ``docs/`` re-rooted at the site (``docs/models.md`` -> ``models.md``); links to other files
    of the repository point at them in the source tree, which a site does not hold, so they become
    code spans."""
    text = (repo / "README.md").read_text().split("\n", 1)[1]
    text = re.sub(r"\]\(docs/", "](", text)
    return re.sub(r"\[([^\]]+)\]\((?!https?://|#)([^)]+)\)",
                  lambda m: m.group(0) if m.group(2).split("#")[0].endswith((".md", ".png")) else f"`{m.group(2)}`",
                  text)


GENERATED = {"readme": readme, "settings-reference": settings_reference, "cli-reference": cli_reference,
             "expiry-table": expiry_table, "benchmarks": benchmarks_page}


def fill(markdown: str) -> str:
    """A page with its markers and figures filled in."""
    markdown = MARKER.sub(lambda m: GENERATED[m.group(1)](), markdown)
    markdown = FIGURE.sub(lambda m: figure(m.group(1)), markdown)
    return VERDICT.sub(lambda m: verdict(m.group(1)), markdown)
