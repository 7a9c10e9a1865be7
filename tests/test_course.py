"""The course's machinery (course/*.py), tested once, and its copies in the notebooks.

Every notebook carries copies of the modules it uses (tools/course_cells.py writes them): the
first tests check that no copy was edited by hand, that a change to a source reaches every copy
with one command, and that the install pins are requirements.txt's. The rest test the modules
themselves, in seconds, outside nbval.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
import course_cells  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
NOTEBOOKS = sorted((ROOT / "md").glob("*.md")) + sorted((ROOT / "notebooks").glob("*.ipynb"))


# --- the copies ------------------------------------------------------------------------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_copy_matches_its_source(path):
    found = course_cells.problems(path)
    assert not found, "\n".join(found)


def test_every_module_has_a_notebook_and_the_machinery_is_not_written_out_by_hand():
    """Each module serves a notebook, and no notebook defines one of the shared helpers itself."""
    text = {p.stem: p.read_text() for p in (ROOT / "md").glob("*.md")}
    for name in course_cells.modules():
        assert any(f"# >>> course/{name}.py" in t for t in text.values()), f"course/{name}.py: no notebook uses it"
    shared = ["tpu_devices", "load_stories", "gpt2_tokenizer", "mesh_shape_for", "where", "compile_or_oom",
              "matmul_flops", "collectives", "memory_bytes", "expect_error"]
    for stem, t in text.items():
        outside = course_cells.BLOCK.sub("", t)
        for name in shared:
            assert f"def {name}(" not in outside and f"class {name}" not in outside, (
                f"md/{stem}.md defines {name} by hand: use the copy of course/*.py (make sync)")


def test_a_hand_edit_to_a_copy_fails_and_make_sync_restores_it(tmp_path):
    md = next(p for p in (ROOT / "md").glob("*.md") if "# >>> course/tpu.py" in p.read_text())
    edited = tmp_path / md.name
    text = md.read_text()
    edited.write_text(text.replace('"Kaggle v5e-8": ("v5e:2x4", (2, 4, 1))', '"Kaggle v5e-8": ("v5e:2x2", (2, 2, 1))', 1))
    assert edited.read_text() != text
    assert any("copy of course/tpu.py differs from the source" in p for p in course_cells.problems(edited))
    assert course_cells.rewrite(edited) and edited.read_text() == text and not course_cells.problems(edited)


def test_a_one_line_change_in_a_source_reaches_every_notebook_with_one_command(tmp_path, monkeypatch):
    """Edit course/tpu.py (a copy of the tree), run the tool once: every notebook that uses it changes."""
    shutil.copytree(ROOT / "course", tmp_path / "course")
    shutil.copytree(ROOT / "md", tmp_path / "md")
    source = tmp_path / "course" / "tpu.py"
    source.write_text(source.read_text().replace('"Colab v5e-1": ("v5e:1x1"', '"Colab v5e-1 (one chip)": ("v5e:1x1"'))
    monkeypatch.setattr(course_cells, "ROOT", tmp_path)
    monkeypatch.setattr(course_cells, "COURSE", tmp_path / "course")
    users = [p for p in (tmp_path / "md").glob("*.md") if "# >>> course/tpu.py" in p.read_text()]
    assert course_cells.main([]) == 0
    assert users and all('"Colab v5e-1 (one chip)"' in p.read_text() for p in users)
    others = [p for p in (tmp_path / "md").glob("*.md") if p not in users]
    assert all(p.read_text() == (ROOT / "md" / p.name).read_text() for p in others)


def test_a_block_without_its_dependency_is_reported(tmp_path):
    nb = tmp_path / "x.md"
    nb.write_text(course_cells.copy_of("tpu") + "\n")
    assert any("needs course/hlo.py" in p for p in course_cells.problems(nb))


def pins(path: Path) -> dict[str, str]:
    found = re.findall(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^\s#]+)", path.read_text(), re.M)
    return {name.lower().replace("_", "-"): version for name, version in found}


def test_the_install_pins_are_requirements_txt_s():
    from course import stack

    required, frozen = pins(ROOT / "requirements.txt"), pins(ROOT / "constraints.txt")
    assert stack.JAX_PIN == required["jax"] == required["jaxlib"]
    for package, version in stack.PINS.items():
        assert required.get(package, frozen.get(package)) == version, (package, version)
    calls = [m for p in (ROOT / "md").glob("*.md") for m in re.findall(r"^install\(([^)]*)\)", p.read_text(), re.M)]
    assert len(calls) == len(list((ROOT / "md").glob("*.md"))), "every notebook installs its stack"
    for call in calls:
        assert all(name in stack.PINS for name in re.findall(r'"([^"]+)"', call)), call


# --- stack and mesh --------------------------------------------------------------------------

def test_check_pin_refuses_another_jax_unless_a_maintainer_says_so(monkeypatch, capsys):
    from course import stack

    stack.check_pin(stack.JAX_PIN)
    with pytest.raises(RuntimeError, match="pinned to JAX"):
        stack.check_pin("0.11.2")
    monkeypatch.setenv("COURSE_ANY_JAX", "1")
    stack.check_pin("0.11.2")
    assert "WARNING" in capsys.readouterr().out
    monkeypatch.setattr(stack, "ON_COLAB_OR_KAGGLE", True)  # readers stay on the pin
    with pytest.raises(RuntimeError, match="pinned to JAX"):
        stack.check_pin("0.11.2")


def test_install_does_nothing_here_and_refuses_an_unpinned_package():
    from course import stack

    assert stack.install("flax", "optax") is None
    with pytest.raises(ValueError, match="no pin"):
        stack.install("torch")


@pytest.mark.parametrize("before, after", [
    ("", "--xla_force_host_platform_device_count=8"),
    ("--xla_foo", "--xla_foo --xla_force_host_platform_device_count=8"),
    ("--xla_force_host_platform_device_count=2", "--xla_force_host_platform_device_count=2"),
])
def test_emulate_devices_keeps_a_count_already_chosen(monkeypatch, before, after):
    from course import stack

    monkeypatch.setattr(stack, "HAS_TPU", False)
    monkeypatch.setattr(stack, "HAS_GPU", False)
    monkeypatch.setenv("XLA_FLAGS", before)
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    stack.emulate_devices()
    assert os.environ["XLA_FLAGS"] == after and os.environ["JAX_PLATFORMS"] == "cpu"


@pytest.mark.parametrize("n, inner, shape", [(1, 2, (1, 1)), (2, 2, (1, 2)), (4, 2, (2, 2)), (8, 2, (4, 2)),
                                             (8, 4, (2, 4)), (2, 4, (1, 2)), (16, 2, (8, 2))])
def test_mesh_shape_for(n, inner, shape):
    from course.mesh import mesh_shape_for

    assert mesh_shape_for(n, inner) == shape


@pytest.mark.parametrize("n", [0, 3, 6, 12])
def test_mesh_shape_for_refuses_what_the_course_cannot_split(n):
    from course.mesh import mesh_shape_for

    with pytest.raises(ValueError, match="power of two"):
        mesh_shape_for(n)


# --- data --------------------------------------------------------------------------------------

class _Response:
    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def read(self, n):
        chunk, self.at = self.data[self.at:self.at + n], self.at + n
        return chunk

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_first_stories_stops_at_the_end_of_a_story_across_chunks():
    from course.data import first_stories

    text = "".join(f"story {i}\n<|endoftext|>\n" for i in range(10))
    chunks = [text[i:i + 7] for i in range(0, len(text), 7)]  # separators split across chunks
    assert first_stories(chunks, 3) == "".join(f"story {i}\n<|endoftext|>" for i in range(3)).replace(
        "<|endoftext|>story", "<|endoftext|>\nstory")
    assert first_stories(chunks, None) == text and first_stories(chunks, 99) == text


def test_load_stories_downloads_once_then_reads_the_file(tmp_path, monkeypatch):
    import urllib.request

    from course.data import load_stories

    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path / "data"))
    served = "".join(f"Story {i}: Zoé found a café.\n<|endoftext|>\n" for i in range(2000)).encode()
    fetched = []
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: fetched.append(url) or _Response(served))
    text, source = load_stories("valid")
    assert (text.encode(), source) == (served, "TinyStories") and fetched[0].endswith("TinyStories-valid.txt")
    assert not list((tmp_path / "data").glob("*.part")), "the partial file was renamed"
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: (_ for _ in ()).throw(OSError("offline")))
    assert load_stories("valid") == (text, "TinyStories"), "the second call reads the file"
    assert load_stories("valid", max_stories=5)[0].count("<|endoftext|>") == 5


def test_load_stories_with_max_stories_downloads_only_the_head(tmp_path, monkeypatch):
    import urllib.request

    from course.data import load_stories

    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path))
    served = "".join(f"Story {i}: a café.\n<|endoftext|>\n" for i in range(1_200_000)).encode()
    assert len(served) > 2 * (1 << 24), "more than two of the loader's 16 MiB reads"
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: _Response(served))
    text, source = load_stories("train", max_stories=100_000)
    assert source == "TinyStories" and text.count("<|endoftext|>") == 100_000
    assert not (tmp_path / "TinyStories-train.txt").exists(), "a part of the file must not pass for all of it"
    assert (tmp_path / "TinyStories-train-first100000.txt").stat().st_size < len(served)


def test_load_stories_offline_fails_fast_and_says_what_to_do(tmp_path, monkeypatch):
    """The real urlopen under the tests' no-network environment (conftest.py): it fails at once."""
    import time

    from course.data import load_stories

    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path / "empty"))
    start = time.perf_counter()
    with pytest.raises(RuntimeError, match="make data") as info:
        load_stories("valid")
    assert time.perf_counter() - start < 30 and isinstance(info.value.__cause__, OSError)
    assert not list((tmp_path / "empty").glob("TinyStories-*")), "nothing is left behind"


# --- collectives and memory of a compiled program ---------------------------------------------

def _mesh(shape=(4, 2), names=("data", "model")):
    import jax
    import numpy as np
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape), names)


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("hlo-*.txt")))
def test_the_collectives_reader_counts_each_loop_iteration(fixture):
    """tests/fixtures/make_hlo.py's 3-layer scan, DP over data (4) and TP over model (2): per
    step, each layer all-reduces its row-parallel output over `model` forward and backward, and
    its two weight gradients over `data` (one tuple op); all inside the while loop."""
    from course.hlo import collectives, tally

    ops = collectives((FIXTURES / fixture).read_text(), _mesh(), strict=True)
    assert all(op.runs == 3 for op in ops), [(op.kind, op.runs) for op in ops]
    assert tally(ops, "kind", "axes", "backward") == {
        ("all-reduce", "model", False): 3, ("all-reduce", "model", True): 3, ("all-reduce", "data", True): 3}
    # XLA:CPU and the TPU send the two gradients as one tuple op, XLA:GPU concatenates them
    assert tally(ops, "axes", weight="tensors") == {"model": 6, "data": 3 if "gpu" in fixture else 6}
    dtype_bytes = 2 if "bf16[" in (FIXTURES / fixture).read_text() else 4
    data_op = next(op for op in ops if op.axes == "data")
    assert data_op.result_bytes == 2 * 64 * 64 * dtype_bytes  # two [D, F/Y] = [64, 64] gradients
    assert data_op.sent_bytes == 2 * 3 / 4 * data_op.result_bytes  # a ring all-reduce over 4


@pytest.mark.parametrize("line, groups", [
    ("all-reduce(%a), replica_groups={{0,1},{2,3},{4,5},{6,7}}", [[0, 1], [2, 3], [4, 5], [6, 7]]),
    ("all-reduce(%a), replica_groups=[4,2]<=[8]", [[0, 1], [2, 3], [4, 5], [6, 7]]),
    ("all-reduce(%a), replica_groups=[2,4]<=[4,2]T(1,0)", [[0, 2, 4, 6], [1, 3, 5, 7]]),
    ("all-gather(%a), replica_groups=mesh['data'=4,'model'=2] {'data'}", [[0, 2, 4, 6], [1, 3, 5, 7]]),
    ("all-reduce(%a), replica_groups={}", [list(range(8))]),
    ("collective-permute(%a), source_target_pairs={{0,2},{2,4},{4,6},{1,3},{3,5},{5,7}}",
     [[0, 2, 4, 6], [1, 3, 5, 7]]),
])
def test_every_spelling_of_device_groups(line, groups):
    from course.hlo import device_groups, mesh_axes

    assert sorted(device_groups(line, 8)) == groups
    assert mesh_axes(groups, _mesh()) in ("data", "model", "data+model")


def test_an_all_reduce_over_no_mesh_axis_is_refused_on_the_cpu_and_named_elsewhere():
    from course.hlo import collectives

    line = "ENTRY %main () -> f32[] {\n  %x = f32[8]{0} all-reduce(f32[8]{0} %a), replica_groups={{0,3},{1,2},{4,7},{5,6}}\n}"
    with pytest.raises(ValueError, match="no mesh axes explain"):
        collectives(line, _mesh(), strict=True)
    assert collectives(line, _mesh(), strict=False)[0].axes == "other"


def test_memory_bytes_of_a_compiled_step():
    import jax
    import jax.numpy as jnp

    from course.hlo import memory_bytes

    compiled = jax.jit(lambda x: x * 2, donate_argnums=0).lower(jnp.ones((1024,), jnp.float32)).compile()
    assert memory_bytes(compiled) == 4096  # the output reuses the donated input's buffer


def test_stored_bytes_are_the_shards_on_the_cpu_and_whole_tiles_on_a_tpu(monkeypatch):
    """On XLA:CPU each device stores exactly its shards; compiled for a v5e-8, a narrow matrix and
    a vector are padded to whole tiles, and a step's arguments are exactly those padded bytes."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from course import tpu
    from course.hlo import stored_bytes

    cpu_mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    x = jax.device_put(jnp.ones((8, 4), jnp.float32), NamedSharding(cpu_mesh, P("data")))
    assert stored_bytes(x, {"v": jnp.ones(3, jnp.int32)}) == 4 * 4 * 4 + 3 * 4
    monkeypatch.setenv("COURSE_TPU_COMPILE", "1")
    mesh = Mesh(np.array(tpu.tpu_devices("Kaggle v5e-8")).reshape(4, 2), ("data", "model"))
    narrow = jax.ShapeDtypeStruct((64, 257), jnp.int32, sharding=NamedSharding(mesh, P("data")))
    vector = jax.ShapeDtypeStruct((50304,), jnp.float32, sharding=NamedSharding(mesh, P()))
    assert stored_bytes(narrow) == 16 * 384 * 4 > 16 * 257 * 4  # 257 columns stored as 3 x 128
    assert stored_bytes(vector) == 51200 * 4 > 50304 * 4  # whole tiles of 1,024
    step = jax.jit(lambda b, v: (b + 1).sum() * v).lower(narrow, vector).compile()
    assert step.memory_analysis().argument_size_in_bytes == stored_bytes(narrow, vector)


def test_ragged_dot_at_highest_contracts_in_float32_on_a_tpu(monkeypatch):
    """09 checks its sorted (dropless) dispatch, two `jax.lax.ragged_dot`s, against the dense
    reference at "highest" precision and a float32 tolerance. On a TPU ragged_dot is a Mosaic
    kernel, not an XLA dot: compiled for a v5e, its contraction must follow the precision asked
    for, bfloat16 passes by default and float32 at "highest". (The kernel's MLIR spells the
    precision; a libtpu that spells it otherwise fails here, and the claim needs a new look.)"""
    import base64
    import re

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from course import tpu

    monkeypatch.setenv("COURSE_TPU_COMPILE", "1")
    mesh = Mesh(np.array(tpu.tpu_devices("Kaggle v5e-8")[:1]), ("x",))
    E, D, F = 8, 64, 256  # 09's expert count and widths
    args = (jax.ShapeDtypeStruct((512, D), jnp.float32), jax.ShapeDtypeStruct((E, D, F), jnp.float32),
            jax.ShapeDtypeStruct((E,), jnp.int32))
    whole = NamedSharding(mesh, P())
    contract = {}
    for precision in ("default", "highest"):
        with jax.default_matmul_precision(precision):
            hlo = jax.jit(jax.lax.ragged_dot, in_shardings=whole, out_shardings=whole).lower(*args).compile().as_text()
        bodies = [base64.b64decode(b).decode() for b in re.findall(r'"body":"([A-Za-z0-9+/=]+)"', hlo)]
        assert bodies, f"ragged_dot compiled for a TPU without a Mosaic kernel at {precision!r}: look again"
        contract[precision] = set(re.findall(r"contract_precision<(\w+)>", "".join(bodies)))
    assert contract == {"default": {"bf16"}, "highest": {"fp32"}}, contract


def test_plan_mesh_is_the_mesh_off_a_tpu_and_the_hosts_cpu_on_one(monkeypatch, capsys):
    """On a TPU a toy model's temporaries live in on-chip memory that memory_analysis() leaves out
    (compiled for a v5e-8: 0 bytes of HBM temporaries for 08's attention at T = 1,024, while
    XLA:CPU counts its [B, N, T, T] buffers), so its memory plan is read from the host's CPU."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh

    from course import hlo, tpu

    mesh = jax.make_mesh((4, 2), ("data", "model"))
    assert hlo.plan_mesh(mesh) is mesh
    monkeypatch.setenv("COURSE_TPU_COMPILE", "1")
    on_tpu = Mesh(np.array(tpu.tpu_devices("Kaggle v5e-8")).reshape(4, 2), ("data", "model"))
    cpu = hlo.plan_mesh(on_tpu)
    assert cpu.devices.flat[0].platform == "cpu" and dict(cpu.shape) == dict(on_tpu.shape)
    assert cpu.axis_types == on_tpu.axis_types and "VMEM" in capsys.readouterr().out
    # Why: the gradient of a small scanned network keeps 3 MiB of temporaries on XLA:CPU and none
    # in a v5e's HBM: its buffers sit in memory space S(1), the on-chip VMEM
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def grad(w, x):
        layers = lambda w: jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, w)[0].sum()  # noqa: E731
        return jax.grad(layers)(w)

    def temps(mesh):
        w = jax.ShapeDtypeStruct((4, 256, 256), jnp.float32, sharding=NamedSharding(mesh, P()))
        x = jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=NamedSharding(mesh, P()))
        compiled = jax.jit(grad).lower(w, x).compile()
        return compiled.memory_analysis().temp_size_in_bytes, compiled.as_text()

    (on_cpu, _), (on_v5e, hlo_text) = temps(cpu), temps(on_tpu)
    assert on_cpu >= 2**20 and on_v5e == 0 and "S(1)" in hlo_text, (on_cpu, on_v5e)


# --- FLOPs -------------------------------------------------------------------------------------

def test_matmul_flops_counts_loops_remat_and_shard_map():
    import functools

    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from course.flops import matmul_flops

    mm = 2 * 64 * 128 * 128
    assert matmul_flops(lambda x, w: x @ w, jnp.ones((64, 128)), jnp.ones((128, 128))) == mm

    def stack(ws, x, remat=False):
        layer = lambda h, w: (jnp.tanh(h @ w), None)  # noqa: E731
        layer = jax.checkpoint(layer, policy=jax.checkpoint_policies.nothing_saveable) if remat else layer
        return jax.lax.scan(layer, x, ws)[0].sum()

    ws, x = jax.ShapeDtypeStruct((6, 128, 128), jnp.float32), jax.ShapeDtypeStruct((64, 128), jnp.float32)
    assert matmul_flops(stack, ws, x) == 6 * mm  # the compiler's cost_analysis counts 1 x mm
    assert matmul_flops(jax.grad(stack), ws, x) == 6 * 3 * mm  # forward, dx, dW
    assert matmul_flops(jax.grad(functools.partial(stack, remat=True)), ws, x) == 6 * 4 * mm
    mesh = jax.make_mesh((4, 2), ("x", "y"))
    f = jax.shard_map(lambda a: jax.lax.psum(a.T @ a, "x"), mesh=mesh, in_specs=P("x"), out_specs=P())
    a = jax.ShapeDtypeStruct((64, 16), jnp.float32, sharding=NamedSharding(mesh, P("x")))
    assert matmul_flops(f, a) == 8 * 2 * 16 * 16 * 16  # each of the 8 devices: its [16, 16] block
    with pytest.raises(ValueError, match="while loop"):
        matmul_flops(lambda a, n: jax.lax.while_loop(lambda c: c[1] < n, lambda c: (c[0] @ a, c[1] + 1), (a, 0))[0],
                     jnp.ones((4, 4)), 3)


def test_matmul_flops_agrees_with_xla_cpu_on_an_unrolled_step():
    """Where the compiler counts everything (XLA:CPU, no loop), it finds the matmuls plus a few
    percent of elementwise work."""
    import jax
    import jax.numpy as jnp

    from course.flops import matmul_flops

    def loss(ws, x):
        for w in ws:
            x = jax.nn.gelu(x @ w)
        return jnp.mean(x ** 2)

    args = ([jnp.ones((256, 256))] * 3, jnp.ones((128, 256)))
    ours = matmul_flops(jax.grad(loss), *args)
    xla = jax.jit(jax.grad(loss)).lower(*args).compile().cost_analysis()["flops"]
    assert ours <= xla <= 1.05 * ours, (ours, xla)


def test_peak_flops_table():
    from course.flops import peak_flops

    assert peak_flops("TPU v5 lite")[0] == 197e12 and peak_flops("NVIDIA H100 80GB HBM3")[0] == 989e12
    assert peak_flops("NVIDIA H100 PCIe")[0] == 756e12 and peak_flops("NVIDIA GB200")[0] == 2.5e15
    assert peak_flops("cpu") is None


# --- TPU compiles fail closed ------------------------------------------------------------------

@pytest.fixture
def tpu(monkeypatch):
    from course import tpu

    monkeypatch.delenv("COURSE_TPU_COMPILE", raising=False)
    return tpu


def test_tpu_devices_skips_when_switched_off(tpu, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_TPU_COMPILE", "0")
    assert tpu.tpu_devices() is None and "COURSE_TPU_COMPILE=0" in capsys.readouterr().out


def test_tpu_devices_without_libtpu_skips_for_a_reader_and_fails_when_required(tpu, monkeypatch, capsys):
    real = tpu.importlib.util.find_spec
    monkeypatch.setattr(tpu.importlib.util, "find_spec", lambda name: None if name == "libtpu" else real(name))
    assert tpu.tpu_devices() is None and "libtpu is not installed" in capsys.readouterr().out
    monkeypatch.setenv("COURSE_TPU_COMPILE", "1")
    with pytest.raises(tpu.TPUCompileUnavailable, match="COURSE_TPU_COMPILE=1 but libtpu is not installed"):
        tpu.tpu_devices()


@pytest.mark.parametrize("switch", [None, "1"])
def test_tpu_devices_raises_the_cause_of_any_other_failure(tpu, monkeypatch, switch):
    """A renamed argument or a lockfile clash must fail, not skip: every TPU claim rests on it."""
    if switch:
        monkeypatch.setenv("COURSE_TPU_COMPILE", switch)

    def renamed(**kwargs):
        raise TypeError("get_topology_desc() got an unexpected keyword argument 'topology_name'")

    monkeypatch.setattr(tpu.topologies, "get_topology_desc", renamed)
    with pytest.raises(tpu.TPUCompileUnavailable, match="unexpected keyword argument") as info:
        tpu.tpu_devices()
    assert isinstance(info.value.__cause__, TypeError)


def test_tpu_devices_compile_for_a_kaggle_v5e_8(tpu, monkeypatch):
    monkeypatch.setenv("COURSE_TPU_COMPILE", "1")
    devices = tpu.tpu_devices("Kaggle v5e-8")
    assert len(devices) == 8 and {d.device_kind for d in devices} == {"TPU v5 lite"}


class _Lowered:
    def __init__(self, error):
        self.error = error

    def compile(self):
        raise self.error


def test_does_it_fit_means_the_compiler_ran_out_of_memory(tpu, monkeypatch):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    monkeypatch.setenv("COURSE_TPU_COMPILE", "1")
    mesh = Mesh(np.array(tpu.tpu_devices("Kaggle v5e-8")).reshape(4, 2), ("data", "model"))

    def lowered(rows):
        x = jax.ShapeDtypeStruct((8, rows, 4096), jnp.float32, sharding=NamedSharding(mesh, P()))
        return jax.jit(lambda x: (x * 2).sum()).lower(x)

    compiled, gib = tpu.compile_or_oom(lowered(1024))
    assert compiled is not None and 0.1 < gib < 1
    assert tpu.compile_or_oom(lowered(2 ** 17)) == (None, 16.0)  # 16 GiB of temporaries > 15.75
    assert tpu.compile_or_oom(lowered(2 ** 26)) == (None, 8192.0)  # the compiler says "(8.00T)"
    for error in (TypeError("an API changed"), jax.errors.JaxRuntimeError("INTERNAL: the compiler crashed")):
        with pytest.raises(type(error)):
            tpu.compile_or_oom(_Lowered(error))


# --- checks --------------------------------------------------------------------------------

def test_expect_error_names_its_error(capsys):
    import jax.numpy as jnp
    import numpy as np

    from course.checks import expect_error

    with expect_error(ValueError):
        raise ValueError("shown")
    assert capsys.readouterr().out == "ValueError: shown\n"
    with pytest.raises(AssertionError, match="nothing was raised"):
        with expect_error(ValueError):
            pass
    with pytest.raises(NameError):  # a typo is not the error the cell shows
        with expect_error(ValueError, jax=True):
            undefined_name  # noqa: B018, F821
    with pytest.raises(TypeError):
        with expect_error(jax=True):
            jnp.ones(3) + np.ones(4).tolist().__getitem__("x")
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((4, 2), ("data", "model"))
    x = jax.device_put(np.ones((8, 4), np.float32), NamedSharding(mesh, P("data", "model")))
    w = jax.device_put(np.ones((4, 6), np.float32), NamedSharding(mesh, P("model", None)))
    with expect_error(jax=True) as shown:  # ShardingTypeError: no public import path
        x @ w
    assert type(shown.error).__name__ == "ShardingTypeError"


def test_tolerances_follow_the_number_format():
    import numpy as np

    from course.checks import assert_close, tolerance

    assert tolerance("bfloat16", 1) == 2 * 2.0 ** -8 and tolerance("float32", 10) == 20 * 2.0 ** -24
    expected = np.array([1.0, -1.0, 1e-6])
    assert_close(expected + 1e-3, expected, "bfloat16", 1, "within one bf16 rounding of the scale")
    with pytest.raises(AssertionError, match="more than float32 allows"):
        assert_close(expected + 1e-3, expected, "float32", 100, "x")
    with pytest.raises(AssertionError, match="not finite"):
        assert_close(np.array([np.nan]), np.array([1.0]), "bfloat16", 1, "x")


def test_matmul_format_per_backend():
    from types import SimpleNamespace as Device

    from course.checks import matmul_format

    assert matmul_format(Device(platform="tpu", device_kind="TPU v5 lite")) == "bfloat16"
    assert matmul_format(Device(platform="gpu", device_kind="NVIDIA H200")) == "tensorfloat32"
    assert matmul_format(Device(platform="gpu", device_kind="Tesla T4")) == "float32"
    assert matmul_format(Device(platform="cpu", device_kind="cpu")) == "float32"
    assert matmul_format(Device(platform="tpu", device_kind="x"), "bfloat16") == "bfloat16"


def test_the_module_list_in_course_init_is_complete():
    doc = (ROOT / "course" / "__init__.py").read_text()
    assert all(f"- {name}.py:" in doc for name in course_cells.modules())
    assert json.loads("[]") == []  # keeps json imported for the ipynb readers above
    assert subprocess.run([sys.executable, str(ROOT / "tools" / "course_cells.py"), "--list"],
                          capture_output=True, text=True).returncode == 0


# --- figures -----------------------------------------------------------------------------------

@pytest.mark.parametrize("devices", [1, 2, 4])
def test_the_parallel_matmul_figure_draws_the_collectives_it_names(devices, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from course import figures

    assert figures.parallel_matmul_collectives("column") == {"forward": ["all-gather"], "backward": ["all-reduce"]}
    assert figures.parallel_matmul_collectives("column", gather=False)["forward"] == []
    assert figures.parallel_matmul_collectives("row") == {"forward": ["all-reduce"], "backward": []}
    assert figures.parallel_matmul_collectives("mlp") == {"forward": ["all-reduce"], "backward": ["all-reduce"]}
    fig, drawn = figures.parallel_matmuls_figure(figures.KINDS, devices=devices, backward=True)
    assert drawn == [figures.parallel_matmul_collectives(k) for k in figures.KINDS]
    texts = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
    assert "all-reduce" in texts and "all-gather" in texts
    fig.savefig(tmp_path / "f.png")
    with pytest.raises(ValueError, match="choose one of"):
        figures.parallel_matmul_collectives("diagonal")
    assert "import jax" not in (ROOT / "course" / "figures.py").read_text()
