"""`make bench` runs notebook 01's own code: its cells tagged `course-lib` (bench/course.py).

A smoke test of that view, so that renaming a notebook function (or a Config field, or a
keyword of `generate`) breaks `make test`, not a benchmark run days later. The names are read
from bench/'s sources (every `lib.NAME` and every field of the config they read), not listed
here by hand. Also: bench's own guards (unknown notebook names, correctness before speed).
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = sorted((ROOT / "bench").glob("*.py"))
# Used only when create_model returns the model alone (bench/minigpt.py `build`).
OPTIONAL = {"make_optimizer"}
CONFIG_VARS = r"(?:cfg|preset|base|gcfg)"

PROBE = """
import dataclasses, inspect, json, sys
sys.path.insert(0, sys.argv[1])
from bench.course import load_course_lib
lib = load_course_lib("01_minigpt")
names, fields = json.loads(sys.argv[2]), json.loads(sys.argv[3])
cfg = lib.preset_for()
print(json.dumps({
    "missing": [n for n in names if not hasattr(lib, n)],
    "not_callable": [n for n in names if hasattr(lib, n) and n[0].islower() and not callable(getattr(lib, n))],
    "config_missing": [f for f in fields if not hasattr(cfg, f)],
    "frozen": dataclasses.is_dataclass(cfg) and cfg.__dataclass_params__.frozen,
    "generate": list(inspect.signature(lib.generate).parameters),
    "restore": list(inspect.signature(lib.restore_checkpoint).parameters),
    "save": list(inspect.signature(lib.save_checkpoint).parameters),
}))
"""


def names_bench_uses() -> tuple[set[str], set[str]]:
    text = "\n".join(p.read_text() for p in BENCH)
    names = set(re.findall(r"\blib\.([A-Za-z_][A-Za-z0-9_]*)", text))
    fields = set(re.findall(rf"\b{CONFIG_VARS}\.([A-Za-z_][A-Za-z0-9_]*)", text)) - {"replace"}
    return names, fields


def test_bench_reads_the_names_it_uses_from_its_sources():
    names, fields = names_bench_uses()
    assert {"preset_for", "generate", "train_step", "restore_checkpoint", "gpt2_tokenizer"} <= names, names
    assert {"seq_len", "global_batch", "n_layers"} <= fields, fields


def test_course_lib_has_every_name_bench_uses():
    names, fields = names_bench_uses()
    out = subprocess.run([sys.executable, "-c", PROBE, str(ROOT), json.dumps(sorted(names - OPTIONAL)),
                          json.dumps(sorted(fields))], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"loading 01_minigpt's course-lib cells failed:\n{out.stderr[-3000:]}"
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert not found["missing"], f"bench/ uses names 01_minigpt's course-lib cells no longer define: {found['missing']}"
    assert not found["not_callable"], found["not_callable"]
    assert not found["config_missing"], f"bench/ reads Config fields that are gone: {found['config_missing']}"
    assert found["frozen"], "bench/ replaces fields of a frozen Config dataclass (dataclasses.replace)"
    # the keywords bench passes
    assert {"max_new", "temperature", "top_k", "stop_at_eot"} <= set(found["generate"]), found["generate"]
    assert found["save"][:5] == ["mngr", "step", "model", "optimizer", "data_iter"], found["save"]
    assert found["restore"][:5] == ["mngr", "cfg", "mesh", "data_iter", "step"], found["restore"]


def test_bench_refuses_unknown_notebook_names():
    from bench.nbval import select_notebooks

    assert [p.stem for p in select_notebooks(["00_setup"])] == ["00_setup"]
    with pytest.raises(SystemExit, match="no notebook named 00_stup"):
        select_notebooks(["00_setup", "00_stup"])
    with pytest.raises(SystemExit, match="selects no notebook"):
        select_notebooks([""])


# --- 06's trades (bench/memory.py) and the v5e-8 compile rows (bench/tpu.py): cheap versions ---

TINY = dict(V=64, D=32, N=2, H=16, F=64, L=2, T=16, B=8)


def test_remat_and_accumulation_rows_check_before_they_count():
    import jax

    from bench import memory

    devices = jax.devices()[:2]  # B=8 splits into K=4 micro-batches on 2 devices
    r = memory.remat(memory.Config(**TINY), repeats=1, devices=devices)
    assert r["full"]["flops"] > r["none"]["flops"] and r["full"]["temp_bytes"] < r["none"]["temp_bytes"], r
    assert r["grad_max_rel_diff"] <= r["grad_rtol"] and r["flops_ratio"] == r["full"]["flops"] / r["none"]["flops"]
    a = memory.accumulation(memory.Config(**TINY), devices=devices)
    assert list(a["K"]) == [1, 2, 4] and a["K"][4]["micro_batch"] == 2
    assert a["K"][1]["temp_bytes"] > a["K"][2]["temp_bytes"] > a["K"][4]["temp_bytes"], a
    assert all(v["grad_max_rel_diff"] <= a["grad_rtol"] for v in a["K"].values()), a


def test_remat_and_accumulation_refuse_other_gradients(monkeypatch):
    import jax

    from bench import memory
    from bench.minigpt import CheckFailed

    devices = jax.devices()[:2]
    with pytest.raises(ValueError, match="multiple of K x devices"):
        memory.Bench(memory.Config(**(TINY | {"B": 6})), devices)
    # Accumulation that leaves a row out: its loss and gradients are not the plain step's
    # (06's loss_and_grads, replaced in the loaded notebook code that the benchmark runs).
    lib = memory.lib()
    original = lib.loss_and_grads

    def drops_one(params, batch, c):  # the last row left out, the first counted twice in its place
        return original(params, batch.at[-1].set(batch[0]) if c.micro > 1 else batch, c)

    monkeypatch.setattr(lib, "loss_and_grads", drops_one)
    with pytest.raises(CheckFailed, match="K=2: loss .* != the plain step's"):
        memory.accumulation(memory.Config(**TINY), micro=(1, 2), devices=devices)

    def off_by_a_percent(params, batch, c):  # remat that changed the gradients, not the loss
        loss, grads = original(params, batch, c)
        return loss, jax.tree.map(lambda g: 1.01 * g, grads) if c.remat == "full" else grads

    monkeypatch.setattr(lib, "loss_and_grads", off_by_a_percent)
    with pytest.raises(CheckFailed, match="gradients differ from the plain step's"):
        memory.remat(memory.Config(**TINY), repeats=1, devices=devices)


def test_tpu_rows_fail_closed(monkeypatch):
    """A row without a compile says why; "does not fit" is a row, except for 01's shipped preset,
    which fails the run; any other compile failure raises (the section fails, bench exits 1)."""
    from types import SimpleNamespace

    from bench import tpu

    cfg = SimpleNamespace(global_batch=8, seq_len=16, d_model=32, n_heads=2, d_ff=64, n_layers=1,
                          vocab_size=128, compute_dtype="bfloat16")
    monkeypatch.setattr(tpu, "tpu_devices", lambda target: None)  # COURSE_TPU_COMPILE=0
    rows, details, failed = tpu.rows(None, {"tiny": cfg})
    assert rows[0]["result"] == "not compiled: COURSE_TPU_COMPILE=0" and not failed, rows
    rows, _, failed = tpu.rows(None, {tpu.SHIPPED: "01's Config cannot express it (no loss)"})
    assert list(failed) == [tpu.SHIPPED], failed

    def out_of_memory(lib, cfg, devices):
        return {"shape": "tiny", "mesh": {"data": 8}, "device_kind": "TPU v5 lite", "compile_s": 1.0,
                "bytes_per_chip": 17.2 * 2**30, "hbm_gib": 15.75, "model_flops_per_step": 1.0, "fits": False}

    monkeypatch.setattr(tpu, "tpu_devices", lambda target: ["a device"])
    monkeypatch.setattr(tpu, "estimate", out_of_memory)
    monkeypatch.setattr(tpu, "preset_note", lambda lib, cfg, devices: "")
    rows, _, failed = tpu.rows(None, {"tiny": cfg, tpu.SHIPPED: cfg})
    assert rows[0]["result"].startswith("DOES NOT FIT: the compiler needs 17.20 GiB"), rows
    assert list(failed) == [tpu.SHIPPED] and "does not fit" in failed[tpu.SHIPPED], failed

    def crashes(lib, cfg, devices):
        raise TypeError("an API changed")

    monkeypatch.setattr(tpu, "estimate", crashes)
    with pytest.raises(TypeError, match="an API changed"):
        tpu.rows(None, {"tiny": cfg})

    def wrong_loss(lib, cfg):
        raise tpu.CheckFailed("01's 'chunked' loss differs from the plain loss by 1.0e-01")

    monkeypatch.setattr(tpu, "chunked_loss_matches", wrong_loss)
    chunked = SimpleNamespace(**vars(cfg), loss="chunked", loss_chunks=4)
    rows, _, failed = tpu.rows(None, {"after": chunked})
    assert list(failed) == ["after"] and rows[0]["result"].startswith("not compiled: check failed: 01's"), rows


TPU_PROBE = """
import dataclasses, json, sys
sys.path.insert(0, sys.argv[1])
from bench import tpu
from bench.course import load_course_lib
devices = tpu.tpu_devices(tpu.TARGET)  # COURSE_TPU_COMPILE=1 (conftest): raises without libtpu
lib = load_course_lib("01_minigpt")
labels = list(tpu.configs(lib))
tiny = dataclasses.replace(tpu.configs(lib)[labels[0]], global_batch=8, seq_len=32, d_model=64,
                           n_heads=2, d_ff=128, n_layers=1)
rows, details, failed = tpu.rows(lib, {"tiny": tiny})
after = tpu.configs(lib)["01 v5e-8 preset, after"]
gap = tpu.chunked_loss_matches(lib, after) if not isinstance(after, str) and after.loss != "plain" else None
print(json.dumps({"labels": labels, "row": rows[0], "est": details["tiny"], "failed": failed,
                  "configs": {k: tpu.shape(c) for k, c in tpu.configs(lib).items()}, "loss_gap": gap}))
"""


def test_tpu_rows_compile_01s_step_for_a_v5e_8():
    """A tiny MiniGPT through the same code as the real rows (bench/tpu.py), for the v5e-8."""
    out = subprocess.run([sys.executable, "-c", TPU_PROBE, str(ROOT)], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    est, row = found["est"], found["row"]
    assert "error" not in est, est
    assert est["device_kind"] == "TPU v5 lite" and est["mesh"] == {"data": 4, "model": 2}, est
    assert 0 < est["bytes_per_chip"] < 15.75 * 2**30 and est["fits"], est
    assert est["roofline_s"] == max(est["flops_per_chip"] / 197e12, est["bytes_accessed_per_chip"] / 819e9)
    assert 0 < est["mfu"] < 1 and est["model_flops_per_step"] <= 8 * est["flops_per_chip"], est
    assert "TPU compiler estimate, not a measurement" in row["benchmark"], row
    assert found["configs"]["01 v5e-8 preset, before"].startswith("B=256 T=256 D=256 N=8 F=1024 L=8 V=50304 bfloat16")
    assert found["configs"]["seed architecture"].startswith("B=1536 T=256 D=256 N=8 F=256 L=4"), found["configs"]
    assert found["labels"] == ["01 v5e-8 preset, before", "seed architecture", "01 v5e-8 preset, after"]
    assert "see AFTER" not in found["configs"]["01 v5e-8 preset, after"], "01's Config cannot express AFTER"
    assert found["loss_gap"] is None or found["loss_gap"] <= 1e-5, found["loss_gap"]


SMOKE = """
import dataclasses, json, sys
sys.path.insert(0, sys.argv[1])
from bench import minigpt
from bench.course import load_course_lib
lib = load_course_lib("01_minigpt")
cfg = dataclasses.replace(lib.preset_for(), n_layers=1)
corpus = minigpt.Corpus(lib, cfg)
t = minigpt.train_step(lib, cfg, corpus, repeats=1, steps_per_repeat=1)
g = minigpt.generation(lib, cfg, corpus, max_new=8, repeats=1)
c = minigpt.checkpoint(lib, cfg, corpus, repeats=1)
p = minigpt.input_pipeline(lib, cfg, corpus, t["step_s"], batches=5)
print(json.dumps({"train": {k: t[k] for k in ("losses", "stream_share", "model_flops_per_step", "step_s")},
                  "generation": {k: g[k] for k in ("tokens_agree", "logits_max_rel_diff", "logits_rtol", "speedup")},
                  "checkpoint": c["restores_checked"], "pipeline": p["ratio"]}))
"""


def test_bench_minigpt_sections_run_and_check_at_a_tiny_size():
    """bench/minigpt.py's sections on 01's own code (CPU preset, one layer, a few tokens): what
    make bench checks before it counts runs in `make test` too (the harness review's N10)."""
    out = subprocess.run([sys.executable, "-c", SMOKE, str(ROOT)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    train, gen = found["train"], found["generation"]
    assert len(train["losses"]) == 4 and all(x == x for x in train["losses"]) and train["stream_share"] == 1.0
    assert train["model_flops_per_step"] > 0 and train["step_s"] > 0
    assert gen["tokens_agree"] == "8/8" and gen["logits_max_rel_diff"] <= gen["logits_rtol"] and gen["speedup"] > 0
    assert found["checkpoint"] == 2 and found["pipeline"] > 0


# --- 10's fine-tuning rows (bench/finetune.py) -------------------------------------------------

FINETUNE_PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from bench import finetune
from course.tpu import tpu_devices
import jax
m = finetune.measure(repeats=1)
left = not jax.sharding.get_abstract_mesh().empty  # 10's global mesh must not outlive the section
devices = tpu_devices(finetune.TARGET)  # COURSE_TPU_COMPILE=1 (conftest): raises without libtpu
ft = finetune.lib()
tpu = {k: finetune.compile_for(ft, k, 256, devices) for k in ("full", "QLoRA")}
print(json.dumps({"mesh": m["mesh"], "methods": m["methods"], "tpu": tpu, "D": ft.D, "mesh_left": left}))
"""


def test_finetune_rows_run_10s_code_and_compile_it_for_a_v5e_8():
    """bench/finetune.py on 10's own code: the three steps at its CPU preset, checked (finite
    losses, arguments QLoRA < LoRA < full, LoRA sends less), and two of them compiled for the
    v5e-8 at a small width through the code the real rows use."""
    out = subprocess.run([sys.executable, "-c", FINETUNE_PROBE, str(ROOT)], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    m, tpu = found["methods"], found["tpu"]
    assert list(m) == ["full", "LoRA", "QLoRA"] and found["mesh"] == {"data": 4, "model": 2}, found
    assert all(len(v["losses"]) == 2 and v["step_s"] > 0 for v in m.values()), m
    assert m["LoRA"]["trained"] == m["QLoRA"]["trained"] < m["full"]["trained"] / 10, m
    assert m["QLoRA"]["argument_bytes"] < m["LoRA"]["argument_bytes"] < m["full"]["argument_bytes"], m
    assert found["D"] == 64, "compile_for must leave 10's width as it found it"
    assert not found["mesh_left"], "10's global mesh outlived its section (the next one, 01's, ran into it)"
    assert all(t["fits"] and t["D"] == 256 and 0 < t["gib"] < 1 for t in tpu.values()), tpu
    assert tpu["QLoRA"]["gib"] < tpu["full"]["gib"] and tpu["QLoRA"]["params"] == tpu["full"]["params"], tpu


def test_finetune_largest_width_fails_closed(monkeypatch):
    """The ladder: up while a width fits, down while it does not; a width that fits must have its
    double refused; LoRA must fit at least full fine-tuning's width and QLoRA at least LoRA's."""
    from bench import finetune
    from bench.minigpt import CheckFailed

    def fake(limits):
        def compile_for(ft, method, width, devices):
            return {"D": width, "params": width, "gib": 1.0, "fits": width <= limits[method], "compile_s": 0}
        return compile_for

    starts = {"full": 8192, "LoRA": 16384, "QLoRA": 32768}
    monkeypatch.setattr(finetune, "compile_for", fake({"full": 4096, "LoRA": 16384, "QLoRA": 131072}))
    out = finetune.largest(ft=object(), start=starts, devices=[])
    assert {k: (v["largest"]["D"], v["refused"]["D"]) for k, v in out.items()} == {
        "full": (4096, 8192), "LoRA": (16384, 32768), "QLoRA": (131072, 262144)}, out
    assert list(out["full"]["tried"]) == [4096, 8192] and len(out["QLoRA"]["tried"]) == 4, out
    monkeypatch.setattr(finetune, "compile_for", fake({"full": 16384, "LoRA": 8192, "QLoRA": 131072}))
    with pytest.raises(CheckFailed, match="LoRA should fit at least"):
        finetune.largest(ft=object(), start=starts, devices=[])
    monkeypatch.setattr(finetune, "compile_for", fake({"full": 512, "LoRA": 16384, "QLoRA": 131072}))
    with pytest.raises(CheckFailed, match="full: no width from 1024 up fits"):
        finetune.largest(ft=object(), start=starts, devices=[])
