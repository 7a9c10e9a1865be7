"""tools/execute.py's folds: the cells tagged `check` or `helper` open folded in JupyterLab,
Kaggle and (where a cell has a `# @title` line) Colab, by the site's rule, and the .md never
sees it. No kernel runs here: the notebooks are built in memory.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import jupytext
import nbformat
import pytest
from jupytext.config import load_jupytext_config
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def load_execute():
    sys.path.insert(0, str(ROOT / "tools"))
    spec = importlib.util.spec_from_file_location("course_execute", ROOT / "tools" / "execute.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXECUTE = load_execute()
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


def printed(text: str):
    return new_output("stream", name="stdout", text=text)


def sample() -> nbformat.NotebookNode:
    """One cell of each kind the rule tells apart."""
    return new_notebook(cells=[
        new_markdown_cell("# A lesson"),
        new_code_cell("x = 1\nprint(x)", outputs=[printed("1\n")]),  # lesson
        new_code_cell("# check: x is one\nassert x == 1\nprint('x == 1')", metadata={"tags": ["check"]},
                      outputs=[printed("x == 1\n")]),
        new_code_cell("# helper: install\n%pip install -q numpy", metadata={"tags": ["helper", "hide-output"]},
                      outputs=[printed("installed\n")]),
        new_code_cell("# helper: where this runs\nprint('cpu')", metadata={"tags": ["helper"]},
                      outputs=[printed("cpu\n")]),
        new_code_cell("# helper: draw\nplot()", metadata={"tags": ["helper"]},
                      outputs=[new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure>"})]),
        new_code_cell("# @title Check: the loss goes down\nassert True",
                      metadata={"tags": ["check", "hide-cell", "raises-exception"]}),
        # a cell that was folded and is no longer tagged
        new_code_cell("y = 2", metadata={"jupyter": {"source_hidden": True}, "_kg_hide-input": True}),
    ])


def test_fold_cells_follows_the_site_rule():
    nb = sample()
    assert EXECUTE.fold_cells(nb) == 5
    lesson, check, install, where, draw, titled, untagged = (c.metadata for c in nb.cells[1:])
    assert "jupyter" not in lesson and "_kg_hide-input" not in lesson, "a lesson cell was folded"
    # a check or a helper: source folded, what it prints or draws in view
    for meta in (check, where, draw):
        assert meta["jupyter"] == {"source_hidden": True} and meta["_kg_hide-input"] is True
        assert "_kg_hide-output" not in meta
    # MyST-NB's hide-output / hide-cell on a helper or check fold the output too
    for meta in (install, titled):
        assert meta["jupyter"] == {"source_hidden": True, "outputs_hidden": True}
        assert meta["_kg_hide-output"] is True
    # Colab's form view only for a cell with a title line
    assert titled["cellView"] == "form"
    assert all("cellView" not in m for m in (check, install, where, draw))
    # untagged again: unfolded
    assert "jupyter" not in untagged and "_kg_hide-input" not in untagged
    assert titled["tags"] == ["check", "hide-cell", "raises-exception"], "tags must stay as they were"


def test_folds_stay_out_of_the_md_and_the_pair_stays_in_sync(tmp_path):
    """What execute.py writes: the .ipynb carries the folds, the .md (jupytext.toml's filter)
    only sources and tags, so tests/test_notebooks.py::test_pair_in_sync still holds."""
    nb = sample()
    EXECUTE.fold_cells(nb)
    ipynb, md = tmp_path / "x.ipynb", tmp_path / "x.md"
    nbformat.write(nb, ipynb)
    assert "source_hidden" in ipynb.read_text() and "_kg_hide-input" in ipynb.read_text()
    jupytext.write(jupytext.read(ipynb), md, fmt="md:myst", config=load_jupytext_config(str(ROOT)))
    text = md.read_text()
    for key in ("source_hidden", "outputs_hidden", "_kg_hide", "cellView", "jupyter:"):
        assert key not in text, f"{key} leaked into the .md"
    assert ":tags: [check]" in text
    a, b = jupytext.read(md).cells, jupytext.read(ipynb).cells
    assert [(c.cell_type, c.source.strip(), c.metadata.get("tags", [])) for c in a] == [
        (c.cell_type, c.source.strip(), c.metadata.get("tags", [])) for c in b]
    # and syncing the .md back into the .ipynb (execute.py's first step) keeps the outputs
    EXECUTE.sync(md, ipynb)
    again = nbformat.read(ipynb, as_version=4)
    assert [c.get("outputs") for c in again.cells] == [c.get("outputs") for c in nb.cells]


def test_fold_only_rewrites_metadata_not_outputs(tmp_path, monkeypatch):
    nb = sample()
    (tmp_path / "notebooks").mkdir()
    path = tmp_path / "notebooks" / "x.ipynb"
    nbformat.write(nb, path)
    monkeypatch.setattr(EXECUTE, "ROOT", tmp_path)
    EXECUTE.main(["--fold", "x"])
    after = nbformat.read(path, as_version=4)
    assert after.cells[2].metadata["jupyter"]["source_hidden"] is True
    assert [c.get("outputs") for c in after.cells] == [c.get("outputs") for c in nb.cells]


@pytest.mark.parametrize("ipynb", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_notebook_opens_folded(ipynb):
    """The committed .ipynb folds what the site folds (Kaggle and JupyterLab read this)."""
    nb = json.loads(ipynb.read_text())
    for number, cell in enumerate((c for c in nb["cells"] if c["cell_type"] == "code"), start=1):
        meta = cell.get("metadata", {})
        mode = EXECUTE.FOLD_RULE(meta.get("tags", []))
        hidden = meta.get("jupyter", {})
        want = ({"source_hidden": True, "outputs_hidden": True} if mode in ("all", "input+output")
                else {"source_hidden": True} if mode else {})
        got = {k: v for k, v in hidden.items() if k in ("source_hidden", "outputs_hidden")}
        assert got == want, (
            f"{ipynb.stem}: code cell {number} ({''.join(cell['source'])[:50]!r}, tags "
            f"{meta.get('tags', [])}) should open with {want or 'nothing folded'}, has {got}; run "
            f"`.venv/bin/python tools/execute.py --fold {ipynb.stem}` (or `make run NB={ipynb.stem}`)")
        # Colab folds only a cell in form view: a `# @title` first line and cellView: form. A cell
        # magic (`%%writefile`) must stay on the first line, so such a cell cannot fold on Colab.
        if mode and not "".join(cell["source"]).startswith("%%"):
            where = f"{ipynb.stem}: code cell {number} ({''.join(cell['source'])[:50]!r})"
            assert EXECUTE.COLAB_TITLE.match("".join(cell["source"]).lstrip()), (
                f"{where} is folded elsewhere but not on Colab: start it with a `# @title <what it does>` line "
                f"in md/{ipynb.stem}.md")
            assert meta.get("cellView") == "form", f"{where}: run `.venv/bin/python tools/execute.py --fold {ipynb.stem}`"
