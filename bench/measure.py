"""Timing helpers and the hardware's matmul rate (the "peak" MFU is measured against).

Every measurement is warm: the first call (which traces and compiles) is timed on its own
and reported as compile time; the figure quoted is the median of several later runs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

# Dense bf16 peak per JAX device (vendor data sheets), for MFU on accelerators. Looked up by
# the first key that is a substring of `device_kind`, so specific keys come before generic
# ones; an unknown accelerator falls back to the measured matmul rate. TPU v2/v3 chips show
# up as two JAX devices each (one per core), so their rows are per core.
ACCELERATOR_PEAK_FLOPS = {
    "H100 PCIe": 756e12,
    "H100 NVL": 835e12,
    "H100": 989e12,  # SXM
    "H200": 989e12,
    "A100": 312e12,
    "L4": 121e12,
    "TPU v5 lite": 197e12,  # v5e
    "TPU v5e": 197e12,
    "TPU v5": 459e12,  # v5p
    "TPU v6": 918e12,  # v6e (Trillium)
    "TPU v4": 275e12,
    "TPU v3": 61.5e12,  # 123e12 per chip, 2 cores
    "TPU v2": 22.5e12,  # 45e12 per chip, 2 cores
    # T4, P100 and V100 have no bf16 matmul units: they are measured instead (in the dtype the
    # preset computes in).
}


@dataclass
class Timing:
    """Seconds for the first call (compile + one run) and for the warm runs after it."""

    first_s: float
    runs_s: list[float]
    last: object = field(default=None, repr=False)  # what the last run returned

    @property
    def median_s(self) -> float:
        return statistics.median(self.runs_s)

    @property
    def compile_s(self) -> float:
        """The first call's excess over a warm run: tracing and compilation (nan: not measured)."""
        return max(self.first_s - self.median_s, 0.0) if self.first_s == self.first_s else float("nan")

    def summary(self) -> dict:
        return {"first_s": self.first_s, "runs_s": self.runs_s, "median_s": self.median_s, "compile_s": self.compile_s}


def block(x):
    """Wait for every array in a pytree (JAX dispatches asynchronously)."""
    return jax.block_until_ready(x)


def time_calls(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> Timing:
    """Time `fn()` (which must return only when its work is done): `warmup` calls, the first
    of which is reported as `first_s` (it compiles), then `repeats` timed runs. warmup=0: the
    caller has already warmed `fn` up."""
    first = float("nan")
    for i in range(warmup):
        start = time.perf_counter()
        block(fn())
        if i == 0:
            first = time.perf_counter() - start
    runs, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = block(fn())
        runs.append(time.perf_counter() - start)
    return Timing(first, runs, out)


def matmul_rate(n: int, dtype, repeats: int = 5) -> dict:
    """FLOP/s of square matmuls: one on one device, and one per device over all devices.

    On a CPU with emulated devices, the second runs the devices' matmuls concurrently on the
    shared cores, as a sharded train step does; the better of the two is the machine's rate.
    """
    devices = jax.devices()
    key_a, key_b = jax.random.split(jax.random.key(0))
    a = jax.random.normal(key_a, (n, n), dtype)
    b = jax.random.normal(key_b, (n, n), dtype)
    single = jax.jit(jnp.matmul)
    t1 = time_calls(lambda: single(a, b), repeats)
    rates = {"one_device": 2 * n**3 / t1.median_s}
    if len(devices) > 1:
        mesh = jax.sharding.Mesh(np.array(devices), ("d",))
        spread = NamedSharding(mesh, P("d"))
        a_all = jax.device_put(jnp.broadcast_to(a, (len(devices), n, n)), spread)
        b_all = jax.device_put(jnp.broadcast_to(b, (len(devices), n, n)), spread)
        batched = jax.jit(lambda x, y: jnp.einsum("bij,bjk->bik", x, y), out_shardings=spread)
        tn = time_calls(lambda: batched(a_all, b_all), repeats)
        rates["all_devices"] = 2 * n**3 * len(devices) / tn.median_s
    return {"n": n, "dtype": jnp.dtype(dtype).name, **rates, "best": max(rates.values())}


def peak_flops(compute_dtype) -> dict:
    """The FLOP/s that MFU divides by, and where it came from.

    Accelerators: the data-sheet dense bf16 peak of one chip times the device count (the
    measured matmul rate is reported beside it). CPU: the matmul rate measured here, in the
    train step's compute dtype, since a CPU has no single published peak.
    """
    device = jax.devices()[0]
    on_cpu = device.platform == "cpu"
    n = 1024 if on_cpu else 8192
    measured = matmul_rate(n, compute_dtype)
    sheet = next((v for k, v in ACCELERATOR_PEAK_FLOPS.items() if k in device.device_kind), None)
    if on_cpu or sheet is None:
        return {"flops": measured["best"], "source": f"measured {measured['dtype']} matmul rate", "measured": measured}
    return {
        "flops": sheet * jax.device_count(),
        "source": f"data-sheet dense bf16 peak of {jax.device_count()} x {device.device_kind}",
        "measured": measured,
    }
