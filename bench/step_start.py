"""Start-up cost of a step process: what every extra pod pays before its step does any work, the
proxy for one pod per step vs one shared pod (docs/deployment.md). Measures, in fresh interpreters:
loading the code location (``import vidassets.definitions``: Dagster, the graph, settings) and
that plus the CPU torch import a model step adds. Usage: ``python bench/step_start.py``."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_results  # noqa: E402


def fresh(code: str, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    bare = fresh("pass")
    location = fresh("import vidassets.definitions")
    with_torch = fresh("import vidassets.definitions, torch")
    print(f"python start: {bare:.2f} s; code location load: {location:.2f} s; + torch: {with_torch:.2f} s "
          f"(median of 5, fresh interpreters)")
    write_results(Path(__file__).resolve().parent / "results" / "step_start.json", sys.argv,
                  {"python_start_s": round(bare, 3), "code_location_load_s": round(location, 3),
                   "code_location_and_torch_s": round(with_torch, 3), "repeats": 5, "statistic": "median"})


if __name__ == "__main__":
    main()
