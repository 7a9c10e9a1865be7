"""01's GPU presets, sized for cards that are not attached: each compiled for its GPU and checked
to fit, and to be the largest batch that fits.

01's `preset_for` picks a GPU's batch from the card's memory with a linear model of its step
(`GPU_STEP_GIB`: GiB per device = fixed + per sequence x sequences), up to 3/4 of what JAX may
allocate. Here that step is compiled by XLA's GPU compiler for each card described in
tools/gpu_specs/ (jax-cuda12-plugin with JAX_PLATFORMS=cpu: nothing runs) and its memory read
from the compiled program. The GPU compiler does not refuse a program too large for the card
(see CONTRIBUTING.md), so the fit is this comparison.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from bench.course import load_course_lib  # noqa: E402
from course.hlo import memory_bytes  # noqa: E402

SPECS = sorted((ROOT / "tools" / "gpu_specs").glob("*.txtpb"))
MEM_FRACTION = 0.75  # what JAX preallocates of a GPU's memory by default (XLA_PYTHON_CLIENT_MEM_FRACTION)


@pytest.fixture(scope="module")
def lib():
    return load_course_lib("01_minigpt")


def gpu(spec: Path):
    """A GPU described by `spec`, for compiling only, and what JAX may allocate on it."""
    text = spec.read_text()
    memory = int(re.search(r"device_memory_size:\s*(\d+)", text).group(1))
    try:
        devices = topologies.get_topology_desc(platform="cuda", target_config=text, topology="1x1x1").devices
    except Exception as error:  # noqa: BLE001 - the cause is re-raised with what to do
        raise RuntimeError(f"cannot compile for the GPU in {spec.name} ({error}); the test needs "
                           "jax-cuda12-plugin (requirements.txt) and JAX_PLATFORMS=cpu (make test sets it)") from error
    return devices, int(MEM_FRACTION * memory)


def step_bytes(lib, cfg, devices) -> int:
    """Bytes per device of 01's train step for `cfg`, compiled for `devices`."""
    mesh = lib.make_mesh(cfg, devices)
    model, optimizer = lib.abstract_model(cfg, mesh)
    batch = jax.ShapeDtypeStruct((cfg.global_batch, cfg.seq_len + 1), jnp.int32,
                                 sharding=NamedSharding(mesh, P("data", None)))
    with jax.set_mesh(mesh):
        return memory_bytes(lib.train_step.lower(model, optimizer, batch).compile())


def check_bytes(lib, cfg, devices, batch: int) -> int:
    """Bytes per device of 01's float32 equivalence checks' largest computation: the plain loss's
    value and gradients on the float32 twin, at "highest", on `batch` sequences."""
    cfg32 = dataclasses.replace(cfg, compute_dtype="float32", loss="plain", global_batch=batch)
    mesh = lib.make_mesh(cfg32, devices)
    model, _ = lib.abstract_model(cfg32, mesh)
    tokens = jax.ShapeDtypeStruct((batch, cfg.seq_len + 1), jnp.int32,
                                  sharding=NamedSharding(mesh, P("data", None)))
    with jax.set_mesh(mesh), jax.default_matmul_precision("highest"):
        return memory_bytes(nnx.jit(nnx.value_and_grad(lib.loss_fn)).lower(model, tokens).compile())


def test_there_are_gpu_specs_for_the_readers_cards():
    names = " ".join(p.stem for p in SPECS)
    for card in ("t4", "l4", "a100", "h100", "h200"):
        assert card in names, f"tools/gpu_specs/ has no spec for a {card.upper()}: {names}"


# Compiled for real: the smallest card (a T4: no bfloat16 units, so the float32 preset) and an
# H100 (bfloat16), each at its preset's batch and at twice it. Each compile takes about 15 s on 2
# cores; the other cards are checked against the line through these two points.
COMPILED = {"float32": "tesla_t4", "bfloat16": "h100_80gb_hbm3"}


@pytest.fixture(scope="module")
def measured(lib):
    """Per dtype: the card compiled, its preset, and GiB per device at B and 2B sequences."""
    out = {}
    for dtype, stem in COMPILED.items():
        devices, allocatable = gpu(ROOT / "tools" / "gpu_specs" / f"{stem}.txtpb")
        cfg = lib.preset_for(devices, memory_bytes=allocatable, platform="gpu")
        assert cfg.compute_dtype == dtype, (stem, cfg.compute_dtype)
        sizes = {b: step_bytes(lib, dataclasses.replace(cfg, global_batch=b), devices) / 2**30
                 for b in (cfg.global_batch, 2 * cfg.global_batch)}
        print(f"{devices[0].device_kind} ({dtype}): " + ", ".join(f"B={b}: {g:.2f} GiB" for b, g in sizes.items()))
        out[dtype] = (stem, allocatable, cfg, sizes)
    return out


@pytest.mark.parametrize("dtype", sorted(COMPILED))
def test_the_compiled_step_fits_its_card_and_twice_the_batch_does_not(lib, measured, dtype):
    stem, allocatable, cfg, sizes = measured[dtype]
    budget = 3 / 4 * allocatable / 2**30  # preset_for leaves a quarter to cuBLAS workspaces and fragmentation
    b = cfg.global_batch
    assert sizes[b] <= budget, (stem, b, sizes, budget)
    assert sizes[2 * b] > budget or 2 * b > lib.GPU_MAX_PER_DEVICE, (stem, sizes, budget)


@pytest.mark.parametrize("dtype", sorted(COMPILED))
def test_the_memory_model_preset_for_uses_bounds_the_compilers(lib, measured, dtype):
    """GPU_STEP_GIB (fixed + per sequence) never under the compiled GiB by more than 2% (the
    fit rests on it), and at most 15% over it at 256 sequences or fewer, where the presets of all
    but the largest card live (at 512 on an H100 it is 13% over: XLA reuses more buffers)."""
    _, _, _, sizes = measured[dtype]
    fixed, per_sequence = lib.GPU_STEP_GIB[dtype]
    for b, compiled in sizes.items():
        model = fixed + per_sequence * b
        assert model >= 0.98 * compiled, (dtype, b, compiled, model)
        assert b > 256 or model <= 1.15 * compiled, (dtype, b, compiled, model)


@pytest.mark.parametrize("spec", SPECS, ids=[p.stem for p in SPECS])
def test_every_cards_preset_is_the_largest_batch_the_model_fits(lib, spec):
    """Every card in tools/gpu_specs/: its preset, sized by preset_for from the card's memory, is
    the largest power of two whose step, by GPU_STEP_GIB (checked above against the compiler),
    takes at most 3/4 of what JAX may allocate."""
    devices, allocatable = gpu(spec)
    cfg = lib.preset_for(devices, memory_bytes=allocatable, platform="gpu")
    fixed, per_sequence = lib.GPU_STEP_GIB[cfg.compute_dtype]
    gib = lambda b: fixed + per_sequence * b  # noqa: E731
    budget = 3 / 4 * allocatable / 2**30
    b = cfg.global_batch
    print(f"{devices[0].device_kind}: {cfg.compute_dtype}, B={b}: about {gib(b):.2f} of {budget:.2f} GiB")
    assert gib(b) <= budget, (spec.stem, b, gib(b), budget)
    assert gib(2 * b) > budget or 2 * b > lib.GPU_MAX_PER_DEVICE, (spec.stem, b, gib(2 * b), budget)


@pytest.mark.parametrize("dtype", sorted(COMPILED))
def test_01s_float32_checks_fit_beside_the_preset(lib, measured, dtype):
    """01's float32 checks (chunked vs plain loss; one device vs the mesh) run on CHECK_SEQUENCES
    per `data` device: compiled for the card, that fits beside the preset's step, within what JAX
    may allocate. On the preset's whole batch it need not (printed): the H200 ran out of memory in
    2026-11-27's run, when the chunked-vs-plain check took the whole batch in float32."""
    stem, allocatable, cfg, sizes = measured[dtype]
    devices, _ = gpu(ROOT / "tools" / "gpu_specs" / f"{stem}.txtpb")
    n_data = lib.mesh_shape_for(len(devices), cfg.model_parallel)[0]
    few, whole = lib.CHECK_SEQUENCES * n_data, cfg.global_batch
    gib = {b: check_bytes(lib, cfg, devices, b) / 2**30 for b in (few, whole)}
    print(f"{devices[0].device_kind}: the float32 check takes {gib[few]:.2f} GiB on {few} sequences, "
          f"{gib[whole]:.2f} GiB on the preset's {whole} (beside a {sizes[whole]:.2f} GiB step; JAX may "
          f"allocate {allocatable / 2**30:.2f} GiB)")
    assert few < whole and gib[few] + sizes[whole] <= allocatable / 2**30, (stem, gib, sizes, allocatable)


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_an_accelerator_run_trains_01_long_enough_for_its_learning_checks(lib, platform):
    """tools/run_notebooks.py trains 01's accelerator presets for ACCELERATOR_CAPS' steps: at
    least two log windows after the warmup, where 01 asserts that the loss falls and beats the best
    context-free model. Fewer would leave those checks unrun on the accelerator."""
    sys.path.insert(0, str(ROOT / "tools"))
    import run_notebooks

    steps = int(run_notebooks.ACCELERATOR_CAPS["01_minigpt"]["COURSE_MAX_STEPS"])
    cfg = lib.preset_for(jax.devices()[:1], memory_bytes=16 * 2**30, platform=platform)
    window = min(cfg.log_every, steps // 2)  # the capped run's log cadence (01's caps cell)
    assert cfg.warmup_steps + 2 * window <= steps < cfg.steps, (platform, steps, cfg.warmup_steps, window)
