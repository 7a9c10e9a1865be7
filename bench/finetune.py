"""Fine-tuning, on notebook 10's own code: a full step against LoRA and QLoRA.

`ft` is the namespace of md/10_finetuning.md's cells tagged `course-lib` (bench/course.py): its
sizes (V, T, D, HEADS, LAYERS, BATCH), `build` (a method's model and optimizer), `make_step`,
`batch`, `abstract_step` (a method's step at another width, lowered from shapes sharded by 10's
rule), `n_params`, and the compiled-program readers `memory_bytes`, `collectives` and `tally`.
A fix to 10 reaches the benchmark.

Two parts:
- `measure`: the three steps at the notebook's CPU preset on this machine's mesh: warm step time
  (median), compiled memory per device, what a step holds between steps (its arguments) and
  the bytes its collectives send. Checked before they count: every loss finite, the arguments
  QLoRA < LoRA < full, and a LoRA step sends less than a full one.
- `largest`: the widest model of 10's shape (LAYERS blocks, D doubled) whose step each method
  fits on a Kaggle TPU v5e-8 (4 x 2 mesh, 10's sharding rule, float32 weights and Adam), found by
  compiling for the TPU with libtpu: TPU compiler estimates, not measurements. "Does not fit" is
  only the compiler's out-of-memory (course/tpu.py's compile_or_oom); anything else raises.
"""

from __future__ import annotations

import functools
import math
import statistics
import time

import jax
from flax import nnx

from bench.course import load_course_lib
from bench.measure import block as wait
from bench.minigpt import check
from course.tpu import TPU_CHIPS, compile_or_oom, tpu_devices

METHODS = ("full", "LoRA", "QLoRA")
TARGET = "Kaggle v5e-8"
HBM_GIB = TPU_CHIPS["TPU v5 lite"]["hbm_gib"]


@functools.cache
def lib():
    """10_finetuning's `course-lib` cells, loaded once. Its cells set their mesh as the global
    one (`jax.set_mesh(mesh)`); the `with` puts back what was there, so that the sections after
    this one see none. `measure` sets 10's mesh again while it runs."""
    with jax.set_mesh(None):
        return load_course_lib("10_finetuning")


def measure(repeats: int = 5, ft=None) -> dict:
    """Each method's step at 10's CPU preset on 10's mesh (every device of this machine)."""
    ft = ft or lib()
    with jax.set_mesh(ft.mesh):  # as in the notebook
        return _measure(ft, repeats)


def _measure(ft, repeats: int) -> dict:
    tokens = ft.batch([ft.forward], 0)
    out = {"config": f"V={ft.V} T={ft.T} D={ft.D} heads={ft.HEADS} layers={ft.LAYERS} batch={ft.BATCH}, "
                     f"LoRA rank {ft.RANK} on {', '.join(ft.TARGETS)}",
           "mesh": dict(ft.mesh.shape), "methods": {}}
    for method in METHODS:
        model, optimizer = ft.build(method)
        step = ft.make_step(ft.WRT[method])
        compiled = step.lower(model, optimizer, tokens).compile()
        start = time.perf_counter()
        losses = [float(step(model, optimizer, tokens))]  # the first call: nnx.jit traces and compiles
        first_s = time.perf_counter() - start
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            loss = step(model, optimizer, tokens)
            wait(loss)
            times.append(time.perf_counter() - start)
            losses.append(float(loss))
        check(all(math.isfinite(x) for x in losses), f"{method}: a loss is not finite: {losses}")
        sent = ft.tally(ft.collectives(compiled, ft.mesh), "kind", "axes", weight="sent_bytes")
        out["methods"][method] = {
            "step_s": statistics.median(times), "step_s_runs": times, "first_call_s": first_s,
            "losses": losses, "memory_bytes": ft.memory_bytes(compiled),
            "argument_bytes": compiled.memory_analysis().argument_size_in_bytes,
            "sent_bytes": float(sum(sent.values())),
            "trained": sum(v.size for v in jax.tree.leaves(nnx.state(model, ft.WRT[method]))),
        }
    m = out["methods"]
    args = [m[k]["argument_bytes"] for k in ("QLoRA", "LoRA", "full")]
    check(args[0] < args[1] < args[2], f"a step's arguments should be QLoRA < LoRA < full: {args}")
    if ft.mesh.size > 1:
        check(m["LoRA"]["sent_bytes"] < m["full"]["sent_bytes"],
              f"a LoRA step should send less than a full step: {m['LoRA']['sent_bytes']} vs {m['full']['sent_bytes']}")
    return out


def compile_for(ft, method: str, width: int, devices) -> dict:
    """One method's step at D=width compiled for the TPU `devices` (4 x 2 mesh, 10's
    `abstract_step`): GiB per chip, or the GiB the compiler said it needs where it ran out."""
    mesh = jax.make_mesh((4, 2), ("data", "model"), devices=devices,
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)
    start = time.perf_counter()
    compiled, gib = compile_or_oom(ft.abstract_step(method, width, mesh))
    return {"D": width, "params": ft.n_params(width), "gib": gib, "fits": compiled is not None and gib <= HBM_GIB,
            "compile_s": time.perf_counter() - start}


def largest(ft=None, start: dict | None = None, devices=None, lowest: int = 1024) -> dict:
    """Per method, the widest D (doubling) whose step fits a v5e-8 and the next one, refused.
    Starts at `start[method]`, going up while it fits and down while it does not."""
    ft = ft or lib()
    devices = devices if devices is not None else tpu_devices(TARGET)
    start = start or {"full": 8192, "LoRA": 16384, "QLoRA": 32768}
    out = {}
    for method in METHODS:
        tried = {}
        width = start[method]
        while True:
            tried[width] = compile_for(ft, method, width, devices)
            up = tried[width]["fits"]
            nxt = width * 2 if up else width // 2
            if nxt in tried or nxt < lowest:
                break
            width = nxt
        fits = [w for w, r in tried.items() if r["fits"]]
        check(fits, f"{method}: no width from {lowest} up fits a {TARGET}: {tried}")
        best = max(fits)
        check(2 * best in tried and not tried[2 * best]["fits"],
              f"{method}: D={best} fits and D={2 * best} was not refused: {tried}")
        out[method] = {"largest": tried[best], "refused": tried[2 * best], "tried": dict(sorted(tried.items()))}
    widths = [out[m]["largest"]["D"] for m in METHODS]
    check(widths[0] <= widths[1] <= widths[2],
          f"LoRA should fit at least full fine-tuning's width and QLoRA at least LoRA's: {widths}")
    return out


__all__ = ["METHODS", "largest", "measure"]
