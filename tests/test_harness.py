"""The test harness itself: checks that cannot pass by accident.

* a cell tagged `raises-exception` must raise under nbval (conftest.py), and in the
  committed outputs (tests/test_notebooks.py);
* `make test` fails when pytest collects nothing;
* tools/execute.py syncs, executes, scrubs paths and stops at an unexpected error.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))


def code_cell(source: str, *tags: str):
    cell = nbformat.v4.new_code_cell(source)
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def write_notebook(path: Path, *cells) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = list(cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


@pytest.fixture
def scratch():
    """A folder under the repository (so that conftest.py and pyproject.toml apply), git-ignored."""
    folder = ROOT / ".cache" / "harness" / f"{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    yield folder
    for p in sorted(folder.rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    folder.rmdir()


def test_a_raises_exception_cell_that_stops_raising_fails_under_nbval(scratch):
    nb = write_notebook(
        scratch / "raises.ipynb",
        code_cell("print('this used to raise')", "raises-exception"),
        code_cell("raise ValueError('still raises')", "raises-exception"),
        code_cell("print('an ordinary cell')"),
    )
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", str(nb.relative_to(ROOT))],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    summary = out.stdout.strip().splitlines()[-1]
    assert out.returncode == 1 and "1 failed, 2 passed" in summary, out.stdout[-3000:]
    assert "Cell 0 is tagged raises-exception but raised nothing" in out.stdout, out.stdout[-3000:]


def test_every_spelling_of_raises_exception_must_raise_and_a_timeout_is_not_an_error(scratch):
    """nbval honours the marker on any comment line (after a Colab title too) and the tag
    nbval-raises-exception; the hook reads nbval's own option, so each must raise. A cell that
    hangs until nbval's timeout raised KeyboardInterrupt, not its error: that fails too."""
    nb = write_notebook(
        scratch / "spellings.ipynb",
        code_cell("# @title shows an error\n# NBVAL_RAISES_EXCEPTION\nprint('stopped raising')"),
        code_cell("print('stopped raising too')", "nbval-raises-exception"),
        code_cell("import time\ntime.sleep(60)", "raises-exception"),
    )
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "--nbval-cell-timeout=5",
                          str(nb.relative_to(ROOT))], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout[-3000:]
    assert out.stdout.count("raised nothing") >= 2, out.stdout[-3000:]
    assert "but timed out" in out.stdout, out.stdout[-3000:]


def test_a_committed_raises_exception_cell_without_an_error_output_fails(tmp_path, monkeypatch):
    import test_notebooks

    nb = nbformat.v4.new_notebook()
    cell = code_cell("print('no error')", "raises-exception")
    cell.execution_count = 1
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="no error\n")]
    nb.cells = [cell]
    path = tmp_path / "tagged.ipynb"
    nbformat.write(nb, path)
    with pytest.raises(AssertionError, match="tagged raises-exception but its output has no error"):
        test_notebooks.test_committed_outputs_are_clean(path)


def test_make_test_fails_when_pytest_collects_nothing():
    out = subprocess.run(["make", "-s", "test", "ARGS=tests/test_harness.py -k no_test_has_this_name"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0, out.stdout
    assert "make test: FAILED: pytest collected no tests" in out.stdout, out.stdout + out.stderr


# --------------------------------------------------------------------------------------
# tools/execute.py
# --------------------------------------------------------------------------------------

MD = """\
---
jupyter:
  jupytext:
    formats: ipynb,md:myst
  kernelspec:
    display_name: Python 3
    language: python
    name: python3
---

# A notebook

```{code-cell} ipython3
import os, sys
print(len(os.environ["XLA_FLAGS"]) > 0, os.getcwd().endswith("notebooks"))
print(sys.executable)
```
"""


@pytest.fixture
def course(tmp_path, monkeypatch):
    import execute

    (tmp_path / "md").mkdir()
    (tmp_path / "notebooks").mkdir()
    monkeypatch.setattr(execute, "ROOT", tmp_path)
    return execute, tmp_path


def test_execute_syncs_runs_and_writes_back_without_machine_paths(course):
    execute, root = course
    (root / "md" / "a.md").write_text(MD)
    seconds = execute.execute("a")
    assert seconds > 0
    nb = json.loads((root / "notebooks" / "a.ipynb").read_text())
    (cell,) = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert cell["execution_count"] == 1
    text = "".join(cell["outputs"][0]["text"])
    assert text.startswith("True True\n"), "course environment set, kernel started in notebooks/"
    assert str(Path.home()) not in text, f"the home folder is scrubbed: {text!r}"
    assert "print(sys.executable)" in (root / "md" / "a.md").read_text(), "the .md is written back"


def test_execute_stops_at_an_untagged_error_and_lets_a_tagged_one_pass(course):
    from nbclient.exceptions import CellExecutionError

    execute, root = course
    tagged = MD + "\n```{code-cell} ipython3\n:tags: [raises-exception]\n\nraise KeyError('on purpose')\n```\n"
    (root / "md" / "t.md").write_text(tagged)
    execute.execute("t")
    out = json.loads((root / "notebooks" / "t.ipynb").read_text())["cells"]
    assert any(o["output_type"] == "error" for c in out for o in c.get("outputs", []))
    (root / "md" / "u.md").write_text(MD.replace("import os, sys", "import os, sys\n1 / 0"))
    with pytest.raises(CellExecutionError, match="ZeroDivisionError"):
        execute.execute("u")


def test_execute_refuses_an_unknown_notebook(course):
    execute, _ = course
    with pytest.raises(SystemExit, match="no such notebook: md/nope.md"):
        execute.execute("nope")


def test_scrub_paths_replaces_the_machine_paths():
    import execute

    nb = nbformat.v4.new_notebook()
    cell = code_cell("x")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"{ROOT}/md/a.md {Path.home()}/x\n"),
                    nbformat.v4.new_output("error", ename="E", evalue=f"{ROOT}/y",
                                           traceback=[f"File {ROOT}/z.py"])]
    nb.cells = [cell]
    execute.scrub_paths(nb)
    blob = json.dumps(nb.cells[0]["outputs"])
    assert str(ROOT) not in blob and "<course>/md/a.md" in blob and "~/x" in blob, blob


def test_every_cap_names_a_notebook_that_reads_it():
    """A cap in tools/run_notebooks.py that its notebook no longer reads (a renamed variable, a
    notebook that stopped calling `capped`) would let `make test-1`, `test-2` and `test-presets`
    run it at full length, or silently not at the length the caps promise."""
    import run_notebooks

    runs = list(run_notebooks.CAPS.items())
    runs += [(name, caps) for name, _, caps, _ in run_notebooks.PRESET_RUNS]
    for name, caps in runs:
        source = (ROOT / "md" / f"{name}.md").read_text()
        for variable in caps:
            if variable == "CPU_DEVICES":
                continue
            assert f'"{variable}"' in source, f"{name} does not read {variable}"


def test_run_notebooks_devices_needs_a_count():
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "run_notebooks.py"), "devices"],
                            capture_output=True, text=True)
    assert result.returncode != 0 and "give the device count" in result.stderr


def test_an_accelerator_run_orders_every_notebook_and_checks_jobs():
    """JOBS > 1 starts the longest notebooks first: a notebook missing from LONGEST_FIRST would
    start last and could outlast a short loan of a GPU. A JOBS that is not a count is refused."""
    import run_notebooks

    names = {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert set(run_notebooks.LONGEST_FIRST) == names, names ^ set(run_notebooks.LONGEST_FIRST)
    assert run_notebooks.jobs("1") == 1
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "run_notebooks.py"), "accelerator"],
                            capture_output=True, text=True, env={**os.environ, "JOBS": "four"})
    assert result.returncode != 0 and "give a count of notebooks" in result.stderr, result.stderr


def test_a_live_log_shows_each_cells_time_and_a_failure_as_it_happens(tmp_path):
    """COURSE_LIVE_LOG=1 (run_notebooks' logs): a failure's message is written when the failing
    test ends, before the next test starts, not only in the summary a killed run never prints."""
    (tmp_path / "test_two.py").write_text(
        "def test_fails():\n    assert 1 + 1 == 3, 'the message we need'\n\n\ndef test_next():\n    pass\n")
    result = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "conftest",
                             "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_two.py")],
                            capture_output=True, text=True, cwd=tmp_path,
                            env={**os.environ, "COURSE_LIVE_LOG": "1", "PYTHONPATH": str(ROOT)})
    out = result.stdout
    assert result.returncode == 1 and "the message we need" in out, out
    live = out.index("the message we need")
    assert live < out.index("test_next") < out.index("= FAILURES ="), out
    assert re.search(r"^    call \d+\.\d s$", out, re.MULTILINE), out


def test_a_live_log_keeps_what_each_notebook_cell_printed(scratch):
    """COURSE_LIVE_LOG=1 under nbval: each cell's printed output follows its time, so a run whose
    outputs are not compared (a lent GPU, a preset in CI) keeps its losses in the log; a cell that
    fails keeps what it printed before its error; a long output keeps its end."""
    nb = write_notebook(
        scratch / "printed.ipynb",
        code_cell("print('step 1: loss 10.84')\nprint('step 2: loss 9.63')"),
        code_cell("print('x' * 5000 + 'the end')"),
        code_cell("print('loss nan')\nraise FloatingPointError('not finite')"),
    )
    out = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:randomly", str(nb.relative_to(ROOT))],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "COURSE_LIVE_LOG": "1"}).stdout
    assert re.search(r"^    call \d+\.\d s\n    \| step 1: loss 10\.84\n    \| step 2: loss 9\.63$", out, re.MULTILINE), out
    assert re.search(r"^    \| \.\.\.x+the end$", out, re.MULTILINE), out
    assert "    | loss nan" in out and out.index("    | loss nan") < out.index("not finite"), out
