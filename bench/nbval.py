"""Wall time of each notebook under nbval, run as `make test` runs it (8 emulated devices)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def select_notebooks(names: list[str] | None = None) -> list[Path]:
    """Every notebook, or exactly the ones named: an unknown name is an error, never dropped
    (a series time over zero notebooks would meet any target)."""
    paths = sorted((ROOT / "notebooks").glob("*.ipynb"))
    if names is None:
        if not paths:
            raise SystemExit("bench: notebooks/ holds no notebook")
        return paths
    names = [n.strip() for n in names if n.strip()]
    if not names:
        raise SystemExit("bench: --nbval-only selects no notebook")
    unknown = [n for n in names if n not in {p.stem for p in paths}]
    if unknown:
        raise SystemExit(f"bench: no notebook named {', '.join(unknown)} "
                         f"(there are: {', '.join(p.stem for p in paths)})")
    return [p for p in paths if p.stem in names]


def notebook_wall_times(env: dict[str, str], names: list[str] | None = None) -> list[dict]:
    """`python -m pytest notebooks/NAME.ipynb` per notebook, in order: seconds and outcome."""
    paths = select_notebooks(names)
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
        # passed: pytest's status, and at least one cell ran (rc 5 means nothing was collected)
        passed = result.returncode == 0 and " passed" in last
        rows.append({"notebook": path.stem, "seconds": seconds, "passed": passed, "pytest": last})
        print(f"  nbval {path.stem:<34s} {seconds:7.1f} s  {last}", flush=True)
    return rows
