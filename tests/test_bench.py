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
