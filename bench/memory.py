"""Activation checkpointing (remat) and gradient accumulation, measured on one small Transformer.

Notebook 06_memory's model, written again here (a benchmark cannot import a notebook): a
pre-norm Transformer in pure JAX, batch split over a `data` mesh axis of every device,
parameters replicated, Adam as a tree map. Two switches in its frozen config: `remat` (no
`jax.checkpoint`, or `jax.checkpoint` with `nothing_saveable` on every block: store only the
block's input, recompute the rest in the backward pass) and `micro` (K micro-batches per step,
their gradients summed by a `jax.lax.scan`).

Unlike 06, the layers are a Python loop, not a scan: `cost_analysis()` counts a loop body once
whatever its trip count, so with a scan the step's FLOPs would hide the recomputation of all but
one layer. Unrolled, the compiled step's FLOPs are the FLOPs it executes.

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

from bench.measure import block as wait
from bench.minigpt import check

# |g - g0| <= GRAD_RTOL * max|g0|, per gradient tensor: the same math in another order (float32).
# XLA:CPU agrees to ~1e-6; a GPU's or TPU's "highest"-precision matmuls are given 10x more room.
GRAD_RTOL = {"cpu": 1e-5}
GRAD_RTOL_ACCELERATOR = 1e-4


@dataclasses.dataclass(frozen=True)
class Config:
    """06_memory's small model (its cfg0): V bytes, D, N heads of width H, F, L layers, T, B."""

    V: int = 256
    D: int = 64
    N: int = 4
    H: int = 16
    F: int = 256
    L: int = 4
    T: int = 64
    B: int = 32  # the global batch, split over `data`
    remat: str = "none"  # "none" or "full" (jax.checkpoint, nothing_saveable, on every block)
    micro: int = 1  # K micro-batches per step (gradient accumulation)
    lr: float = 1e-3

    def describe(self) -> str:
        return f"V={self.V} D={self.D} N={self.N} H={self.H} F={self.F} L={self.L} T={self.T} B={self.B} float32"


POLICIES = {"none": None, "full": jax.checkpoint_policies.nothing_saveable}


def init_params(key: jax.Array, c: Config) -> dict:
    """Norm gains one; a matrix normal / sqrt(its input width); embeddings normal * 0.02."""
    k = iter(jax.random.split(key, 3 + 4 * c.L))
    normal = lambda shape, fan_in: jax.random.normal(next(k), shape) * fan_in**-0.5  # noqa: E731
    layers = [{"norm1": jnp.ones(c.D), "qkv": normal((c.D, 3, c.N, c.H), c.D),
               "out": normal((c.N, c.H, c.D), c.N * c.H), "norm2": jnp.ones(c.D),
               "mlp_in": normal((c.D, c.F), c.D), "mlp_out": normal((c.F, c.D), c.F)} for _ in range(c.L)]
    return {"embed": 0.02 * jax.random.normal(next(k), (c.V, c.D)),
            "pos": 0.02 * jax.random.normal(next(k), (c.T, c.D)),
            "norm_f": jnp.ones(c.D), "unembed": normal((c.D, c.V), c.D), "layers": layers}


def rms_norm(x: jax.Array, gain: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * gain


def block(x: jax.Array, p: dict) -> jax.Array:
    """One pre-norm Transformer block, x: [b, T, D] -> [b, T, D]."""
    q, k, v = jnp.einsum("btd,dknh->kbtnh", rms_norm(x, p["norm1"]), p["qkv"])
    a = jax.nn.dot_product_attention(q, k, v, is_causal=True)  # [b, T, N, H]
    x = x + jnp.einsum("btnh,nhd->btd", a, p["out"])
    h = jnp.einsum("btd,df->btf", rms_norm(x, p["norm2"]), p["mlp_in"])
    return x + jnp.einsum("btf,fd->btd", jax.nn.gelu(h), p["mlp_out"])


def loss_fn(params: dict, batch: jax.Array, c: Config) -> jax.Array:
    """Mean next-token cross-entropy of batch [b, T+1]."""
    ids = batch[:, :-1]
    x = params["embed"][ids] + params["pos"][: ids.shape[1]]
    layer = block if c.remat == "none" else jax.checkpoint(block, policy=POLICIES[c.remat])
    for p in params["layers"]:  # unrolled: cost_analysis counts every layer (see the docstring)
        x = layer(x, p)
    logits = jnp.einsum("btd,dv->btv", rms_norm(x, params["norm_f"]), params["unembed"])
    return -jnp.take_along_axis(jax.nn.log_softmax(logits), batch[:, 1:, None], axis=-1).mean()


def loss_and_grads(params: dict, batch: jax.Array, c: Config) -> tuple[jax.Array, dict]:
    """K = c.micro micro-batches: rows k, k+K, ... (every device keeps its share of each), their
    gradients summed by a scan, so only one micro-batch's activations are alive at a time."""
    if c.micro == 1:
        return jax.value_and_grad(loss_fn)(params, batch, c)
    micro = batch.reshape(batch.shape[0] // c.micro, c.micro, -1).swapaxes(0, 1)  # [K, B/K, T+1]

    def add(total, mb):
        loss, grads = jax.value_and_grad(loss_fn)(params, mb, c)
        return jax.tree.map(jnp.add, total, grads), loss

    total, losses = jax.lax.scan(add, jax.tree.map(jnp.zeros_like, params), micro)
    return losses.mean(), jax.tree.map(lambda t: t / c.micro, total)  # equal micro-batches


def adam_update(params, grads, opt, lr, b1=0.9, b2=0.999, eps=1e-8):
    count = opt["count"] + 1
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, opt["mu"], grads)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, opt["nu"], grads)
    step = lambda p, m, v: p - lr * (m / (1 - b1**count)) / (jnp.sqrt(v / (1 - b2**count)) + eps)  # noqa: E731
    return jax.tree.map(step, params, mu, nu), {"mu": mu, "nu": nu, "count": count}


def train_step(params, opt, batch, c: Config):
    loss, grads = loss_and_grads(params, batch, c)
    params, opt = adam_update(params, grads, opt, c.lr)
    return params, opt, loss


class Bench:
    """The model's state and a batch on a `data` mesh of every device, and the compiled
    functions of any config of the same sizes."""

    def __init__(self, c: Config, devices=None, seed: int = 0):
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
        key_p, key_b = jax.random.split(jax.random.key(seed))
        self.params = jax.jit(init_params, static_argnums=1, out_shardings=self.replicated)(key_p, c)
        zeros = jax.tree.map(jnp.zeros_like, self.params)
        self.opt = {"mu": zeros, "nu": zeros, "count": jnp.zeros((), jnp.int32)}
        # The token ids are random: memory, FLOPs and time do not depend on which ids they are.
        self.batch = jax.device_put(jax.random.randint(key_b, (c.B, c.T + 1), 0, c.V, jnp.int32), self.rows)

    @functools.cache  # noqa: B019 - one Bench per run; the cache holds compiled programs
    def grads_fn(self, c: Config):
        """loss_and_grads of config c, compiled (the gradients come back replicated)."""
        return jax.jit(functools.partial(loss_and_grads, c=c), in_shardings=(self.replicated, self.rows),
                       out_shardings=self.replicated).lower(self.params, self.batch).compile()

    @functools.cache  # noqa: B019
    def step_fn(self, c: Config):
        """The train step of config c, compiled, with params and Adam state donated."""
        return jax.jit(functools.partial(train_step, c=c), donate_argnums=(0, 1),
                       in_shardings=(self.replicated, self.replicated, self.rows),
                       out_shardings=(self.replicated, self.replicated, self.replicated)
                       ).lower(self.params, self.opt, self.batch).compile()

    def same_as_plain(self, c: Config) -> float:
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

    def time_step(self, c: Config) -> Callable[[], float]:
        """One call of c's train step on fresh copies of the state (the step donates them)."""
        step = self.step_fn(c)

        def run():
            params, opt = jax.tree.map(jnp.copy, (self.params, self.opt))
            wait((params, opt))
            start = time.perf_counter()
            wait(step(params, opt, self.batch))
            return time.perf_counter() - start

        return run


def flops(compiled) -> float:
    cost = compiled.cost_analysis()
    return float((cost[0] if isinstance(cost, list | tuple) else cost)["flops"])


def remat(c: Config = Config(), repeats: int = 5, devices=None) -> dict:
    """Full remat vs none on the same train step: FLOPs (cost_analysis of the compiled step,
    per device), temporaries (memory_analysis), warm step time (medians of interleaved runs),
    and the gradients, checked equal first."""
    b = Bench(c, devices)
    with jax.default_matmul_precision("highest"):  # full float32 on every backend, for the check
        configs = {name: dataclasses.replace(c, remat=name) for name in ("none", "full")}
        gap = b.same_as_plain(configs["full"])
        out = {"config": c.describe(), "devices": b.mesh.devices.size, "grad_max_rel_diff": gap,
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
        out[name] = {"flops": flops(compiled), "temp_bytes": compiled.memory_analysis().temp_size_in_bytes,
                     "step_s": statistics.median(times[name]), "step_s_runs": times[name]}
    out["flops_ratio"] = out["full"]["flops"] / out["none"]["flops"]
    out["time_ratio"] = out["full"]["step_s"] / out["none"]["step_s"]
    out["temp_ratio"] = out["full"]["temp_bytes"] / out["none"]["temp_bytes"]
    check(1.05 < out["flops_ratio"] < 1.5, f"full remat should add recompute FLOPs (at most +50%, one more "
          f"forward of the layers): x{out['flops_ratio']:.3f}")
    check(out["temp_ratio"] < 1, f"full remat should need fewer temporaries: x{out['temp_ratio']:.3f}")
    return out


def accumulation(c: Config = Config(), micro=(1, 2, 4), devices=None) -> dict:
    """Temporaries of the compiled train step at K micro-batches, each K checked to give the
    plain step's loss and gradients (so the same update) before its number counts."""
    b = Bench(c, devices)
    out = {"config": c.describe(), "devices": b.mesh.devices.size, "K": {}}
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
