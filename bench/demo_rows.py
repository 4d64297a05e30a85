"""The rows a demo run writes, as a comparable digest: run the demo into a fresh home and dump every
table (store and eval vault: keys, versions, values), or compare two dumps. A refactor that must not
change outputs is checked by dumping on the commit before and on the commit after.

    python bench/demo_rows.py dump  OUT.json [--home DIR]   # runs `vidassets demo` in DIR (fresh)
    python bench/demo_rows.py compare A.json B.json [--out bench/results/demo_rows.json]
                                                             # exit 1 and name the tables that differ

Columns that hold wall-clock times or per-run counters of work (``seconds``, ``created_at``, …) are
left out: they differ between any two runs. Everything else is compared exactly, row by row, with
rows sorted by their full contents (order within a table is not an output). ``compare --out`` writes
the comparison as a results file: its figures, the verdict (target: no table differs) and the
comparisons written there before, kept under ``earlier_comparisons``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's vidassets (merging a table's deltas)

from vidassets.storage import TableStore, open_object_store  # noqa: E402

TIME_COLUMNS = {"seconds", "created_at", "written_at", "decided_at", "computed_at", "started_at", "finished_at",
                "wall_s", "cpu_s", "elapsed_s", "run_id", "encode_run", "updated_at", "at"}


def _cell(value) -> str:
    if isinstance(value, bytes):
        return "b:" + hashlib.sha256(value).hexdigest()
    if hasattr(value, "tolist"):
        value = value.tolist()
    return json.dumps(value, sort_keys=True, default=str)


def table_rows(path: Path) -> list[str]:
    frame = pd.read_parquet(path)
    keep = [c for c in frame.columns if c not in TIME_COLUMNS]
    frame = frame[keep]
    rows = ["|".join(f"{c}={_cell(v)}" for c, v in zip(keep, row, strict=True)) for row in frame.itertuples(index=False)]
    return sorted(rows)


def dump(home: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for root_name in ("store", "eval_vault"):
        root = home / root_name / "tables"
        for path in sorted(root.rglob("*.parquet")) if root.exists() else []:
            rel = path.relative_to(root).as_posix()
            if "/_delta/" in rel:  # deltas are folded into what readers see: compare the merged table
                continue
            out[f"{root_name}:{rel}"] = table_rows(path)
        for table_dir in sorted(p for p in root.iterdir() if (p / "_delta").is_dir()) if root.exists() else []:
            merged = TableStore(open_object_store(str(home / root_name))).read(table_dir.name)
            tmp = home / f"{table_dir.name}.merged.parquet"
            merged.to_parquet(tmp)
            out[f"{root_name}:{table_dir.name}/_all.parquet"] = table_rows(tmp)
            tmp.unlink()
    return out


def _without_times(row: str, aside: frozenset[str] = frozenset()) -> str:
    return "|".join(f for f in row.split("|") if f.split("=", 1)[0] not in TIME_COLUMNS | aside)


def main() -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("out")
    d.add_argument("--home", default="/tmp/vidassets-demo-rows")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--aside", default="", help="more columns to leave out, comma-separated (e.g. input_version)")
    c.add_argument("--out", help="append the comparison to this results file (JSON list)")
    args = parser.parse_args()
    if args.cmd == "dump":
        home = Path(args.home)
        for part in ("store", "eval_vault", "dagster_home"):  # the bucket stays: the same bytes both times
            shutil.rmtree(home / part, ignore_errors=True)
        # this checkout's code (run from its root), whichever environment runs the script
        subprocess.run([sys.executable, "-m", "vidassets.cli", "demo", "--home", str(home)], check=True, cwd=REPO)
        rows = dump(home)
        Path(args.out).write_text(json.dumps(rows, indent=0, sort_keys=True))
        print(f"{len(rows)} table files, {sum(map(len, rows.values()))} rows -> {args.out}")
        return 0
    aside = frozenset(c for c in args.aside.split(",") if c)
    a, b = ({k: sorted(_without_times(r, aside) for r in rows) for k, rows in json.loads(Path(p).read_text()).items()}
            for p in (args.a, args.b))
    differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    for k in differ:
        only_a = sorted(set(a.get(k, [])) - set(b.get(k, [])))
        only_b = sorted(set(b.get(k, [])) - set(a.get(k, [])))
        print(f"DIFFERS {k}: {len(a.get(k, []))} vs {len(b.get(k, []))} rows")
        for row in only_a[:2]:
            print(f"  - {row[:600]}")
        for row in only_b[:2]:
            print(f"  + {row[:600]}")
    print(f"{len(set(a) | set(b))} table files, {sum(map(len, a.values()))} rows compared: "
          + ("identical" if not differ else f"{len(differ)} differ"))
    if args.out:
        from common import write_results

        before = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else []
        if isinstance(before, dict):  # a results file: its comparison and the ones kept before it
            earlier = [*before.get("earlier_comparisons", []),
                       {**{k: before[k] for k in ("commit", "date", "command") if k in before}, **before["figures"]}]
        else:  # the older list of comparisons
            earlier = before
        figures = {"a": args.a, "b": args.b, "aside": sorted(aside), "table_files": len(set(a) | set(b)),
                   "rows": sum(map(len, a.values())), "tables_differing": differ}
        verdict = {"no table differs": {"value": len(differ), "target": 0, "met": not differ}}
        write_results(args.out, sys.argv, figures, verdict, earlier_comparisons=earlier)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
