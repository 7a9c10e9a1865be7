"""Static checks of the committed notebooks: pairs in sync, hygiene, lint.

nbval (configured in pyproject.toml) executes the notebooks themselves; these tests
check what is committed without running a kernel.
"""

import difflib
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
# Paths that would reveal the machine that produced an output (tools/execute.py scrubs the
# course's own; temporary folders are printed relative or by name only).
MACHINE_PATHS = re.compile(
    r"(/work/|/root/|/home/[^/\s]+/|/Users/[^/\s]+/|[A-Z]:\\\\Users\\\\|/content/|/kaggle/"
    r"|/var/folders/|/opt/conda/|/tmp/tmp)")


def test_every_notebook_has_a_twin():
    assert MD, "md/ holds no notebooks"
    assert {p.stem for p in MD} == {p.stem for p in IPYNB}, "run `make sync` to create the missing twins"


def describe(cells, i: int) -> str:
    """'cell 12 (code, under "## The mesh ...")': where a reader finds cell i."""
    heading = next((line for c in reversed(cells[:i + 1]) if c.cell_type == "markdown"
                    for line in c.source.splitlines() if line.startswith("#")), "the top")
    return f"cell {i} ({cells[i].cell_type}, under {heading.strip()[:60]!r})"


@pytest.mark.parametrize("md", MD, ids=lambda p: p.stem)
def test_pair_in_sync(md):
    ipynb = ROOT / "notebooks" / f"{md.stem}.ipynb"
    a, b = jupytext.read(md).cells, jupytext.read(ipynb).cells
    fix = f"edit md/{md.name}, then `make sync` and `make run NB={md.stem}`"
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if (x.cell_type, x.source.strip()) != (y.cell_type, y.source.strip()):
            diff = difflib.unified_diff(y.source.strip().splitlines(), x.source.strip().splitlines(),
                                        f"notebooks/{ipynb.name}", f"md/{md.name}", lineterm="", n=1)
            pytest.fail(f"{md.stem}: {describe(a, i)} differs ({y.cell_type} in the .ipynb); {fix}\n"
                        + "\n".join(list(diff)[:30]))
        assert x.metadata.get("tags", []) == y.metadata.get("tags", []), (
            f"{md.stem}: the tags of {describe(a, i)} differ; {fix}")
    if len(a) != len(b):
        longer, name = (a, "md/") if len(a) > len(b) else (b, "notebooks/")
        pytest.fail(f"{md.stem}: {len(a)} cells in md/, {len(b)} in notebooks/; the first extra one, in "
                    f"{name}, is {describe(longer, min(len(a), len(b)))}; {fix}")


@pytest.mark.parametrize("ipynb", IPYNB, ids=lambda p: p.stem)
def test_committed_outputs_are_clean(ipynb):
    assert ipynb.stat().st_size < MAX_BYTES, f"{ipynb.name} is {ipynb.stat().st_size} bytes (limit {MAX_BYTES})"
    nb = json.loads(ipynb.read_text())
    counts = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        where = f"{ipynb.stem}: code cell {len(counts) + 1} ({''.join(cell['source'])[:50]!r})"
        assert cell.get("execution_count") is not None, f"{where} never ran; `make run NB={ipynb.stem}`"
        counts.append(cell["execution_count"])
        tags = cell.get("metadata", {}).get("tags", [])
        errors = [out for out in cell.get("outputs", []) if out["output_type"] == "error"]
        # Both ways: an error only where the tag allows one, and a tagged cell must show one
        # (otherwise the tag lets a demonstration that stopped failing pass unnoticed).
        if errors:
            assert "raises-exception" in tags, f"{where} has an error output: {errors[0]['ename']}"
        if "raises-exception" in tags:
            assert errors, (f"{where} is tagged raises-exception but its output has no error: the error "
                            "it shows stopped happening; fix the cell or drop the tag")
        for out in cell.get("outputs", []):
            found = MACHINE_PATHS.search(json.dumps(out))
            assert not found, f"{where}: its output shows a machine path {found.group(0)!r}"
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


@pytest.mark.parametrize("ipynb", IPYNB, ids=lambda p: p.stem)
def test_no_committed_output_skipped_a_tpu_compile(ipynb):
    """The committed outputs come from `make run`, where every compile for a TPU must run
    (COURSE_TPU_COMPILE=1): an output that says it skipped one was made on the wrong path."""
    for cell in json.loads(ipynb.read_text())["cells"]:
        for out in cell.get("outputs", []):
            text = json.dumps(out)
            for words in ("Cannot compile for", "Skipping the compile for"):
                assert words not in text, f"{ipynb.stem}: an output says {words!r}: run `make run NB={ipynb.stem}`"


# --- A lesson reads only what the reader has seen --------------------------------------------

def _bound(statements) -> tuple[set[str], set[str]]:
    """(names a cell binds at the top level by def, class or import; by assignment)."""
    import ast

    defined, assigned = set(), set()
    for node in statements:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
        else:
            for child in ast.walk(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                    continue
                if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
                    assigned.add(child.id)
            for inner in ("body", "orelse", "finalbody", "handlers"):
                d, a = _bound(getattr(node, inner, []) or [])
                defined, assigned = defined | d, assigned | a
    return defined, assigned


def _reads(tree) -> set[str]:
    """Global names a cell reads: every loaded name, less those a function, lambda or
    comprehension binds for itself."""
    import ast

    reads = set()

    def visit(node, local: frozenset):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            names = {a.arg for a in args.args + args.kwonlyargs + args.posonlyargs}
            names |= {a.arg for a in (args.vararg, args.kwarg) if a}
            body = node.body if isinstance(node.body, list) else [node.body]
            names |= {n.id for b in body for n in ast.walk(b) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            for d in getattr(node, "decorator_list", []) + args.defaults + args.kw_defaults:
                if d is not None:
                    visit(d, local)
            for b in body:
                visit(b, local | names)
            return
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            names = {n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
            for child in ast.iter_child_nodes(node):
                visit(child, local | names)
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in local:
            reads.add(node.id)
        for child in ast.iter_child_nodes(node):
            visit(child, local)

    visit(tree, frozenset())
    return reads


def folded_only_reads(path) -> list[str]:
    """Names a lesson cell reads that, up to that cell, only folded cells define: a check's
    variables, or a helper's lowercase variables (its functions, classes, imports and
    UPPER_CASE tables are machinery the lesson may call by name)."""
    import ast

    seen_lesson, seen_helper_code, seen_folded = set(), set(), set()
    found = []
    for i, cell in enumerate(jupytext.read(path).cells):
        if cell.cell_type != "code" or cell.source.lstrip().startswith("%%"):
            continue
        source = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        defined, assigned = _bound(tree.body)
        tags = set(cell.metadata.get("tags", []))
        if tags & {"check", "helper"}:
            seen_folded |= defined | assigned
            if "helper" in tags:
                seen_helper_code |= defined | {n for n in assigned if n.isupper()}
            continue
        hidden = (_reads(tree) & seen_folded) - seen_lesson - seen_helper_code - defined - assigned
        found += [f"{path.stem}: cell {i} reads {name!r}, which only folded cells define" for name in sorted(hidden)]
        seen_lesson |= defined | assigned
    return found


@pytest.mark.parametrize("md", MD, ids=lambda p: p.stem)
def test_a_lesson_reads_no_name_that_only_folded_cells_define(md):
    found = folded_only_reads(md)
    assert not found, "\n".join(found[:20])


@pytest.mark.parametrize("ipynb", IPYNB, ids=lambda p: p.stem)
def test_every_check_and_helper_cell_is_folded(ipynb):
    """Where the .ipynb is opened (Colab, Kaggle, JupyterLab) a check or helper is folded: its
    metadata says so (tools/execute.py writes it; a `jupytext --sync` alone drops it)."""
    for i, cell in enumerate(json.loads(ipynb.read_text())["cells"]):
        meta = cell.get("metadata", {})
        if cell["cell_type"] == "code" and {"check", "helper"} & set(meta.get("tags", [])):
            assert meta.get("jupyter", {}).get("source_hidden") and meta.get("_kg_hide-input"), (
                f"{ipynb.stem}: code cell {i} is not folded: `make sync` (or tools/execute.py --fold)")
