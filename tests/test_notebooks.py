"""Static checks of the committed notebooks: pairs in sync, hygiene, lint.

nbval (configured in pyproject.toml) executes the notebooks themselves; these tests
check what is committed without running a kernel.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parent.parent
MD = sorted((ROOT / "md").glob("*.md"))
IPYNB = sorted((ROOT / "notebooks").glob("*.ipynb"))
MAX_BYTES = 1_000_000
# Paths that would reveal the machine that produced an output.
MACHINE_PATHS = re.compile(r"(/work/|/root/|/home/[^/\s]+/|/Users/[^/\s]+/|[A-Z]:\\\\Users\\\\)")


def test_every_notebook_has_a_twin():
    assert MD, "md/ holds no notebooks"
    assert {p.stem for p in MD} == {p.stem for p in IPYNB}, "run `make sync` to create the missing twins"


@pytest.mark.parametrize("md", MD, ids=lambda p: p.stem)
def test_pair_in_sync(md):
    ipynb = ROOT / "notebooks" / f"{md.stem}.ipynb"
    a, b = jupytext.read(md).cells, jupytext.read(ipynb).cells
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        assert (x.cell_type, x.source.strip()) == (y.cell_type, y.source.strip()), (
            f"{md.stem}: cell {i} differs between md/ and notebooks/ "
            f"(md starts {x.source.strip()[:60]!r}, ipynb starts {y.source.strip()[:60]!r}); "
            "run `make sync`, then `make run NB={md.stem}`"
        )
        assert x.metadata.get("tags", []) == y.metadata.get("tags", []), f"{md.stem}: tags of cell {i} differ"
    assert len(a) == len(b), f"{md.stem}: {len(a)} cells in md/, {len(b)} in notebooks/"


@pytest.mark.parametrize("ipynb", IPYNB, ids=lambda p: p.stem)
def test_committed_outputs_are_clean(ipynb):
    assert ipynb.stat().st_size < MAX_BYTES, f"{ipynb.name} is {ipynb.stat().st_size} bytes (limit {MAX_BYTES})"
    nb = json.loads(ipynb.read_text())
    counts = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        assert cell.get("execution_count") is not None, f"{ipynb.stem}: code cell {i} never ran"
        counts.append(cell["execution_count"])
        tags = cell.get("metadata", {}).get("tags", [])
        for out in cell.get("outputs", []):
            if out["output_type"] == "error":
                assert "raises-exception" in tags, f"{ipynb.stem}: cell {i} has an error output: {out['ename']}"
            text = json.dumps(out)
            found = MACHINE_PATHS.search(text)
            assert not found, f"{ipynb.stem}: cell {i} output shows a machine path {found.group(0)!r}"
    assert counts == list(range(1, len(counts) + 1)), f"{ipynb.stem}: cells not executed once, in order"
    assert "colab" not in json.dumps(nb.get("metadata", {})), "Colab metadata in the notebook"


def test_md_has_no_editor_metadata():
    editor_keys = re.compile(r"^:?(colab|outputId|executionInfo|id):", re.MULTILINE)
    for md in MD:
        found = editor_keys.search(md.read_text())
        assert not found, f"{md.name} carries editor metadata ({found.group(0)!r}); run `make sync`"


def test_ruff():
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
