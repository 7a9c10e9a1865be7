"""Sphinx configuration of the course's documentation site (`make docs`).

The site is built from the committed, executed notebooks in `notebooks/` with MyST-NB and
the Sphinx Book Theme; nothing is executed at build time. The source directory is the
repository root (`sphinx-build -c docs . _build/html`), so every page's path in the
repository is its document name plus suffix (`notebooks/01_minigpt.ipynb`,
`docs/index.md`): the launch and source links need no mapping.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from docutils import nodes

# ---------------------------------------------------------------------------------------
# The repository's public location: the ONE place it is set. Launch links (Colab, Kaggle),
# source links and the repository button of every page are built from these.
# PLACEHOLDER: replace with the real GitHub org/repo and branch when the course is published.
GITHUB_REPO = "jax-course/distributed-llm-training"
GITHUB_BRANCH = "main"
# ---------------------------------------------------------------------------------------

GITHUB_URL = f"https://github.com/{GITHUB_REPO}"
ROOT = Path(__file__).resolve().parent.parent


def blob_url(path: str) -> str:
    """GitHub page of a file of the repository, e.g. blob_url('md/00_setup.md')."""
    return f"{GITHUB_URL}/blob/{GITHUB_BRANCH}/{path}"


def colab_url(path: str) -> str:
    return f"https://colab.research.google.com/github/{GITHUB_REPO}/blob/{GITHUB_BRANCH}/{path}"


def kaggle_url(path: str) -> str:
    return f"https://kaggle.com/kernels/welcome?src={blob_url(path)}"


project = "Distributed LLM training in JAX"
author = "the course authors"
copyright = "the course authors"

extensions = ["myst_nb"]

# Only the home page and the notebooks are pages: md/ holds the same notebooks as MyST text
# (the .ipynb carries the outputs), README.md and the rest are not part of the site.
# Excluded folders are not even walked (.venv, .git, the build itself).
root_doc = "docs/index"
include_patterns = ["docs/index.md", "notebooks/*.ipynb"]
exclude_patterns = [".*", "_build", "md", "data", "**/.ipynb_checkpoints"]

# The notebooks are shown with the outputs committed by `make run`; the site never runs them.
nb_execution_mode = "off"
nb_merge_streams = True
# IPython's traceback lexer ("ipythontb", MyST-NB's default) gives up on a frame whose
# context shows part of a multi-line string (say, a docstring with `backticks`), and that
# warning fails the -W build. The plain Python traceback lexer reads the same text without
# errors and still colours the frames.
nb_render_error_lexer = "pytb"
# Cells that write shell scripts with `%%writefile` (05's cluster recipes) hold bash, which the
# IPython lexer cannot highlight; the page shows them plain, and that is not an error.
suppress_warnings = ["misc.highlighting_failure"]
myst_enable_extensions = ["colon_fence", "dollarmath", "amsmath", "substitution"]
# Lets docs/index.md link the repository without repeating its address.
myst_substitutions = {"repository": f"[repository]({GITHUB_URL})"}
myst_heading_anchors = 3

html_theme = "sphinx_book_theme"
html_title = project
html_static_path = ["_static"]
html_css_files = ["course.css"]
# _extra/index.html sends the site's root to the home page, docs/index.html.
html_extra_path = ["_extra"]
html_last_updated_fmt = None
html_theme_options = {
    "repository_url": GITHUB_URL,
    "repository_branch": GITHUB_BRANCH,
    "path_to_docs": "",  # the source directory is the repository root
    "use_repository_button": True,
    "use_source_button": True,
    "use_download_button": True,
    "launch_buttons": {"colab_url": "https://colab.research.google.com"},
    "show_toc_level": 2,
}

# A one-line summary of each notebook for the home page's list, which shows the notebooks
# that exist in notebooks/ (it grows as they land). tests/test_docs.py asks for a line for
# every notebook.
ONE_LINERS = {
    "00_setup": "Devices, meshes and shardings from the smallest examples; the pinned "
    "stack, the tokenizer and the data.",
    "01_minigpt": "A Flax NNX GPT trained on TinyStories with data and tensor parallelism: "
    "logical sharding rules, Grain, mixed precision, KV-cache generation, Orbax checkpoints.",
    "02_tensor_parallel_mlp": "The Megatron MLP in pure JAX with automatic, explicit and manual "
    "(`shard_map`) sharding, its collectives read from the compiled HLO.",
    "03_tensor_parallel_transformer": "One Transformer under DP, FSDP, TP and FSDP+TP: one "
    "config change each; the same losses, different collectives, FLOPs and memory.",
    "04_profiling": "Traces, xprof, reading the profile in code, MFU, and batch, mesh and "
    "input-pipeline experiments.",
    "05_multihost": "`jax.distributed`, per-process data, global arrays; checkpoints that "
    "survive kill -9 and preemption (Orbax async, the sync point, resume on another process "
    "count); recipes for TPU, GKE and SLURM.",
    "06_memory": "Where a train step's memory goes and four ways to cut it, measured: remat "
    "policies, gradient accumulation, bfloat16 compute and ZeRO 1-2-3, each checked against "
    "memory_analysis() and the plain step's gradients; the largest model per technique on a v5e-8.",
    "07_pipeline_parallel": "GPipe and 1F1B written with `shard_map`, `scan` and `ppermute`: "
    "schedules drawn from their tables, equal to one device; collective-permutes, memory and "
    "the bubble measured; pipeline × data vs FSDP.",
    "08_long_context": "Sequence parallelism with TP, ring attention (online softmax, K/V passed "
    "with `ppermute`) and all-to-all (Ulysses) attention, each equal to plain causal attention; "
    "memory and collectives per variant.",
    "09_mixture_of_experts": "A sparse MiniGPT: top-2 routing with capacity and a balancing loss, "
    "expert parallelism with `all_to_all` in `shard_map` checked against a dense reference, and "
    "what EP costs per device.",
    "10_finetuning": "LoRA and QLoRA written by hand in Flax NNX and checked against Qwix: only "
    "the adapters train, the base stays bit for bit, merging serves at no extra cost; int8 weights "
    "with their error bound; the collectives and memory of a full, a LoRA and a QLoRA sharded step.",
}


def notebooks(root: Path = ROOT) -> list[Path]:
    return sorted((root / "notebooks").glob("*.ipynb"))


def _markdown_cells(path: Path) -> list[str]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]


def notebook_title(path: Path) -> str:
    """The notebook's H1 without its 'NN · ' prefix (the list shows the number)."""
    for text in _markdown_cells(path):
        if m := re.search(r"^# (.+)$", text, re.MULTILINE):
            return re.sub(r"^\d+\s*·\s*", "", m.group(1)).strip()
    return path.stem


def notebook_hardware(path: Path) -> str:
    """First sentence of the notebook's own '**Hardware.**' note (CONTRIBUTING's first cell)."""
    for text in _markdown_cells(path)[:2]:
        if m := re.search(r"\*\*Hardware\.\*\*\s*(.+?\.)(\s|$)", text, re.DOTALL):
            return " ".join(m.group(1).split())
    return "See the notebook's hardware note."


def notebook_list(root: Path = ROOT) -> str:
    """The home page's list of notebooks, as MyST markdown (its cross-references are checked)."""
    items = []
    for path in notebooks(root):
        stem, repo_path = path.stem, f"notebooks/{path.name}"
        number, summary = stem.split("_", 1)[0], ONE_LINERS.get(stem, "")
        items.append(
            f"- **{number} · [{notebook_title(path)}](../{repo_path})**. {summary}\\\n"
            f"  *Hardware:* {notebook_hardware(path)}\\\n"
            f"  *Run it:* [Colab]({colab_url(repo_path)}) · [Kaggle]({kaggle_url(repo_path)})"
        )
    return "\n".join(items)


def insert_notebook_list(app, docname, source):
    if docname == root_doc:
        source[0] = source[0].replace("% NOTEBOOK-LIST", notebook_list(Path(app.srcdir)))


# ---------------------------------------------------------------------------------------
# Lesson and proof apart (CONTRIBUTING.md): code cells tagged `check` (verification) or
# `helper` (machinery) are folded wherever the notebook is read. On this site they become
# MyST-NB's own collapsible cells (what its `hide-input` / `hide-cell` tags make), labelled
# with what they hide; the tags stay as they are in the notebooks. tools/execute.py applies the
# same rule (fold_mode) to the .ipynb's metadata for JupyterLab, Kaggle and Colab.
FOLD_KINDS = {"check": "Check", "helper": "Helper"}
LABEL_CHARS = 56


def fold_kind(tags) -> str | None:
    """'check' or 'helper' for a cell carrying one of those tags, else None."""
    return next((kind for kind in FOLD_KINDS if kind in (tags or [])), None)


def fold_mode(tags) -> str | None:
    """What the fold of a code cell hides, in MyST-NB's names (render.py's hide_mode): None
    (not folded), "input" (the source; the output stays in view), "input+output" (source and
    output, each under its own label) or "all" (the whole cell under one label).

    The source of a check or a helper folds; what it prints stays in view, since the lesson
    talks about what a cell prints (a check's verdict, the hardware line, a helper's table or
    picture) and a reader must see every result without opening anything. Where a cell's
    output is noise, MyST-NB's own tags say so on that cell: `hide-output` folds the output
    too, `hide-cell` folds the whole cell under one label.
    """
    tags = tags or []
    if fold_kind(tags) is None:
        return None
    if "hide-cell" in tags:
        return "all"
    if "hide-output" in tags:
        return "input+output"
    return "input"


def fold_title(source: str) -> str:
    """What a folded cell does, in a few words: its first comment line ('# check: ...',
    '# helper: ...', '# @title ...' prefixes dropped; nbval flags skipped), else the names it
    defines; '' when neither says anything."""
    for line in source.splitlines():
        text = line.strip()
        if not text:
            continue
        if not text.startswith("#"):
            break
        text = text.lstrip("#").strip()
        if not text or text.startswith(("NBVAL_", "noqa", "type:", "fmt:")):
            continue
        text = re.sub(r"^@title\s*", "", text)
        if re.fullmatch(r"(check|helper)\s*\(.*\)", text, flags=re.IGNORECASE):
            continue  # a generic Colab title ('Check (asserts the claims above)'): the fold says it
        text = re.sub(r"^(check|helper)\s*[:·—-]\s*", "", text, flags=re.IGNORECASE)
        text = text.replace("`", "")
        if len(text) > LABEL_CHARS:
            text = text[:LABEL_CHARS].rsplit(" ", 1)[0].rstrip(",;:") + " …"
        return text[:1].upper() + text[1:]
    names = re.findall(r"^(?:async\s+)?(?:def|class)\s+(\w+)", source, re.MULTILINE)
    if names:
        shown = ", ".join(names[:4]) + (", …" if len(names) > 4 else "")
        return f"defines {shown}"
    return ""


def fold_labels(kind: str, mode: str, source: str) -> tuple[str, str]:
    """The fold's two labels (closed, open), e.g. 'Check: the loss matches the 1-device run ·
    show the code (12 lines, 3 asserts)' / '... · hide the code'."""
    title = fold_title(source)
    label = f"{FOLD_KINDS[kind]}: {title}" if title else FOLD_KINDS[kind]
    lines = sum(1 for line in source.splitlines() if line.strip())
    asserts = len(re.findall(r"^\s*assert\b", source, re.MULTILINE))
    size = f"{lines} line{'s' * (lines != 1)}"
    if kind == "check" and asserts:
        size += f", {asserts} assert{'s' * (asserts != 1)}"
    if mode == "input+output":  # two folds: MyST-NB puts "source" and "output" for {type}
        return f"{label} · show the {{type}}", f"{label} · hide the {{type}}"
    what = "the code and its output" if mode == "all" else "the code"
    return f"{label} · show {what} ({size})", f"{label} · hide {what}"


def fold_check_and_helper_cells(app, doctree):
    """Mark each `check`/`helper` code cell for MyST-NB's folding (its HTML post-transform,
    HideInputCells, wraps the marked parts in <details> with these labels)."""
    for node in doctree.findall(nodes.container):
        if node.get("nb_element") != "cell_code":
            continue
        tags = (node.get("cell_metadata") or {}).get("tags", [])
        kind = fold_kind(tags)
        if kind is None:
            continue
        source = next((child.astext() for child in node.children
                       if child.get("nb_element") == "cell_code_source"), "")
        mode = fold_mode(tags)
        node["hide_mode"] = mode
        node["prompt_show"], node["prompt_hide"] = fold_labels(kind, mode, source)
        node["classes"].append(f"course-fold-{kind}")


def add_launch_banner(app, doctree):
    """Under each notebook's title: Colab/Kaggle launch links, its sources, and a note that
    the outputs shown are the committed ones (no execution at build time)."""
    docname = app.env.docname
    if not docname.startswith("notebooks/"):
        return
    stem = docname.split("/", 1)[1]
    ipynb, md = f"notebooks/{stem}.ipynb", f"md/{stem}.md"

    def link(text, url, cls):
        return nodes.reference("", text, refuri=url, classes=[cls])

    run = nodes.paragraph("", "", nodes.strong("", "Run it: "))
    run += [link("Open in Colab", colab_url(ipynb), "course-colab"), nodes.Text(" · ")]
    run += [link("Open in Kaggle", kaggle_url(ipynb), "course-kaggle"), nodes.Text(" · ")]
    run += [nodes.strong("", "Source: "), link(ipynb, blob_url(ipynb), "course-source")]
    if (ROOT / md).exists():
        run += [nodes.Text(" (with outputs), "), link(md, blob_url(md), "course-source-md")]
        run += [nodes.Text(" (MyST text, the file to edit)")]
    note = nodes.paragraph(
        "",
        "The outputs on this page are the ones committed in the notebook, from the run its "
        "hardware cell describes; the site shows them without executing anything.",
    )
    banner = nodes.container("", run, note, classes=["course-launch"])
    # Anchors for code cells (#cell-1, #cell-2, ...), so a cell and its output can be linked.
    cells = (n for n in doctree.findall(nodes.container) if "cell" in n["classes"])
    for number, cell in enumerate(cells, start=1):
        cell["ids"].append(f"cell-{number}")
    section = next(iter(doctree.findall(nodes.section)), None)
    if section is None:
        doctree.insert(0, banner)
    else:
        title = section.next_node(nodes.title)
        section.insert(section.index(title) + 1, banner)


def add_kaggle_launch_button(app, pagename, templatename, context, doctree):
    """The theme's launch menu knows Colab but not Kaggle: add Kaggle next to it."""
    if not pagename.startswith("notebooks/"):
        return
    for button in context.get("header_buttons", []):
        if button.get("label") == "launch-buttons":
            button["buttons"].append(
                {
                    "type": "link",
                    "text": "Kaggle",
                    "tooltip": "Launch on Kaggle",
                    "icon": "fab fa-kaggle",
                    "url": kaggle_url(f"{pagename}.ipynb"),
                }
            )


def always_reread_home(app, env, added, changed, removed):
    """The home page's list is generated from the notebooks: rebuild it on every build."""
    return [root_doc]


def setup(app):
    app.connect("source-read", insert_notebook_list)
    app.connect("env-get-outdated", always_reread_home)
    app.connect("doctree-read", add_launch_banner)
    app.connect("doctree-read", fold_check_and_helper_cells)
    app.connect("html-page-context", add_kaggle_launch_button, priority=502)
