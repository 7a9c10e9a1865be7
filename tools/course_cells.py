"""The notebooks' copies of the course's machinery, written from course/*.py.

Each notebook runs alone on Colab and Kaggle, so it carries the machinery it needs (install,
data, TPU compiles, HLO readers) in folded helper cells. Those copies are never edited by hand:
in md/NAME.md a code cell holds a copy of course/X.py between two marker lines,

    # >>> course/X.py (written by `make sync` from that file: edit it there, not here)
    ...
    # <<< course/X.py

and this tool rewrites every such block from its source: the module's docstring as comments,
then its code, less the imports of other course modules (an earlier block of the same notebook
defines those names; the check says so when it does not). Code before or after the markers is
the notebook's own.

    python tools/course_cells.py           rewrite the blocks in md/*.md (`make sync` does this,
                                           then pairs the .ipynb files with jupytext)
    python tools/course_cells.py --check   list the blocks that differ from their source
    python tools/course_cells.py --list    which notebook uses which module
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COURSE = ROOT / "course"
BEGIN = "# >>> course/{}.py (written by `make sync` from that file: edit it there, not here)"
END = "# <<< course/{}.py"
BLOCK = re.compile(r"^# >>> course/(\w+)\.py\b[^\n]*\n(.*?)^# <<< course/(\w+)\.py[^\n]*$", re.M | re.S)
COURSE_IMPORT = re.compile(r"^from course(?:\.(\w+))? import [^\n]*\n", re.M)


def modules() -> list[str]:
    return sorted(p.stem for p in COURSE.glob("*.py") if p.stem != "__init__")


def requires(name: str) -> list[str]:
    """The course modules that course/NAME.py imports."""
    return [m for m in COURSE_IMPORT.findall((COURSE / f"{name}.py").read_text()) if m]


def copy_of(name: str) -> str:
    """The notebook copy of course/NAME.py, markers included."""
    source = (COURSE / f"{name}.py").read_text()
    tree = ast.parse(source)
    lines = source.splitlines()
    doc = ""
    if tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(tree.body[0].value, ast.Constant):
        doc = "\n".join(f"# {line}".rstrip() for line in ast.get_docstring(tree).splitlines())
        lines = lines[tree.body[0].end_lineno:]
    code = "\n".join(lines) + "\n"
    code = re.sub(r"\n\n(?:from course(?:\.\w+)? import [^\n]*\n)+\n", "\n\n", code)  # a group of its own
    code = COURSE_IMPORT.sub("", code).strip("\n")
    code = re.sub(r"\n{3,}(?=(import|from) )", "\n\n", code)
    return "\n".join([BEGIN.format(name), doc, "", code, END.format(name)]) if doc else \
        "\n".join([BEGIN.format(name), code, END.format(name)])


def blocks(text: str) -> list[tuple[str, str, str]]:
    """(module, its copy as found, the end marker's module) for every block in a notebook text."""
    return [(m[1], m[0], m[3]) for m in BLOCK.finditer(text)]


def problems(path: Path, text: str | None = None) -> list[str]:
    """What is wrong with the copies in one notebook (md or ipynb text): edited by hand, an
    unknown module, a missing dependency, a marker without its pair."""
    text = path.read_text() if text is None else text
    if path.suffix == ".ipynb":  # the cells' sources, joined: the markers are whole lines there
        import json
        text = "\n".join("".join(c["source"]) for c in json.loads(text)["cells"] if c["cell_type"] == "code")
    found, seen = [], []
    for name, copy, end in blocks(text):
        if name != end:
            found.append(f"{path.name}: the block that opens with course/{name}.py closes with course/{end}.py")
        elif name not in modules():
            found.append(f"{path.name}: course/{name}.py does not exist")
        elif copy != copy_of(name):
            found.append(f"{path.name}: its copy of course/{name}.py differs from the source: edit "
                         f"course/{name}.py, never the copy, then `make sync`")
        for need in requires(name) if name in modules() else []:
            if need not in seen:
                found.append(f"{path.name}: course/{name}.py needs course/{need}.py in an earlier block")
        seen.append(name)
    opened, closed = text.count("# >>> course/"), text.count("# <<< course/")
    if opened != closed or opened != len(seen):
        found.append(f"{path.name}: {opened} opening and {closed} closing markers, {len(seen)} whole blocks")
    return found


def rewrite(path: Path) -> bool:
    text = path.read_text()
    new = BLOCK.sub(lambda m: copy_of(m[1]) if m[1] == m[3] and m[1] in modules() else m[0], text)
    if new != text:
        path.write_text(new)
    return new != text


def main(argv: list[str]) -> int:
    notebooks = sorted((ROOT / "md").glob("*.md"))
    if "--list" in argv:
        for name in modules():
            users = [p.stem[:2] for p in notebooks if f"# >>> course/{name}.py" in p.read_text()]
            print(f"course/{name}.py: {', '.join(users) or 'no notebook'}")
        return 0
    if "--check" not in argv:
        for path in notebooks:
            if rewrite(path):
                print(f"course_cells: rewrote the course blocks of md/{path.name}")
    found = [p for path in notebooks for p in problems(path)]
    print("\n".join(found) or "course_cells: every copy matches its source")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
