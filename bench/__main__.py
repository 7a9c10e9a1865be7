"""`make bench`: the course's speed, measured against its own baselines and the hardware.

    python -m bench                 # everything, each notebook under nbval included (~30 min)
    python -m bench --no-nbval      # skip the notebooks' wall times (a few minutes)

Runs in the environment `make run` and `make test` use (tools/offline.py: 8 emulated CPU
devices unless CPU_DEVICES/XLA_FLAGS say otherwise, offline data). On a GPU or TPU machine
it runs on the accelerator. Every figure is warm: the first call (tracing, compilation) is
reported on its own, and the figure quoted is the median of several runs of the function that
was warmed up. The MiniGPT figures run notebook 01's own code and the memory figures notebook
06's (their cells tagged `course-lib`, see bench/course.py). Each result is checked before it
counts; a failed check or a target not met makes the run exit with status 1, naming it.
bench/tpu.py adds 01's step compiled for a Kaggle TPU v5e-8 by libtpu: compiler estimates,
labelled as such. The sections, in order, are bench/sections.py's `plan`. Prints the table and
writes it, section by section as it is measured, to bench/results/latest.{md,json}.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import offline  # noqa: E402


def _environment() -> dict[str, str]:
    """The course's offline environment; on a GPU/TPU machine, JAX stays on the accelerator."""
    has_accelerator = shutil.which("nvidia-smi") or glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")
    return offline.course_env({**os.environ, **({"COURSE_ACCELERATOR": "1"} if has_accelerator else {})})


def _arguments(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    ap.add_argument("--no-nbval", action="store_true", help="skip each notebook's wall time under nbval")
    ap.add_argument("--nbval-only", metavar="NAMES", help="time only these notebooks (comma-separated) under nbval")
    ap.add_argument("--readme", action="store_true", help="also write the table into README.md's Performance section")
    ap.add_argument("--only", nargs="+", metavar="SECTION", help="run only these sections (their names in "
                    "bench/sections.py's plan, each quoted), and no notebook under nbval unless --nbval-only")
    ap.add_argument("--repeats", type=int, default=5, help="warm runs per measurement (median reported)")
    ap.add_argument("--notebook", default="01_minigpt", help="the notebook whose course-lib cells to load")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = _arguments(argv)
    from bench.nbval import select_notebooks

    if not args.no_nbval:  # an unknown name stops here, before minutes of benchmarks
        select_notebooks(args.nbval_only.split(",") if args.nbval_only else None)
    env = _environment()
    os.environ.update(env)
    started = time.perf_counter()
    import jax  # noqa: E402 - after the environment is set

    from bench import report, sections  # noqa: E402

    results = {"machine": report.machine(), "rows": [], "targets": [], "errors": {}, "details": {}}
    print(f"bench: {results['machine']['devices']}, JAX {jax.__version__}", flush=True)
    run = sections.Bench(args, env, results)
    for name, section, needs in sections.plan(args):
        run.run(name, section, needs)

    results["machine"]["load_average_1min_at_end"] = round(os.getloadavg()[0], 2)
    results["machine"]["bench_wall_s"] = round(time.perf_counter() - started, 1)
    md_path, json_path = report.write(results, dated=True)
    if args.readme and not report.update_readme(results):
        print("bench: README.md has no bench markers; not updated")
    print(f"\n{report.markdown(results)}")
    print(f"bench: {results['machine']['bench_wall_s']:.0f} s; wrote {md_path.relative_to(ROOT)} and "
          f"{json_path.relative_to(ROOT)}")
    missed = [t for t in results["targets"] if not t["met"]]
    for name, error in results["errors"].items():
        print(f"bench: FAILED: {name}: {error}")
    for t in missed:
        print(f"bench: FAILED: target not met: {t['target']} (required {t['required']}, measured {t['measured']})")
    return 1 if results["errors"] or missed else 0


if __name__ == "__main__":
    sys.exit(main())
