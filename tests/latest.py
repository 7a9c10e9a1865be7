"""`make test-latest`: every notebook under nbval, on the newest release of every requirement.

Run by the interpreter of `.venv-latest` (the Makefile installs the newest release of every
package named in requirements.txt there, with no pins and no constraints). For each notebook,
in order, it runs `pytest -x notebooks/NAME.ipynb` on 8 emulated CPU devices with no network
(tools/offline.py), as `make test` does, and prints one line: PASS, or the first failing
cell with its error. Exit status 1 if any notebook failed.

The notebooks check that the JAX they run on is the one they pin (`JAX_PIN`); here that pin
is moved, in a copy of each notebook under .cache/latest/, to the JAX that is installed, and
the line says so. Nothing in the repository changes: not the notebooks, not the pins.
Not part of `make test` or CI, which prove the pinned stack.

    python tests/latest.py                # the notebooks of the working tree
    python tests/latest.py --ref HEAD     # those of a commit (skips uncommitted edits)
"""

from __future__ import annotations

import argparse
import html
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".cache" / "latest"
PIN = re.compile(r'JAX_PIN = \\"[^"\\]+\\"')  # as it appears in the .ipynb's JSON
ANSI = re.compile(r"(\x1b|#x1B)\[[0-9;]*m")
ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning|Failed)\w*)(: .*)?$")


def first_failure(junit: Path) -> str:
    """'cell N (`first line of the cell`): ErrorType: message' of the first failing cell."""
    for case in ET.parse(junit).getroot().iter("testcase"):
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is None:
            continue
        text = ANSI.sub("", html.unescape(problem.text or problem.get("message", "")))
        lines = [line.rstrip() for line in text.splitlines()]
        source = ""
        if "Input:" in lines:
            source = next((line for line in lines[lines.index("Input:") + 1 :] if line.strip()), "")
        errors = [line for line in lines if ERROR_LINE.match(line.strip())]
        # nbval's own summary ("Cell 32: Timeout of 600 seconds exceeded ...") when no error line
        summary = next((line.split(": ", 1)[1] for line in lines if re.match(r"Cell \d+: ", line.strip())), "failed")
        what = errors[-1].strip() if errors else summary
        where = case.get("name", "?").lower() + (f" (`{source.strip()[:60]}`)" if source else "")
        return f"{where}: {what[:300]}"
    return "pytest failed before any cell ran (see the log)"


def notebooks(ref: str | None) -> list[tuple[str, str]]:
    """(name, .ipynb text) of every notebook, from the working tree or from commit `ref`."""
    if ref is None:
        return [(p.stem, p.read_text()) for p in sorted((ROOT / "notebooks").glob("*.ipynb"))]
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    paths = sorted(p for p in git("ls-tree", "--name-only", ref, "notebooks/").split() if p.endswith(".ipynb"))
    return [(Path(p).stem, git("show", f"{ref}:{p}")) for p in paths]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", help="run the notebooks of this commit (default: the working tree)")
    ap.add_argument("--cell-timeout", type=int, default=600, help="seconds per cell (a busy machine needs more)")
    args = ap.parse_args()
    jax_version = importlib.metadata.version("jax")
    versions = ", ".join(f"{p} {importlib.metadata.version(p)}" for p in
                         ("jax", "jaxlib", "flax", "optax", "grain", "orbax-checkpoint", "nbval"))
    print(f"test-latest: Python {sys.version.split()[0]}, {versions}; notebooks of "
          f"{args.ref or 'the working tree'}", flush=True)
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    failed = 0
    for name, text in notebooks(args.ref):
        copy = WORK / f"{name}.ipynb"
        copy.write_text(PIN.sub(f'JAX_PIN = \\"{jax_version}\\"', text))
        moved = " (JAX_PIN moved to it)" if f'JAX_PIN = \\"{jax_version}\\"' not in text and PIN.search(text) else ""
        junit = WORK / f"{name}.xml"
        start = time.perf_counter()
        run = subprocess.run(
            [sys.executable, str(ROOT / "tools" / "offline.py"), "--no-network", "--",
             sys.executable, "-m", "pytest", "-x", "-q", f"--nbval-cell-timeout={args.cell_timeout}", "--junitxml", str(junit), str(copy.relative_to(ROOT))],
            cwd=ROOT, env={**os.environ, "CPU_DEVICES": "8"}, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        (WORK / f"{name}.log").write_text(run.stdout + run.stderr)
        if run.returncode == 0:
            print(f"PASS {name:<34s} {seconds:5.0f} s{moved}", flush=True)
            continue
        failed += 1
        why = first_failure(junit) if junit.exists() else (run.stdout + run.stderr).strip().splitlines()[-1:]
        print(f"FAIL {name:<34s} {seconds:5.0f} s{moved}: {why}", flush=True)
    print(f"test-latest: {failed} notebook(s) failed; logs in {WORK.relative_to(ROOT)}/" if failed else
          "test-latest: every notebook passes on the newest releases", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
