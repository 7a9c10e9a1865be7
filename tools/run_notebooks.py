"""Run notebooks under nbval in a given setting, one line each: `make test-1`, `make test-2`,
`make test-presets` and `make test-accelerator`. Outputs are not compared (conftest.py): every
cell runs and every check asserts.

    python tools/run_notebooks.py devices N [NAME ...]    every notebook on N emulated CPU devices
    python tools/run_notebooks.py presets [NAME ...]      the readers' accelerator presets, on this CPU
    python tools/run_notebooks.py accelerator [NAME ...]  every notebook on the attached GPU/TPU

devices: the code paths of another device count (1: Colab's CPU runtime; 2: the (1, 2) mesh of a
two-GPU reader), with the TPU compiles off (COURSE_TPU_COMPILE=0, their no-libtpu path: the TPU
compiles do not depend on the CPU device count, and `make test` runs them) and the notebooks
that train for long capped (CAPS below): the same global batch gives the same training on any
device count, and `make test` runs it at full length.

presets: each notebook with a hardware preset of its own runs with COURSE_PRESET=gpu or tpu
(stack.preset_name() picks it instead of the backend's), so the shapes, dtypes, optimizer and
schedule a Kaggle or Colab reader gets first run here, not on the reader's machine; steps and
batch are capped (COURSE_MAX_STEPS, COURSE_MAX_BATCH) to fit CI. PRESET_RUNS below says what
each run covers. After each run's line come the lines its cells printed about the loss.

accelerator: COURSE_ACCELERATOR=1 keeps JAX on the GPU/TPU (no JAX_PLATFORMS=cpu); the TPU
compiles run where libtpu is installed and are skipped, saying so, where it is not. JOBS=N runs
N notebooks at once on one GPU, the longest first, each as on a card of 0.9/N of its memory
(XLA_PYTHON_CLIENT_MEM_FRACTION, unless set, with JAX's preallocation kept as a reader has it:
allocating as needed fragments the memory, and a preset sized to fill it may then run out, as
01's training likely did in the H200 run of 2026-11-27), so that the series fits a short loan of
a machine; a TPU belongs to one process, so JOBS=1 there. Each notebook's log, written as it
runs and ending with its slowest cells, is .cache/run_notebooks/NAME.log. 01 trains its
accelerator preset for ACCELERATOR_CAPS' steps (past the warmup, so its learning checks hold):
its full schedule takes 10 minutes or more on a T4 or a v5e-8, past nbval's 600 s per cell.
FULL=1 runs it whole, with an hour per cell.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import offline  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

# The short run of each notebook that trains for long: steps, batch and data capped (the caps the
# notebook's own `capped(...)` reads), chosen so that every check still holds. The GPU/TPU presets
# and the 1- and 2-device runs use them; `make test` and `make run` never do (full length, 8
# devices, outputs compared). A notebook not named here has no cap to take and runs whole.
CAPS = {
    "01_minigpt": {"COURSE_MAX_STEPS": "3", "COURSE_MAX_BATCH": "8"},
    "03_tensor_parallel_transformer": {"COURSE_MAX_STEPS": "30", "COURSE_MAX_BATCH": "16"},
    # 2 measured steps, 1 capture per configuration, a batch of 16 (its batch sweep's smallest,
    # 16 // 4, must divide the data axis of 4)
    "04_profiling": {"COURSE_MAX_STEPS": "2", "COURSE_MAX_BATCH": "16"},
    # 500 stories give 5 batches of 64 per pass: 12 steps go round the data twice (the H200's NaN)
    "09_mixture_of_experts": {"COURSE_MAX_STEPS": "12", "COURSE_MAX_STORIES": "500"},
}

# (notebook, preset, the caps and device count of its CPU run, whether CI runs it). A preset that
# equals another one of the same notebook runs once. Naming a notebook runs all of its presets.
PRESET_RUNS = [
    # on one device, as on Colab's T4, L4 or A100: 637 s here where 8 devices took 748 s
    ("01_minigpt", "gpu", {**CAPS["01_minigpt"], "CPU_DEVICES": "1"}, True),
    # 01's TPU preset (the Kaggle v5e-8 reader's path: 204 M parameters, bfloat16, chunked loss,
    # an (8, 1) mesh) ran every cell without an error on 1 device (executed directly, not under
    # nbval), but took 969 s and 16.6 GiB of host memory
    # on a 2-core CPU (its checks hold float32 twins and one-device references of the whole model;
    # on 2 or 8 emulated devices each holds a replica: over 21 GiB, killed). Too much for CI:
    # `make test-presets NB=01_minigpt` runs it (246 s alone on a quiet machine, 2026-11-27: now
    # its host memory, not its time, keeps it out of CI, beside the other lane's notebooks).
    ("01_minigpt", "tpu", {"COURSE_MAX_STEPS": "2", "COURSE_MAX_BATCH": "2", "CPU_DEVICES": "1"}, False),
    # 915 s on a fresh clone's CI run here, beside the other lane: out of per-push CI for time
    # (209 s alone on a quiet machine, 2026-11-27)
    ("03_tensor_parallel_transformer", "tpu", {**CAPS["03_tensor_parallel_transformer"], "CPU_DEVICES": "8"}, False),
    # 04's GPU preset (D=512, T=256, bfloat16, V=50304) passed at 8 devices in 1,070 s on a loaded
    # 2-core machine (its batch sweep and loaders compile and time steps of that size); on 2
    # devices its loader cell ran past nbval's 600 s. CI's 90 minutes cannot hold it beside the
    # rest: `make test-presets NB=04_profiling` runs it (263 s alone on a quiet machine, 2026-11-27).
    ("04_profiling", "gpu", {**CAPS["04_profiling"], "CPU_DEVICES": "8"}, False),
    ("09_mixture_of_experts", "tpu", {**CAPS["09_mixture_of_experts"], "CPU_DEVICES": "8"}, True),
]

# An accelerator run's caps (FULL=1: none): 01's training cell at its full schedule (3,000 steps
# on a GPU, 10,000 on a v5e-8) takes 10 minutes or more on a T4 or a v5e-8 (estimates).
ACCELERATOR_CAPS = {"01_minigpt": {"COURSE_MAX_STEPS": "300"}}

# The order of an accelerator run with JOBS > 1, longest first so that the last to start are
# short: the second H200 run's times (2026-11-26, 4-5 notebooks sharing the card; 01 had not
# finished in 520 s). A notebook not listed runs after these.
LONGEST_FIRST = ["01_minigpt", "03_tensor_parallel_transformer", "09_mixture_of_experts", "04_profiling",
                 "08_long_context", "06_memory", "10_finetuning", "05_multihost", "07_pipeline_parallel",
                 "02_tensor_parallel_mlp", "00_setup"]


LOSS_LINES = 40  # of a preset run's printed lines that mention a loss, shown after its line


def run(name: str, env: dict[str, str], label: str, extra: tuple[str, ...] = (), losses: bool = False) -> bool:
    path = ROOT / "notebooks" / f"{name}.ipynb"
    if not path.exists():
        raise SystemExit(f"run_notebooks: no notebook {path.relative_to(ROOT)}")
    # pytest's output goes to a log as it runs (one cell per line, -v; COURSE_LIVE_LOG adds each
    # cell's time and a failure's message as it happens), so that a run stopped from outside (a
    # time limit on a lent GPU) still shows how far each notebook got and what failed.
    log = ROOT / ".cache" / "run_notebooks" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with log.open("w") as out:
        returncode = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider",
                                     *extra, str(path.relative_to(ROOT))],
                                    cwd=ROOT, env={**os.environ, **env, "COURSE_LIVE_LOG": "1"},
                                    stdout=out, stderr=subprocess.STDOUT).returncode
    seconds = time.perf_counter() - start
    output = log.read_text()
    last = (output.strip().splitlines() or ["(no output)"])[-1].strip("= ")
    passed = returncode == 0 and " passed" in last
    print(f"{'PASS' if passed else 'FAIL'}  {name:<34s} {label:<40s} {seconds:6.0f} s  {last}", flush=True)
    if losses:  # the lines its cells printed that mention a loss, for the record (CI's log)
        lines = [line for line in output.splitlines() if line.startswith("    | ") and "loss" in line.lower()]
        if len(lines) > LOSS_LINES:
            lines = lines[: LOSS_LINES // 2] + ["    | ..."] + lines[-LOSS_LINES // 2:]
        print("\n".join(lines), flush=True)
    if not passed:
        print(output[-6000:], f"(all of it: {log.relative_to(ROOT)})", sep="\n", flush=True)
    return passed


def jobs(text: str) -> int:
    """JOBS, checked: more than one only on a GPU (a TPU's chips belong to one process)."""
    if not text.isdigit() or int(text) < 1:
        raise SystemExit(f"run_notebooks accelerator: JOBS={text!r}; give a count of notebooks to run at once, e.g. JOBS=4")
    gpu = shutil.which("nvidia-smi") is not None
    if int(text) > 1 and not gpu and (glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")):
        raise SystemExit(f"run_notebooks accelerator: JOBS={text}, but a TPU belongs to one process at a time: "
                         "run with JOBS=1")
    return int(text)


def run_on_accelerator(names: list[str], n_jobs: int) -> list[bool]:
    """Every notebook (or those named) on the attached accelerator, n_jobs at a time."""
    libtpu = importlib.util.find_spec("libtpu") is not None
    env = {"COURSE_ACCELERATOR": "1", "COURSE_TPU_COMPILE": os.environ.get("COURSE_TPU_COMPILE", "1" if libtpu else "0")}
    if n_jobs > 1:  # the notebooks share one GPU: none may take it all (setting the variable wins)
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.9 / n_jobs:.2f}")
    env.update(offline.course_env({**os.environ, **env}))
    label = (f"on the attached accelerator (TPU compiles: {'on' if env['COURSE_TPU_COMPILE'] == '1' else 'off'}"
             + (f"; {n_jobs} at once" if n_jobs > 1 else "") + ")")
    selected = [p.stem for p in sorted((ROOT / "notebooks").glob("*.ipynb")) if not names or p.stem in names]
    if n_jobs > 1:
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        selected.sort(key=lambda name: rank.get(name, len(rank)))
    full = os.environ.get("FULL") == "1"
    extra = ("--nbval-cell-timeout=3600",) if full else ()

    def one(name: str) -> bool:
        caps = {} if full else ACCELERATOR_CAPS.get(name, {})
        return run(name, {**env, **caps}, label + "".join(f", {k}={v}" for k, v in caps.items()), extra)

    with ThreadPoolExecutor(max_workers=n_jobs) as pool:  # each line is printed as its notebook ends
        return list(pool.map(one, selected))


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("devices", "presets", "accelerator"):
        raise SystemExit(__doc__)
    if argv[0] == "devices" and (len(argv) < 2 or not argv[1].isdigit()):
        raise SystemExit("run_notebooks devices: give the device count, e.g. devices 2 [NAME ...]")
    names = argv[2:] if argv[0] == "devices" else argv[1:]
    results = []
    if argv[0] == "devices":
        for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
            if names and path.stem not in names:
                continue
            caps = CAPS.get(path.stem, {})
            env = {**caps, "CPU_DEVICES": argv[1], "COURSE_TPU_COMPILE": "0"}
            env.update(offline.course_env({**os.environ, **env}))
            results.append(run(path.stem, env, f"{argv[1]} devices" + "".join(f", {k}={v}" for k, v in caps.items())))
    elif argv[0] == "presets":
        for name, preset, caps, in_ci in PRESET_RUNS:
            if (names and name not in names) or (not names and not in_ci):
                continue
            env = {**caps, "COURSE_PRESET": preset, "COURSE_TPU_COMPILE": "0"}
            env.update(offline.course_env({**os.environ, **env}))
            results.append(run(name, env, f"{preset} preset, " + ", ".join(f"{k}={v}" for k, v in caps.items()),
                               losses=True))
    else:
        results = run_on_accelerator(names, jobs(os.environ.get("JOBS", "1")))
    if not results:
        raise SystemExit(f"run_notebooks: nothing selected by {names}")
    print(f"run_notebooks {' '.join(argv[:2] if argv[0] == 'devices' else argv[:1])}: {sum(results)} of {len(results)} passed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
