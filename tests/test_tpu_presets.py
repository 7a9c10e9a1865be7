"""01's TPU presets, sized by compiling for TPUs that are not attached: a Kaggle v5e-8, a Colab
v5e-1 and a v2-8 (libtpu compiles for any TPU topology on this CPU; course/tpu.py).

01's `preset_for` picks the TPU preset (`TPU_PRESET`: D = 1,024, 16 heads, F = 4,096, 8 blocks,
pure data parallelism, the chunked loss, bfloat16 matmuls) and a batch per device kind
(`TPU_BATCH`). Here each preset's train step (01's own, through bench/tpu.py's `estimate`, which
`make bench` uses too) is compiled for its TPU and checked: it fits with a quarter of the chip
free, the v5e-8's is worth renting (MFU, the jax-ai-stack tutorial's model as the baseline), and
it computes in bfloat16. Every number is a TPU compiler estimate, not a measurement; notebook 04
shows how such a compile is read, on this model.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from bench.course import load_course_lib  # noqa: E402
from bench.tpu import estimate  # noqa: E402
from course.flops import _subjaxprs  # noqa: E402
from course.tpu import tpu_devices  # noqa: E402

FREE = 0.25  # each preset leaves this share of the chip's memory free: the compiler's estimate
# is not the runtime's (fragmentation, XLA's scratch), and a reader's run must not start near OOM


@pytest.fixture(scope="module")
def lib():
    return load_course_lib("01_minigpt")


@pytest.fixture(scope="module")
def v5e8(lib, monkeypatch_module):
    monkeypatch_module.setenv("COURSE_TPU_COMPILE", "1")  # fails closed: the compile must run
    devices = tpu_devices("Kaggle v5e-8")
    tutorial = dataclasses.replace(lib.preset_for(devices), **lib.TUTORIAL_MODEL,
                                   global_batch=192 * len(devices))  # 192 sequences per chip
    return devices, estimate(lib, lib.preset_for(devices), devices), estimate(lib, tutorial, devices)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def show(name: str, est: dict) -> str:
    """One line of an estimate, printed (pytest -s, or a failure's captured output)."""
    line = (f"{name}: mesh {est['mesh']}, {est['bytes_per_chip'] / 2**30:.2f} of {est['hbm_gib']} GiB per "
            f"device" + (f"; roofline {est['roofline_s'] * 1e3:.1f} ms ({est['bound']}-bound), MFU "
                         f"{est['mfu']:.0%}, HFU {est['hfu']:.0%}" if est["fits"] else ", does not fit")
            + " (TPU compiler estimates)")
    print(line)
    return line


def needs_gib(lib, devices) -> float:
    """What 01's TPU_PER_DEVICE says the preset's step needs per device (preset_for halves the
    batch on a TPU with less memory than that)."""
    return lib.TPU_PER_DEVICE[devices[0].device_kind][1]


def matmul_dtypes(fn, *args) -> list[tuple[str, str, tuple]]:
    """(operand dtype, result dtype, result shape) of every matmul in the program JAX traces."""
    found = []

    def walk(jaxpr):  # nested jaxprs (jit, remat, scan) found as course/flops.py finds them
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                out = eqn.outvars[0].aval
                found.append((str(eqn.invars[0].aval.dtype), str(out.dtype), tuple(out.shape)))
            for value in eqn.params.values():
                for inner in _subjaxprs(value):
                    walk(inner)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


def test_the_v5e_8_preset_fits_with_a_quarter_free_and_is_worth_the_chips(lib, v5e8):
    devices, now, old = v5e8
    cfg = lib.preset_for(devices)
    show("Kaggle v5e-8, preset_for", now)
    show("Kaggle v5e-8, the jax-ai-stack tutorial's model", old)
    assert now["fits"] and old["fits"], "compile_or_oom: the compiler ran out of memory"
    gib = now["bytes_per_chip"] / 2**30
    assert gib <= (1 - FREE) * now["hbm_gib"], f"{gib:.2f} of {now['hbm_gib']} GiB per chip"
    assert gib <= needs_gib(lib, devices), (gib, "TPU_PER_DEVICE says less")
    # Worth renting: at least 40% MFU at its roofline, twice the tutorial's model, which is
    # memory-bound (its float32 scores and [B, T, V] logits do not grow with the width).
    assert now["mfu"] >= 0.40 and now["mfu"] > 2 * old["mfu"], (now["mfu"], old["mfu"])
    assert old["bound"] == "memory" and old["mfu"] < 0.2, old
    # 01 says its 10,000 steps take about 14 minutes of roofline time on a v5e-8.
    minutes = cfg.steps * now["roofline_s"] / 60
    print(f"{cfg.steps:,} steps: {minutes:.1f} minutes of roofline time")
    assert 10 <= minutes <= 16, minutes
    # The TPU compiler's own count (its layers and the loss's slices are Python loops, unrolled, so
    # it sees every matmul) covers the traced step's matmuls, the recomputed logits included.
    assert now["flops_per_chip"] >= 0.9 * now["hardware_flops_per_step"] / len(devices), now
    assert now["hfu"] > now["mfu"], "the chunked loss recomputes the logits: HFU counts them"
    assert cfg.loss == "chunked" and now["mesh"] == {"data": len(devices), "model": 1}, now["mesh"]


def test_the_v5e_8_preset_multiplies_in_bfloat16_and_keeps_the_logits_float32(lib, v5e8):
    devices, _, _ = v5e8
    cfg = lib.preset_for(devices)
    mesh = lib.make_mesh(cfg, devices)
    model, optimizer = lib.abstract_model(cfg, mesh)
    batch = jax.ShapeDtypeStruct((cfg.global_batch, cfg.seq_len + 1), jnp.int32,
                                 sharding=NamedSharding(mesh, P("data", None)))
    with jax.set_mesh(mesh):
        dots = matmul_dtypes(lambda m, o, b: lib.train_step(m, o, b), model, optimizer, batch)
    bf16 = [d for d in dots if d[0] == "bfloat16"]
    logits = [d for d in dots if d[1] == "float32" and d[2][-1] == cfg.vocab_size]
    assert len(bf16) >= 6 * cfg.n_layers, f"{len(bf16)} of {len(dots)} matmuls on bfloat16 operands"
    assert logits, "no matmul produces float32 [..., V] logits"


def test_the_v5e_8_could_hold_at_least_twice_the_preset_batch(lib, v5e8):
    """The step's memory is about affine in the batch (parameters and Adam's moments fixed, the
    activations per sequence): the compiled preset predicts the largest batch (01's exercise)."""
    devices, now, _ = v5e8
    mem = now["compiled"].memory_analysis()
    fixed = mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
    per_sequence = mem.temp_size_in_bytes / lib.preset_for(devices).global_batch
    stride = 8 * len(devices)  # 8 sequences per chip
    largest = int((now["hbm_gib"] * 2**30 - fixed) / per_sequence) // stride * stride
    print(f"fixed {fixed / 2**30:.2f} GiB + {per_sequence / 2**20:.1f} MiB per sequence: about {largest} "
          f"sequences would fit (predicted)")
    assert fixed < now["hbm_gib"] * 2**30 and largest >= 2 * lib.preset_for(devices).global_batch, largest


@pytest.mark.parametrize("target", ["Colab v5e-1", "v2-8"])
def test_the_colab_v5e_1_and_v2_8_presets_fit(lib, target, monkeypatch):
    monkeypatch.setenv("COURSE_TPU_COMPILE", "1")
    devices = tpu_devices(target)
    est = estimate(lib, lib.preset_for(devices), devices)
    show(f"{target}, preset_for (B={lib.preset_for(devices).global_batch})", est)
    assert est["fits"], (target, est["bytes_per_chip"] / 2**30)
    assert est["bytes_per_chip"] <= (1 - FREE) * est["hbm_gib"] * 2**30, (target, est["bytes_per_chip"] / 2**30)
    assert est["mfu"] >= 0.40, (target, est["mfu"])
    assert est["bytes_per_chip"] / 2**30 <= needs_gib(lib, devices), (target, "TPU_PER_DEVICE says less")
