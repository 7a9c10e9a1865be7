"""Compile for a TPU that is not attached: libtpu (from jax[tpu]) holds the TPU compiler and
compiles for any TPU topology on a CPU-only Linux machine. Every number read from such a
program is a compiler estimate, not a measurement.

COURSE_TPU_COMPILE says what to do when that cannot happen: `1` (make test, make run, CI): the
compile must run, and any failure raises with its cause; `0` (make test-1, as on Colab's CPU
runtime): skip, saying so; unset (a reader): skip only where libtpu is not installed (a GPU
runtime, macOS), and raise on any other failure.
"""

import importlib.util
import os
import re

import jax
from jax.experimental import topologies

from course.hlo import memory_bytes

TPU_TARGETS = {  # a name readers know -> (libtpu topology, chips per host)
    "Kaggle v5e-8": ("v5e:2x4", (2, 4, 1)),  # one host with 8 chips
    "Colab v5e-1": ("v5e:1x1", (1, 1, 1)),
    "v2-8": ("v2:2x2", (2, 2, 1)),  # 4 chips, 8 devices (two TensorCores per chip)
    "v5e-256": ("v5e:16x16", None),  # a pod: 64 hosts of 4 chips
}
TPU_CHIPS = {  # data sheets (cloud.google.com/tpu/docs/v5e, /v2), per JAX device
    "TPU v5 lite": dict(bf16_flops=197e12, hbm_bytes_per_s=819e9, hbm_gib=15.75,
                        # one mesh axis's ring, both directions of a 45 GB/s link (the scaling
                        # book's W_ici); the data sheet's 1,600 Gbit/s is all four links
                        ici_bytes_per_s=9e10),
    "TPU v2": dict(bf16_flops=22.5e12, hbm_bytes_per_s=350e9, hbm_gib=7.48, ici_bytes_per_s=6.2e10),
}


class TPUCompileUnavailable(RuntimeError):
    """A compile for a TPU that was required (COURSE_TPU_COMPILE=1) or expected could not run."""


def tpu_devices(target: str = "Kaggle v5e-8"):
    """Devices to compile for: `target` (a TPU_TARGETS key or a libtpu topology name), attached
    or not. None, saying why, only where COURSE_TPU_COMPILE=0 or libtpu is not installed."""
    switch = os.environ.get("COURSE_TPU_COMPILE")
    if switch == "0":
        print(f"Skipping the compile for {target}: COURSE_TPU_COMPILE=0 (acting as a runtime "
              "without libtpu, as Colab's CPU runtime).")
        return None
    if importlib.util.find_spec("libtpu") is None:
        if switch == "1":
            raise TPUCompileUnavailable(f"COURSE_TPU_COMPILE=1 but libtpu is not installed, so no "
                                        f"compile for {target}: pip install -r requirements.txt")
        print(f"Cannot compile for {target} here: libtpu is not installed (a GPU runtime, or not "
              "Linux). pip install jax[tpu] to run this cell; skipping it.")
        return None
    topology, per_host = TPU_TARGETS.get(target, (target, None))
    if jax.default_backend() != "tpu":  # no TPU here: libtpu must not look for a TPU VM's metadata
        for key, value in {"TPU_SKIP_MDS_QUERY": "1", "TPU_WORKER_HOSTNAMES": "localhost",
                           "TPU_ACCELERATOR_TYPE": "v5litepod-8",
                           "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}.items():  # other processes may compile too
            os.environ.setdefault(key, value)
    try:
        kwargs = {"chips_per_host_bounds": per_host} if per_host else {}
        return topologies.get_topology_desc(topology_name=topology, platform="tpu", **kwargs).devices
    except Exception as e:  # noqa: BLE001  (raised again, with the cause)
        raise TPUCompileUnavailable(f"libtpu is installed but could not describe {target} "
                                    f"({topology}): {type(e).__name__}: {e}") from e


def compile_or_oom(lowered):
    """(compiled program, GiB per device) where it fits; (None, GiB the compiler says it needs)
    where the compiler runs out of memory. Any other failure is not "does not fit": it raises."""
    try:
        compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as e:
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        need = re.search(r"\(([\d.]+)([GT])\) exceeds", str(e))  # GiB, or TiB past 1,024 GiB
        if need is None:
            raise
        return None, float(need[1]) * (1024 if need[2] == "T" else 1)
    return compiled, memory_bytes(compiled) / 2**30


def roofline(compiled, chip: str = "TPU v5 lite") -> dict:
    """The compiler's FLOPs and bytes accessed per chip against the chip's data sheet: the
    roofline time max(compute, memory), an optimistic estimate (no links; the compiler's counts are
    estimates too), and which one bounds it. XLA's cost analysis counts a while loop's body once:
    use it on programs whose layers are unrolled."""
    cost, peak = compiled.cost_analysis(), TPU_CHIPS[chip]
    compute_s = cost["flops"] / peak["bf16_flops"]
    memory_s = cost["bytes accessed"] / peak["hbm_bytes_per_s"]
    return dict(flops=cost["flops"], bytes=cost["bytes accessed"], compute_s=compute_s,
                memory_s=memory_s, seconds=max(compute_s, memory_s),
                bound="compute" if compute_s >= memory_s else "memory")
