"""Execute notebooks in place, as `make run` does, and print each one's wall time.

    python tools/execute.py                 # every notebook, in order
    python tools/execute.py 01_minigpt      # one (name without extension)
    python tools/execute.py --fold NAME...  # only refresh the folds' metadata (no execution)

For each notebook: the md/ twin is synced into notebooks/ (so edits to the .md are
picked up), the .ipynb is executed top to bottom in a fresh kernel with the course's
offline environment (8 emulated CPU devices unless CPU_DEVICES or XLA_FLAGS say
otherwise), the outputs are written back, and the .md is re-synced.
Cells tagged `raises-exception` may fail; any other error stops with the cell shown.

Cells tagged `check` or `helper` are written folded (see fold_cells): the editors read that
from the .ipynb's cell metadata, which jupytext.toml keeps out of the .md.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import time
from pathlib import Path

import ipykernel.kernelspec
import jupytext
import nbformat
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager
from jupytext.config import load_jupytext_config
from nbclient import NotebookClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
import course_cells  # noqa: E402
import offline  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CELL_TIMEOUT_S = 600


def _docs_conf():
    """docs/conf.py, which holds the one rule of what a fold hides (fold_mode), for the site
    and for the notebooks alike."""
    spec = importlib.util.spec_from_file_location("course_docs_conf", ROOT / "docs" / "conf.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    return conf


FOLD_RULE = _docs_conf().fold_mode
# Colab shows a cell in "form" view (its `# @title` line and a "Show code" link, the code
# hidden) when the cell's metadata says cellView: form and its first line is a title.
COLAB_TITLE = re.compile(r"^#\s*@title\b")


def fold_cells(nb) -> int:
    """Fold the cells tagged `check` or `helper` wherever the .ipynb is opened, as the site
    does (docs/conf.py's fold_mode says what a fold hides): JupyterLab and Kaggle's editor hide
    the source (`jupyter.source_hidden`), and the output where the rule folds it too
    (`jupyter.outputs_hidden`); Kaggle's viewer reads `_kg_hide-input` / `_kg_hide-output`;
    Colab folds only a cell whose first line is `# @title ...` (`cellView: form`). Cells no
    longer tagged lose these keys. Returns the number of folded cells."""
    folded = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        meta = cell.metadata
        jupyter = meta.get("jupyter", {})
        for key in ("source_hidden", "outputs_hidden"):
            jupyter.pop(key, None)
        for key in ("_kg_hide-input", "_kg_hide-output", "cellView"):
            meta.pop(key, None)
        mode = FOLD_RULE(meta.get("tags", []))
        if mode:
            folded += 1
            jupyter["source_hidden"] = meta["_kg_hide-input"] = True
            if mode in ("all", "input+output"):
                jupyter["outputs_hidden"] = meta["_kg_hide-output"] = True
            if COLAB_TITLE.match(cell.source.lstrip()):
                meta["cellView"] = "form"
        if jupyter:
            meta["jupyter"] = jupyter
        else:
            meta.pop("jupyter", None)
    return folded


def sync(md: Path, ipynb: Path) -> None:
    """Write the .md's cells into the .ipynb, keeping outputs of unchanged cells."""
    text_nb = jupytext.read(md)
    if ipynb.exists():
        old = nbformat.read(ipynb, as_version=4)
        text_nb = jupytext.combine.combine_inputs_with_outputs(text_nb, old, fmt="md:myst")
    jupytext.write(text_nb, ipynb, fmt="ipynb")


def scrub_paths(nb) -> None:
    """Replace this machine's paths in outputs (tracebacks name library files) by neutral ones."""
    site = Path(nbformat.__file__).resolve().parent.parent  # .../site-packages
    replacements = [(str(site), "<site-packages>"), (str(ROOT), "<course>"), (str(Path.home()), "~")]
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            for key in ("text", "evalue"):
                if key in out:
                    for old, new in replacements:
                        out[key] = out[key].replace(old, new)
            if "traceback" in out:
                for old, new in replacements:
                    out["traceback"] = [line.replace(old, new) for line in out["traceback"]]
            for mime, value in out.get("data", {}).items():
                if mime.startswith("text/") and isinstance(value, str):
                    for old, new in replacements:
                        value = value.replace(old, new)
                    out["data"][mime] = value


class ThisPython(KernelSpecManager):
    """Run every kernel on this interpreter (the .venv), whatever kernels the user installed."""

    def get_kernel_spec(self, kernel_name):
        return self.kernel_spec_class(resource_dir=ipykernel.kernelspec.RESOURCES,
                                      **ipykernel.kernelspec.get_kernel_dict())


def execute(name: str) -> float:
    md, ipynb = ROOT / "md" / f"{name}.md", ROOT / "notebooks" / f"{name}.ipynb"
    if not md.exists():
        raise SystemExit(f"no such notebook: {md.relative_to(ROOT)}")
    course_cells.rewrite(md)  # the copies of course/*.py, as `make sync` writes them
    sync(md, ipynb)
    nb = nbformat.read(ipynb, as_version=4)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    client = NotebookClient(
        nb,
        km=KernelManager(kernel_name="python3", kernel_spec_manager=ThisPython()),
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(ROOT / "notebooks")}},
        record_timing=False,
    )
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    scrub_paths(nb)
    fold_cells(nb)
    nbformat.write(nb, ipynb)
    # jupytext.toml's metadata filters, as `make sync` applies them (no YAML header in the .md)
    jupytext.write(jupytext.read(ipynb), md, fmt="md:myst", config=load_jupytext_config(str(ROOT)))
    return seconds


def fold_only(names: list[str]) -> None:
    """Refresh the folds' metadata of committed notebooks without executing them (their
    outputs, which the rule looks at, are the committed ones)."""
    for name in names or sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb")):
        ipynb = ROOT / "notebooks" / f"{name}.ipynb"
        if not ipynb.exists():
            raise SystemExit(f"no such notebook: {ipynb.relative_to(ROOT)}")
        nb = nbformat.read(ipynb, as_version=4)
        print(f"{name:<36s} {fold_cells(nb):4d} cells folded", flush=True)
        nbformat.write(nb, ipynb)


def main(names: list[str]) -> None:
    if names[:1] == ["--fold"]:
        return fold_only(names[1:])
    os.environ.update(offline.course_env())
    names = names or sorted(p.stem for p in (ROOT / "md").glob("*.md"))
    print(f"executing on {offline.emulated_devices()} emulated CPU devices: {', '.join(names)}")
    total = 0.0
    for name in names:
        seconds = execute(name)
        total += seconds
        print(f"{name:<36s} {seconds:7.1f} s", flush=True)
    print(f"{'total':<36s} {total:7.1f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
