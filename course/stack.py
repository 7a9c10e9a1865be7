"""The pinned stack: install it on Colab/Kaggle, emulate devices on a CPU, say where we run.

Every notebook's first cell is this file, then `install(...)` of what the notebook imports,
`emulate_devices()` (00 teaches that step and does it in a lesson cell instead) and, once JAX
is imported, `show_hardware()`. Nothing here imports JAX at the top: on Colab/Kaggle the
install may replace it, and the device count must be set before JAX starts.
"""

import glob
import os
import shutil
import subprocess
import sys

JAX_PIN = "0.12.0.1"  # with Python >= 3.12, as on Colab and Kaggle today
PINS = {  # requirements.txt's pins for what notebooks import (tests/test_course.py keeps them equal)
    "flax": "0.12.12", "optax": "0.2.8", "grain": "0.2.18", "orbax-checkpoint": "0.12.8",
    "tiktoken": "0.14.0", "matplotlib": "3.11.2", "tqdm": "4.70.1", "xprof": "2.24.2",
    "rich": "15.0.0", "qwix": "0.1.8",
}
ON_COLAB_OR_KAGGLE = "google.colab" in sys.modules or "KAGGLE_KERNEL_RUN_TYPE" in os.environ
HAS_TPU = bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))
HAS_GPU = bool(shutil.which("nvidia-smi")) and subprocess.run(
    ["nvidia-smi", "-L"], capture_output=True).returncode == 0


def install(*packages: str) -> None:
    """On Colab/Kaggle, pip-install JAX for the accelerator found (jax[tpu] also brings the TPU
    compiler to a CPU runtime) and `packages` at the course's pins. Elsewhere it does nothing:
    `make` installed requirements.txt."""
    unknown = [p for p in packages if p not in PINS]
    if unknown:
        raise ValueError(f"no pin for {unknown}: add it to PINS and to requirements.txt")
    if not ON_COLAB_OR_KAGGLE:
        return
    if "jax" in sys.modules:
        print("JAX is already imported in this session: after the install, restart the runtime "
              "and run all.")
    accelerator = "cuda12" if HAS_GPU else "tpu"  # cuda12: Colab's driver (550) predates cuda13's
    specs = [f"jax[{accelerator}]=={JAX_PIN}", *(f"{p}=={PINS[p]}" for p in packages)]
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", *specs])
    if done.returncode != 0:
        raise RuntimeError(f"pip could not install {' '.join(specs)} (see above). On Kaggle, "
                           "switch Internet on in the notebook's settings, then run all again.")


def emulate_devices(n: int = 8) -> None:
    """On a machine with no TPU/GPU, present the CPU as n JAX devices (a count already in
    XLA_FLAGS wins: the tests rerun notebooks at 1, 2 and 4) and keep an installed libtpu from
    probing for a TPU. XLA reads the flag when JAX starts its backends: call this first."""
    if not (HAS_TPU or HAS_GPU):
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    flags = os.environ.get("XLA_FLAGS", "")
    if "--xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()


def preset_name() -> str:
    """Which hardware preset to run: COURSE_PRESET (cpu, gpu or tpu) where it is set, else the
    backend JAX runs on. `make test-presets` runs the accelerators' presets on a CPU this way, so
    that no reader's path first runs on the reader's machine."""
    import jax

    name = os.environ.get("COURSE_PRESET") or jax.default_backend()
    if name not in ("cpu", "gpu", "tpu"):
        raise ValueError(f"COURSE_PRESET={name!r}: choose cpu, gpu or tpu")
    if name != jax.default_backend():
        print(f"note: running the {name.upper()} preset on a {jax.default_backend().upper()} "
              "(COURSE_PRESET): its shapes, dtypes and schedule, not its speed.")
    return name


def capped(value: int, variable: str) -> int:
    """`value`, or the smaller cap an environment variable sets (`make test-presets` runs the
    accelerators' presets for COURSE_MAX_STEPS steps at a batch of at most COURSE_MAX_BATCH)."""
    cap = os.environ.get(variable)
    if cap is not None and not cap.isdigit():
        raise ValueError(f"{variable}={cap!r}: give a whole number")
    return min(value, int(cap)) if cap else value


def where() -> str:
    """Where the notebook runs: Colab, Kaggle, a TPU VM, a GPU machine, or a CPU."""
    import jax

    backend = jax.default_backend()
    if "google.colab" in sys.modules:
        return f"Colab ({backend.upper()})"
    if "KAGGLE_KERNEL_RUN_TYPE" in os.environ:
        return f"Kaggle ({backend.upper()})"
    return {"tpu": "TPU VM", "gpu": "GPU machine"}.get(backend, "CPU machine")


def check_pin(version: str) -> None:
    """Refuse a JAX other than the pin (`%pip` does not stop a notebook when an install fails).
    A maintainer on a machine whose JAX they cannot change sets COURSE_ANY_JAX=1 and gets a
    loud warning instead; Colab and Kaggle readers always stay on the pin."""
    if version == JAX_PIN:
        return
    message = f"this course is pinned to JAX {JAX_PIN} (Python >= 3.12) but found {version}"
    if os.environ.get("COURSE_ANY_JAX") == "1" and not ON_COLAB_OR_KAGGLE:
        print(f"WARNING: {message}; running anyway (COURSE_ANY_JAX=1): outputs may differ "
              "from the committed ones.")
        return
    raise RuntimeError(
        f"{message[0].upper()}{message[1:]}: restart the runtime after the install cell, then run all (on "
        "Kaggle, switch Internet on first if the install failed). Locally: `make run`, or "
        "`pip install -r requirements.txt`.")


def show_hardware() -> None:
    """Check the JAX pin, then print where this notebook runs, so its outputs can be read in context."""
    import importlib.metadata

    import jax

    check_pin(jax.__version__)
    backend, devices = jax.default_backend(), jax.devices()
    libtpu = f", libtpu {importlib.metadata.version('libtpu')}" if backend == "tpu" else ""
    print(f"Python {sys.version.split()[0]}, JAX {jax.__version__}{libtpu}, on a {where()}")
    print(f"devices: {len(devices)} x {devices[0].device_kind} (backend {backend!r}, "
          f"{jax.process_count()} process(es), {os.cpu_count()} host CPU cores)")
    if backend == "cpu" and (HAS_TPU or HAS_GPU):
        if os.environ.get("JAX_PLATFORMS") == "cpu":
            print("note: a TPU/GPU is attached but JAX_PLATFORMS=cpu keeps JAX on the CPU.")
        else:
            print("WARNING: this machine has a TPU/GPU but JAX runs on the CPU: the accelerator "
                  "plugin did not load. Restart the runtime and run the install cell again.")
