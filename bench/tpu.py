"""01's train step compiled for a Kaggle TPU v5e-8 that is not attached: compiler estimates.

libtpu (installed with `jax[tpu]`) holds the TPU compiler and compiles for a TPU topology on any
Linux machine (course/tpu.py). The step is notebook 01's own (`lib.train_step` lowered from
`lib.abstract_model`'s shapes on a mesh of the v5e-8's devices; nothing runs). From the compiled
program: memory per chip (course/hlo.py's memory_bytes), FLOPs and bytes accessed per chip
(`cost_analysis()`: 01's layers are a Python loop, so every layer is counted), and the roofline
time max(FLOPs / peak, bytes / HBM bandwidth) with the chip's data sheet figures. MFU implied =
the model's matmul FLOPs (course/flops.py, as the measured rows count them; the plain loss's, so
the chunked loss's recomputed logits do not count) / roofline time / the chips' peak; HFU counts
every matmul the step runs. Every number is a TPU compiler estimate, not a measurement.
`estimate` also sizes 01's presets for a Colab v5e-1 and a v2-8 (tests/test_tpu_presets.py).

Fails closed: the compile must run (course/tpu.py's tpu_devices raises with the cause under
COURSE_TPU_COMPILE=1, which `make bench` sets); a step "does not fit" only where the compiler
said RESOURCE_EXHAUSTED; and the run fails when 01's shipped v5e-8 preset does not fit.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from bench.minigpt import CheckFailed, check, seed_config
from course.flops import matmul_flops
from course.tpu import TPU_CHIPS, compile_or_oom, roofline, tpu_devices

LABEL = "TPU compiler estimate, not a measurement"
TARGET = "Kaggle v5e-8"

# 01_minigpt's v5e-8 preset before issue 25: the seed tutorial's model (D=256, N=8, F=1024, L=8,
# T=256, V=50,304 padded), 32 sequences per chip on a 4 x 2 ('data', 'model') mesh, bfloat16
# matmuls. Fields of 01's Config.
BEFORE = {"global_batch": 256, "seq_len": 256, "d_model": 256, "n_heads": 8, "d_ff": 1024, "n_layers": 8,
          "vocab_size": 50_304, "compute_dtype": "bfloat16", "model_parallel": 2}
# After issue 25: the v5e-8 preset 01 chose by compiling for the v5e-8 (wider, pure data
# parallelism on a mesh of 8 x 1, and the chunked loss, which never holds the [B, T, V] logits).
AFTER = {"global_batch": 256, "seq_len": 256, "d_model": 1024, "n_heads": 16, "d_ff": 4096, "n_layers": 8,
         "vocab_size": 50_304, "compute_dtype": "bfloat16", "model_parallel": 1, "loss": "chunked",
         "loss_chunks": 4}
SHIPPED = "01 v5e-8 preset, after"


# Where 01's loss is chunked (issue 25: no [B, T, V] logits at once), its value and gradients are
# checked equal to the plain loss's on the CPU, on a small model of the same kind, before a
# row with that loss counts: |chunked - plain| <= LOSS_RTOL * the plain loss (value) or its
# largest gradient (every gradient), float32.
LOSS_RTOL = 1e-5


def chunked_loss_matches(lib, cfg) -> float:
    """Largest relative difference between 01's chunked and plain losses (values and gradients)
    for a small float32 model with cfg's loss settings, on one CPU device; raises CheckFailed
    beyond LOSS_RTOL."""
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    small = dataclasses.replace(cfg, global_batch=4, seq_len=8 * cfg.loss_chunks, d_model=64, n_heads=2,
                                d_ff=128, n_layers=2, compute_dtype="float32", model_parallel=1)
    mesh = lib.make_mesh(small, jax.devices("cpu")[:1])
    batch = jax.random.randint(jax.random.key(1), (small.global_batch, small.seq_len + 1), 0,
                               small.real_vocab, jnp.int32)
    out = {}
    with jax.default_matmul_precision("highest"):
        for loss in ("plain", cfg.loss):
            model, _ = lib.create_model(dataclasses.replace(small, loss=loss), mesh)  # same seed, same weights
            with jax.set_mesh(mesh):
                value, grads = nnx.value_and_grad(lib.loss_fn)(model, batch)
            out[loss] = (float(value), [np.asarray(g) for g in jax.tree.leaves(grads)])
    (v0, g0), (v1, g1) = out["plain"], out[cfg.loss]
    # Gradients relative to the largest of all: some are zero up to rounding (a key's bias
    # shifts every score of a query alike, which the softmax ignores).
    scale = max(float(np.max(np.abs(b))) for b in g0)
    gap = max([abs(v1 - v0) / abs(v0)] + [float(np.max(np.abs(a - b))) / scale for a, b in zip(g1, g0, strict=True)])
    check(len(g0) == len(g1) and gap <= LOSS_RTOL,
          f"01's {cfg.loss!r} loss differs from the plain loss by {gap:.1e} (tolerance {LOSS_RTOL:.0e})")
    return gap


def configs(lib) -> dict:
    """label -> 01's Config for each row (the preset before, the seed's architecture, the preset
    after), or a string saying why that row has none."""
    before = dataclasses.replace(lib.Config("tpu-before"), **BEFORE)
    seed = seed_config(lib, before, 8, on_cpu=False)  # B = 192 per chip, as the seed trains on a v5e-8
    try:
        after = dataclasses.replace(lib.Config("tpu-after"), **AFTER)
    except TypeError as e:  # 01's Config lacks a field the preset needs (the chunked loss)
        after = f"01's Config cannot express it ({e})"
    return {"01 v5e-8 preset, before": before, "seed architecture": seed, "01 v5e-8 preset, after": after}


def preset_note(lib, cfg, devices) -> str:
    """Whether 01's preset_for(a v5e-8) is this configuration today (its name, steps and other
    training fields aside), and if not, which fields differ."""
    now = lib.preset_for(devices)
    fields = [f for f in AFTER if getattr(now, f, None) != getattr(cfg, f)]
    return ("= 01's preset_for(v5e-8) today" if not fields else "01's preset_for(v5e-8) now differs in "
            + ", ".join(f"{f}={getattr(now, f, None)}" for f in fields))


def shape(cfg) -> str:
    if isinstance(cfg, str):
        return "B=256 T=256 ... (see AFTER in bench/tpu.py)"
    loss = getattr(cfg, "loss", "plain")
    return (f"B={cfg.global_batch} T={cfg.seq_len} D={cfg.d_model} N={cfg.n_heads} F={cfg.d_ff} "
            f"L={cfg.n_layers} V={cfg.vocab_size} {cfg.compute_dtype}, {loss} loss"
            + (f" ({cfg.loss_chunks} chunks)" if loss != "plain" else ""))


def estimate(lib, cfg, devices) -> dict:
    """Compile 01's train step for `cfg` on the TPU `devices` (any TPU_CHIPS kind: a v5e-8, a
    v5e-1, a v2-8); the compiler's estimates per chip, or fits=False and the bytes it said it
    needs where it ran out of memory. MFU counts the model's matmuls (the plain loss's); HFU
    every matmul the step runs, the chunked loss's recomputed logits included."""
    chip = TPU_CHIPS[devices[0].device_kind]
    mesh = lib.make_mesh(cfg, devices)
    model, optimizer = lib.abstract_model(cfg, mesh)
    batch = jax.ShapeDtypeStruct((cfg.global_batch, cfg.seq_len + 1), jnp.int32,
                                 sharding=NamedSharding(mesh, P("data", None)))
    start = time.perf_counter()
    with jax.set_mesh(mesh):
        compiled, gib = compile_or_oom(lib.train_step.lower(model, optimizer, batch))
        hardware_flops = matmul_flops(lib.train_step, model, optimizer, batch)
        if getattr(cfg, "loss", "plain") == "plain":
            model_flops = hardware_flops
        else:  # the same step with the plain loss: what the model needs, no recomputation
            plain = dataclasses.replace(cfg, loss="plain")
            model_flops = matmul_flops(lib.train_step, *lib.abstract_model(plain, mesh), batch)
    compile_s = time.perf_counter() - start
    common = {"shape": shape(cfg), "mesh": dict(mesh.shape), "device_kind": devices[0].device_kind,
              "compile_s": compile_s, "bytes_per_chip": gib * 2**30, "hbm_gib": chip["hbm_gib"],
              "model_flops_per_step": model_flops, "hardware_flops_per_step": hardware_flops}
    if compiled is None:
        return {**common, "fits": False}
    line = roofline(compiled, devices[0].device_kind)  # per chip: flops, bytes, seconds, bound
    peak = line["seconds"] * mesh.devices.size * chip["bf16_flops"]
    return {
        **common, "compiled": compiled, "fits": gib <= chip["hbm_gib"], "margin": 1 - gib / chip["hbm_gib"],
        "flops_per_chip": line["flops"], "bytes_accessed_per_chip": line["bytes"],
        "compute_s": line["compute_s"], "memory_s": line["memory_s"], "roofline_s": line["seconds"],
        "bound": line["bound"], "mfu": model_flops / peak, "hfu": hardware_flops / peak,
        "tokens_per_s": cfg.global_batch * cfg.seq_len / line["seconds"],
    }


def row(label: str, cfg, est: dict | None, why: str | None) -> dict:
    """The table row of one estimate (or of why there is none)."""
    mesh = "x".join(str(n) for n in est["mesh"].values()) if est else "?"
    note = f"; {est['note']}" if est and est.get("note") else ""
    config = f"{label}: {shape(cfg)}, {TARGET}, mesh {mesh}{note}"
    benchmark = f"train step compiled for a {TARGET} ({LABEL})"
    if est is None:
        return {"benchmark": benchmark, "config": config, "result": f"not compiled: {why}"}
    if "roofline_s" not in est:
        return {"benchmark": benchmark, "config": config, "compile_s": est["compile_s"],
                "result": f"DOES NOT FIT: the compiler needs {est['bytes_per_chip'] / 2**30:.2f} GiB per chip "
                f"of {est['hbm_gib']}"}
    fit = f"fits, {100 * est['margin']:.0f}% margin" if est["fits"] else "DOES NOT FIT"
    return {
        "benchmark": benchmark, "config": config, "compile_s": est["compile_s"],
        "result": f"{est['bytes_per_chip'] / 2**30:.2f} GiB per chip of {est['hbm_gib']} ({fit}); "
        f"{est['flops_per_chip'] / 1e12:.2f} TFLOP and {est['bytes_accessed_per_chip'] / 1e9:.1f} GB accessed "
        f"per chip; roofline {est['roofline_s'] * 1e3:.1f} ms ({est['bound']}-bound: compute "
        f"{est['compute_s'] * 1e3:.1f} ms, memory {est['memory_s'] * 1e3:.1f} ms); MFU implied "
        f"{100 * est['mfu']:.1f}% ({est['model_flops_per_step'] / 1e12:.2f} TFLOP/step of the model's matmuls; "
        f"HFU {100 * est['hfu']:.1f}%, recomputation included); "
        f"{est['tokens_per_s']:,.0f} tokens/s",
    }


def rows(lib, selected: dict | None = None) -> tuple[list[dict], dict, dict]:
    """Every configuration's row and estimates, and the checks that failed: a wrong chunked
    loss, or 01's shipped preset not fitting. A compile that fails for another reason than
    memory raises (the section fails)."""
    selected = configs(lib) if selected is None else selected
    devices = tpu_devices(TARGET)
    out_rows, details, failed = [], {}, {}
    for label, cfg in selected.items():
        est, reason = None, "COURSE_TPU_COMPILE=0" if devices is None else None
        if isinstance(cfg, str):
            reason = failed[label] = cfg
        elif devices is not None:
            try:
                checked = (f"its loss equals the plain loss on CPU (values and gradients within "
                           f"{chunked_loss_matches(lib, cfg):.0e})" if getattr(cfg, "loss", "plain") != "plain" else "")
                est = estimate(lib, cfg, devices)
                est.pop("compiled", None)  # the program itself is not a result
                est["note"] = "; ".join(x for x in (checked, preset_note(lib, cfg, devices) if label == SHIPPED else "") if x)
                if label == SHIPPED and not est["fits"]:
                    failed[label] = f"01's shipped v5e-8 preset does not fit ({est['bytes_per_chip'] / 2**30:.2f} GiB per chip)"
            except CheckFailed as e:  # a wrong loss: the row must not count, and the run fails
                reason = failed[label] = f"check failed: {e}"
        details[label] = est if est is not None else {"error": reason}
        out_rows.append(row(label, cfg, est, reason))
    return out_rows, details, failed


def largest_batch(lib, cfg, devices, stride: int = 64, hi: int = 2048) -> dict:
    """The largest global batch (a multiple of `stride`, 8 sequences per chip) at which `cfg`'s step,
    compiled for `devices`, fits and keeps the preset's FLOPs per sequence: near the memory limit the
    TPU compiler may recompute activations on its own (more FLOPs per sequence), which is a different
    step. Found by bisection, compiling each candidate; only the compiler's out-of-memory counts as
    not fitting."""
    base = estimate(lib, cfg, devices)
    check(base["fits"], f"the preset itself (B={cfg.global_batch}) does not fit")
    per_seq = base["flops_per_chip"] / cfg.global_batch
    tried = {}

    def ok(batch: int) -> bool:
        est = estimate(lib, dataclasses.replace(cfg, global_batch=batch), devices)
        if "roofline_s" not in est:
            tried[batch] = f"out of memory ({est['bytes_per_chip'] / 2**30:.2f} GiB needed)"
            return False
        recomputes = est["flops_per_chip"] / batch > 1.02 * per_seq
        tried[batch] = (f"{est['bytes_per_chip'] / 2**30:.2f} GiB, "
                        f"{est['flops_per_chip'] / batch / per_seq - 1:+.1%} FLOPs per sequence")
        return est["fits"] and not recomputes

    lo = cfg.global_batch  # fits: the preset's own row
    while lo < hi and ok(2 * lo):  # double, then bisect
        lo *= 2
    high = min(2 * lo, hi)
    while high - lo > stride:
        mid = (lo + high) // 2 // stride * stride
        lo, high = (mid, high) if ok(mid) else (lo, mid)
    return {"largest": lo, "tried": dict(sorted(tried.items())), "preset": cfg.global_batch}


def largest_batch_row(lib) -> tuple[dict, dict]:
    """The bench row: the largest batch 01's v5e-8 preset could use, found by compiling."""
    devices = tpu_devices(TARGET)
    cfg = configs(lib)[SHIPPED]
    config = f"01 v5e-8 preset ({shape(cfg)}), {TARGET}, batch in multiples of 64"
    if devices is None or isinstance(cfg, str):
        return {"benchmark": "largest batch that fits, by compiling", "config": config,
                "result": f"not compiled: {'COURSE_TPU_COMPILE=0' if devices is None else cfg}"}, {}
    found = largest_batch(lib, cfg, devices)
    tried = "; ".join(f"B={b}: {t}" for b, t in found["tried"].items())
    return {"benchmark": f"largest batch that fits a {TARGET}, by compiling ({LABEL})", "config": config,
            "result": f"B={found['largest']} ({found['largest'] // 8} per chip; the preset uses "
            f"{found['preset']}); tried {tried}"}, found
