"""Load a notebook's library cells, so the benchmark runs the notebook's own code.

A notebook marks its definition cells (imports, config and presets, mesh, model, data
pipeline, train step, generation, checkpoint helpers) with the cell tag `course-lib`.
`load_course_lib` reads `md/NAME.md` with jupytext and executes those cells, in order, into
one namespace, exactly as a kernel would (IPython magics are translated, and only run if
the cell's own code reaches them, e.g. the Colab-only `%pip install`).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import jupytext
from IPython.core.inputtransformer2 import TransformerManager

ROOT = Path(__file__).resolve().parent.parent
TAG = "course-lib"


def library_cells(name: str) -> list[str]:
    """The sources of the `course-lib` code cells of md/NAME.md, in notebook order."""
    md = ROOT / "md" / f"{name}.md"
    if not md.exists():
        raise FileNotFoundError(f"{md.relative_to(ROOT)} does not exist: the benchmark needs notebook {name}")
    cells = [
        c.source
        for c in jupytext.read(md).cells
        if c.cell_type == "code" and TAG in c.metadata.get("tags", [])
    ]
    if not cells:
        raise RuntimeError(f"md/{name}.md has no code cell tagged {TAG!r}; the benchmark has nothing to load")
    return cells


def load_course_lib(name: str) -> types.ModuleType:
    """Execute the notebook's `course-lib` cells, in order, into a fresh module and return it.

    The module is registered in `sys.modules` (as `course_lib_NAME`) because dataclasses and
    pickling look classes up there.
    """
    transform = TransformerManager().transform_cell
    module = types.ModuleType(f"course_lib_{name}", f"The course-lib cells of md/{name}.md")
    sys.modules[module.__name__] = module
    for i, source in enumerate(library_cells(name)):
        code = compile(transform(source), f"<md/{name}.md course-lib cell {i}>", "exec")
        exec(code, module.__dict__)  # noqa: S102 - the course's own notebook code, by design
    return module
