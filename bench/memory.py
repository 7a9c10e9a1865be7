"""Activation checkpointing (remat) and gradient accumulation, measured on notebook 06's own code.

The model, its `Config` (switches `remat`: a key of 06's POLICIES, and `micro`: K micro-batches
whose gradients a `jax.lax.scan` sums), `loss_and_grads`, `start` and `make_step` are the cells
of `md/06_memory.md` tagged `course-lib`, loaded by `bench/course.py`: a fix to 06 reaches the
benchmark. The batch is split over a `data` mesh axis of every device, parameters replicated
(ZeRO stage 0).

06 runs its layers in a `jax.lax.scan`, whose body XLA's `cost_analysis()` counts once whatever
the trip count; the FLOPs here are `course/flops.py`'s `matmul_flops` of the traced step (every
layer, the recomputation remat asks for included).

Every figure is checked before it counts (`CheckFailed`): remat and each K must give the loss
and gradients of the plain step (so the same Adam update), within a float32 tolerance, and
remat must add FLOPs and save temporaries, accumulation must save temporaries as K grows.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from bench.course import load_course_lib
from bench.measure import block as wait
from bench.minigpt import check
from course.flops import matmul_flops

# |g - g0| <= GRAD_RTOL * max|g0|, per gradient tensor: the same math in another order (float32).
# XLA:CPU agrees to ~1e-6; a GPU's or TPU's "highest"-precision matmuls are given 10x more room.
GRAD_RTOL = {"cpu": 1e-5}
GRAD_RTOL_ACCELERATOR = 1e-4


@functools.cache
def lib():
    """06_memory's `course-lib` cells, loaded once."""
    return load_course_lib("06_memory")


def Config(**fields):  # noqa: N802 - reads as the notebook's class
    """06's Config (its cfg0's sizes unless given): V bytes, D, N heads of width H, F, L, T, B."""
    return lib().Config(**fields)


def describe(c) -> str:
    return f"V={c.V} D={c.D} N={c.N} H={c.H} F={c.F} L={c.L} T={c.T} B={c.B} {c.compute}"


class Bench:
    """The model's state and a batch on a `data` mesh of every device, and the compiled
    functions of any config of the same sizes."""

    def __init__(self, c, devices=None, seed: int = 0):
        devices = list(jax.devices() if devices is None else devices)
        self.mesh = jax.make_mesh((len(devices),), ("data",), devices=devices,
                                  axis_types=(jax.sharding.AxisType.Auto,))
        self.c = c
        n = len(devices)
        for K in (1, 2, 4):
            if c.B % (K * n):
                raise ValueError(f"B={c.B} must be a multiple of K x devices = {K} x {n} (K up to 4)")
        self.replicated = NamedSharding(self.mesh, P())
        self.rows = NamedSharding(self.mesh, P("data"))
        self.params, self.opt = lib().start(c, self.mesh, seed)  # 06's initial state, stage 0: replicated
        # The token ids are random: memory, FLOPs and time do not depend on which ids they are.
        key = jax.random.key(seed + 1)
        self.batch = jax.device_put(jax.random.randint(key, (c.B, c.T + 1), 0, c.V, jnp.int32), self.rows)

    @functools.cache  # noqa: B019 - one Bench per run; the cache holds compiled programs
    def grads_fn(self, c):
        """06's loss_and_grads of config c, compiled (the gradients come back replicated)."""
        return jax.jit(functools.partial(lib().loss_and_grads, c=c), in_shardings=(self.replicated, self.rows),
                       out_shardings=self.replicated).lower(self.params, self.batch).compile()

    @functools.cache  # noqa: B019
    def step_fn(self, c):
        """06's train step of config c (make_step: params and Adam state donated), compiled."""
        return lib().make_step(c, self.mesh).lower(self.params, self.opt, self.batch).compile()

    def step_flops(self, c) -> float:
        """Matmul FLOPs of one train step of config c, all devices (every layer of the scan)."""
        return matmul_flops(lib().make_step(c, self.mesh), self.params, self.opt, self.batch)

    def same_as_plain(self, c) -> float:
        """Largest |gradient - plain step's gradient| over max|plain gradient|, per tensor; raises
        CheckFailed if it, or the loss, is outside the tolerance."""
        base = dataclasses.replace(c, remat="none", micro=1)
        loss0, g0 = self.grads_fn(base)(self.params, self.batch)
        loss, g = self.grads_fn(c)(self.params, self.batch)
        rtol = GRAD_RTOL.get(jax.devices()[0].platform, GRAD_RTOL_ACCELERATOR)
        worst = max(float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
                    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g0), strict=True))
        check(abs(float(loss) - float(loss0)) <= rtol * abs(float(loss0)),
              f"remat={c.remat}, K={c.micro}: loss {float(loss)} != the plain step's {float(loss0)}")
        check(worst <= rtol, f"remat={c.remat}, K={c.micro}: gradients differ from the plain step's by "
              f"{worst:.2e} of their largest value (tolerance {rtol:.0e})")
        return worst

    def time_step(self, c) -> Callable[[], float]:
        """One call of c's train step on fresh copies of the state (the step donates them)."""
        step = self.step_fn(c)

        def run():
            params, opt = jax.tree.map(jnp.copy, (self.params, self.opt))
            wait((params, opt))
            start = time.perf_counter()
            wait(step(params, opt, self.batch))
            return time.perf_counter() - start

        return run


def remat(c=None, repeats: int = 5, devices=None) -> dict:
    """Full remat vs none on the same train step: FLOPs (matmul_flops of the traced step, all
    devices), temporaries (memory_analysis), warm step time (medians of interleaved runs),
    and the gradients, checked equal first."""
    c = c or Config()
    b = Bench(c, devices)
    with jax.default_matmul_precision("highest"):  # full float32 on every backend, for the check
        configs = {name: dataclasses.replace(c, remat=name) for name in ("none", "full")}
        gap = b.same_as_plain(configs["full"])
        out = {"config": describe(c), "devices": b.mesh.devices.size, "grad_max_rel_diff": gap,
               "grad_rtol": GRAD_RTOL.get(jax.devices()[0].platform, GRAD_RTOL_ACCELERATOR)}
        runs = {name: b.time_step(cfg) for name, cfg in configs.items()}
        for run in runs.values():  # warm up: the first call may allocate
            run()
        times = {name: [] for name in runs}
        for _ in range(repeats):  # interleaved, so a change of load hits both alike
            for name, run in runs.items():
                times[name].append(run())
    for name, cfg in configs.items():
        compiled = b.step_fn(cfg)
        out[name] = {"flops": b.step_flops(cfg), "temp_bytes": compiled.memory_analysis().temp_size_in_bytes,
                     "step_s": statistics.median(times[name]), "step_s_runs": times[name]}
    out["flops_ratio"] = out["full"]["flops"] / out["none"]["flops"]
    out["time_ratio"] = out["full"]["step_s"] / out["none"]["step_s"]
    out["temp_ratio"] = out["full"]["temp_bytes"] / out["none"]["temp_bytes"]
    check(1.05 < out["flops_ratio"] < 1.5, f"full remat should add recompute FLOPs (at most +50%, one more "
          f"forward of the layers): x{out['flops_ratio']:.3f}")
    check(out["temp_ratio"] < 1, f"full remat should need fewer temporaries: x{out['temp_ratio']:.3f}")
    return out


def accumulation(c=None, micro=(1, 2, 4), devices=None) -> dict:
    """Temporaries of the compiled train step at K micro-batches, each K checked to give the
    plain step's loss and gradients (so the same update) before its number counts."""
    c = c or Config()
    b = Bench(c, devices)
    out = {"config": describe(c), "devices": b.mesh.devices.size, "K": {}}
    with jax.default_matmul_precision("highest"):
        for K in micro:
            cfg = dataclasses.replace(c, micro=K)
            gap = b.same_as_plain(cfg) if K > 1 else 0.0
            mem = b.step_fn(cfg).memory_analysis()
            out["K"][K] = {"temp_bytes": mem.temp_size_in_bytes, "argument_bytes": mem.argument_size_in_bytes,
                           "micro_batch": c.B // K, "grad_max_rel_diff": gap}
    temps = [out["K"][K]["temp_bytes"] for K in micro]
    check(all(a > b for a, b in zip(temps, temps[1:], strict=False)),
          f"accumulation should need fewer temporaries as K grows: {temps}")
    out["grad_rtol"] = GRAD_RTOL.get(jax.devices()[0].platform, GRAD_RTOL_ACCELERATOR)
    return out


__all__ = ["Config", "accumulation", "remat"]
