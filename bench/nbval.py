"""Wall time of each notebook under nbval, run as `make test` runs it (8 emulated devices)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def notebook_wall_times(env: dict[str, str], names: list[str] | None = None) -> list[dict]:
    """`python -m pytest notebooks/NAME.ipynb` per notebook, in order: seconds and outcome."""
    paths = sorted((ROOT / "notebooks").glob("*.ipynb"))
    if names:
        paths = [p for p in paths if p.stem in names]
    rows = []
    for path in paths:
        start = time.perf_counter()
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", str(path.relative_to(ROOT))],
            cwd=ROOT,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - start
        last = (result.stdout.strip().splitlines() or ["(no output)"])[-1]
        rows.append({"notebook": path.stem, "seconds": seconds, "passed": result.returncode == 0, "pytest": last})
        print(f"  nbval {path.stem:<34s} {seconds:7.1f} s  {last}", flush=True)
    return rows
