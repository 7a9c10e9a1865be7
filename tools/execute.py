"""Execute notebooks in place, as `make run` does, and print each one's wall time.

    python tools/execute.py                 # every notebook, in order
    python tools/execute.py 01_minigpt      # one (name without extension)

For each notebook: the md/ twin is synced into notebooks/ (so edits to the .md are
picked up), the .ipynb is executed top to bottom in a fresh kernel with the course's
offline environment (8 emulated CPU devices unless CPU_DEVICES or XLA_FLAGS say
otherwise), the outputs are written back, and the .md is re-synced.
Cells tagged `raises-exception` may fail; any other error stops with the cell shown.
"""

from __future__ import annotations

import os
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
import offline  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CELL_TIMEOUT_S = 600


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
    nbformat.write(nb, ipynb)
    # jupytext.toml's metadata filters, as `make sync` applies them (no YAML header in the .md)
    jupytext.write(jupytext.read(ipynb), md, fmt="md:myst", config=load_jupytext_config(str(ROOT)))
    return seconds


def main(names: list[str]) -> None:
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
