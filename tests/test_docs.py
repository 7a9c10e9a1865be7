"""The documentation site: built from the committed notebooks, checked as a reader sees it.

One fresh Sphinx build (the one `make docs` runs, plus `-E` so every page is re-read and every
warning shows), then:

* the build is clean: exit status 0 and no warning (warnings are errors);
* every notebook has a page, listed on the home page, with Colab, Kaggle and source links
  built from the one repository location in docs/conf.py;
* every image output of a notebook is embedded in its page as a file of the site;
* in headless Chromium (Debian's `chromium`; skipped, with the reason, where there is none),
  the home page and each notebook page load, and the rendered DOM holds the code cells, their
  outputs and the plot images; the MiniGPT page must show at least one plot. Screenshots go to
  _build/screenshots/ for people to look at.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.image
import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "_build"
HTML = BUILD / "html"
SCREENSHOTS = BUILD / "screenshots"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
MINIGPT = "01_minigpt"
# MyST-NB shows, of each output's formats, the first in this order (its default for HTML).
MIME_PRIORITY = ["application/vnd.jupyter.widget-view+json", "application/javascript",
                 "text/html", "image/svg+xml", "image/png", "image/gif", "image/jpeg",
                 "text/markdown", "text/latex", "text/plain"]
IMAGE_MIMES = {"image/svg+xml", "image/png", "image/gif", "image/jpeg"}
BROWSERS = ["chromium", "chromium-browser", "google-chrome"]
BROWSER_TIMEOUT_S = 120


def load_conf():
    """docs/conf.py as a module: the single source of the repository location and link forms."""
    spec = importlib.util.spec_from_file_location("course_docs_conf", ROOT / "docs" / "conf.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    return conf


CONF = load_conf()


def sphinx_command(*extra: str) -> list[str]:
    """The build `make docs` runs (keep the two in step): warnings are errors, nitpicky."""
    return [sys.executable, "-m", "sphinx", "-b", "html", "-c", "docs", "-W", "--keep-going", "-n",
            *extra, ".", str(HTML)]


@pytest.fixture(scope="module")
def site():
    BUILD.mkdir(exist_ok=True)
    warnings_file = BUILD / "docs-warnings.txt"
    start = time.perf_counter()
    result = subprocess.run(
        sphinx_command("-E", "-q", "-w", str(warnings_file)),
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    seconds = time.perf_counter() - start
    print(f"sphinx build of {len(NOTEBOOKS)} notebooks: {seconds:.1f} s")
    warnings = warnings_file.read_text() if warnings_file.exists() else ""
    return {"result": result, "warnings": warnings, "seconds": seconds}


class Page(HTMLParser):
    """What a reader sees of a notebook page: code cells, their outputs, images in outputs."""

    def __init__(self, html: str):
        super().__init__()
        self.hrefs: list[str] = []
        self.cell_inputs = self.cell_outputs = 0
        self.output_images: list[str] = []  # src of <img> inside a cell's output
        self.first_image_cell = None  # id of the code cell that shows the first image
        self._divs: list[tuple[set[str], str | None]] = []  # classes and id of each open <div>
        self.feed(html)

    def _inside(self, cls: str) -> bool:
        return any(cls in classes for classes, _ in self._divs)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "a" and attrs.get("href"):
            self.hrefs.append(attrs["href"])
        # Image outputs are files of the site; an <img> inside an HTML output is not counted.
        src = attrs.get("src", "")
        if tag == "img" and self._inside("cell_output") and not src.startswith(("data:", "http")):
            self.output_images.append(src)
            cell_ids = [i for classes, i in self._divs if "cell" in classes and i]
            self.first_image_cell = self.first_image_cell or (cell_ids[-1] if cell_ids else None)
        if tag == "div":
            classes = set((attrs.get("class") or "").split())
            self.cell_inputs += "cell_input" in classes
            self.cell_outputs += "cell_output" in classes
            self._divs.append((classes, attrs.get("id")))

    def handle_endtag(self, tag):
        if tag == "div" and self._divs:
            self._divs.pop()


def expected(nb_path: Path) -> dict:
    """What the page of a notebook must show, counted from the committed .ipynb."""
    cells = [c for c in json.loads(nb_path.read_text())["cells"] if c["cell_type"] == "code"]
    shown = [c for c in cells if "remove-cell" not in c.get("metadata", {}).get("tags", [])]
    with_inputs = [c for c in shown if "remove-input" not in c["metadata"].get("tags", [])]
    with_outputs = [
        c for c in shown if c.get("outputs") and "remove-output" not in c["metadata"].get("tags", [])
    ]
    shown_mimes = [
        next((m for m in MIME_PRIORITY if m in o.get("data", {})), None)
        for c in with_outputs for o in c["outputs"]
    ]
    images = sum(m in IMAGE_MIMES for m in shown_mimes)
    return {"inputs": len(with_inputs), "outputs": len(with_outputs), "images": images}


def page_path(stem: str) -> Path:
    return HTML / "notebooks" / f"{stem}.html"


def test_site_builds_without_warnings(site):
    result, warnings = site["result"], site["warnings"]
    assert result.returncode == 0 and not warnings.strip(), (
        f"`make docs` fails (exit {result.returncode}); fix these in the notebook's md/ file, then "
        "`make run NB=NAME` ('No source code lexer' means a notebook was never executed):\n"
        f"{warnings[:5000]}{result.stderr[-3000:]}"
    )


def test_every_notebook_has_a_page_on_the_home_page(site):
    assert NOTEBOOKS, "notebooks/ holds no notebooks"
    home = Page((HTML / "docs" / "index.html").read_text())
    for nb in NOTEBOOKS:
        assert page_path(nb.stem).exists(), f"no page for {nb.name}"
        assert f"../notebooks/{nb.stem}.html" in home.hrefs, f"the home page does not link {nb.stem}"
    root = (HTML / "index.html").read_text()
    assert 'url=docs/index.html' in root, "the site's root does not send readers to the home page"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_home_page_has_a_line_for_the_notebook(nb):
    assert CONF.ONE_LINERS.get(nb.stem), (
        f"add a one-line summary of {nb.stem} to ONE_LINERS in docs/conf.py (the home page's list)"
    )


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_page_links_to_colab_kaggle_and_source(site, nb):
    page = Page(page_path(nb.stem).read_text())
    repo_path = f"notebooks/{nb.name}"
    for what, url in [("Colab", CONF.colab_url(repo_path)), ("Kaggle", CONF.kaggle_url(repo_path)),
                      ("source", CONF.blob_url(repo_path))]:
        assert url in page.hrefs, f"{nb.stem}: no {what} link ({url})"
    if (ROOT / "md" / f"{nb.stem}.md").exists():
        assert CONF.blob_url(f"md/{nb.stem}.md") in page.hrefs, f"{nb.stem}: no link to md/{nb.stem}.md"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_page_shows_cells_outputs_and_images(site, nb):
    page, want = Page(page_path(nb.stem).read_text()), expected(nb)
    assert (page.cell_inputs, page.cell_outputs) == (want["inputs"], want["outputs"]), (
        f"{nb.stem}: page shows {page.cell_inputs} code inputs and {page.cell_outputs} outputs, "
        f"the notebook has {want['inputs']} and {want['outputs']}"
    )
    assert len(page.output_images) == want["images"], (
        f"{nb.stem}: {len(page.output_images)} images on the page, {want['images']} in the notebook"
    )
    for src in page.output_images:
        image = (page_path(nb.stem).parent / src).resolve()
        assert image.is_file() and image.stat().st_size > 0, f"{nb.stem}: image {src} is not in the site"


# ----------------------------------------------------------------------------------------
# In a real browser.


@pytest.fixture(scope="module")
def chromium(site):
    # $CHROMIUM names the browser to use; otherwise the first of these on the PATH.
    names = [os.environ["CHROMIUM"]] if "CHROMIUM" in os.environ else BROWSERS
    exe = next((path for name in names if (path := shutil.which(name))), None)
    if exe is None:
        pytest.skip(
            "no Chromium on this machine, so the rendered pages are not checked in a browser: "
            "install Debian's `chromium` (`apt-get install chromium`; .ci/run does it when it can)"
        )
    profile = tempfile.TemporaryDirectory(prefix="course-chromium-")

    def run(url: str, *args: str) -> subprocess.CompletedProcess:
        command = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                   "--no-first-run", "--hide-scrollbars", f"--user-data-dir={profile.name}",
                   *args, url]
        result = subprocess.run(command, capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S)
        assert result.returncode == 0, f"chromium failed on {url}:\n{result.stderr[-2000:]}"
        return result

    yield run
    profile.cleanup()


def rendered(chromium, html_file: Path) -> Page:
    """The page's DOM after Chromium loaded it (scripts run), parsed."""
    return Page(chromium(html_file.as_uri(), "--dump-dom").stdout)


def screenshot(chromium, html_file: Path, name: str, fragment: str | None = None) -> Path:
    """A 1280x1600 screenshot of the page, scrolled to #fragment if given, checked not blank."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / f"{name}.png"
    shot.unlink(missing_ok=True)
    width, height = 1280, 1600
    url = html_file.as_uri()
    with tempfile.TemporaryDirectory() as tmp:
        if fragment:
            # Headless Chromium paints a blank screenshot when the URL scrolls the page itself;
            # scrolled inside an iframe, it paints.
            frame = Path(tmp) / "frame.html"
            frame.write_text(
                f'<!DOCTYPE html><body style="margin:0"><iframe src="{url}#{fragment}" '
                f'style="border:0;width:{width}px;height:{height}px"></iframe></body>'
            )
            url = frame.as_uri()
        chromium(url, f"--window-size={width},{height}", "--virtual-time-budget=5000",
                 f"--screenshot={shot}")
    assert shot.exists(), f"chromium wrote no screenshot of {name}"
    pixels = matplotlib.image.imread(shot)
    assert pixels.std() > 0.02, f"the screenshot of {name} is blank"
    return shot


def test_home_page_in_browser(chromium):
    home = HTML / "docs" / "index.html"
    page = rendered(chromium, home)
    for nb in NOTEBOOKS:
        assert f"../notebooks/{nb.stem}.html" in page.hrefs, f"rendered home page lacks {nb.stem}"
        assert CONF.colab_url(f"notebooks/{nb.name}") in page.hrefs
    screenshot(chromium, home, "home")


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_page_in_browser(chromium, nb):
    page, want = rendered(chromium, page_path(nb.stem)), expected(nb)
    assert page.cell_inputs == want["inputs"] > 0, f"{nb.stem}: {page.cell_inputs} code cells rendered"
    assert page.cell_outputs == want["outputs"], f"{nb.stem}: {page.cell_outputs} outputs rendered"
    assert len(page.output_images) == want["images"], f"{nb.stem}: {len(page.output_images)} images"
    if nb.stem == MINIGPT:
        assert page.output_images, f"{nb.stem}: the MiniGPT page shows no plot (loss curve)"
        screenshot(chromium, page_path(nb.stem), nb.stem)
        screenshot(chromium, page_path(nb.stem), f"{nb.stem}-first-plot", page.first_image_cell)


def test_minigpt_has_a_page(site):
    if not (ROOT / "notebooks" / f"{MINIGPT}.ipynb").exists():
        pytest.skip(f"notebooks/{MINIGPT}.ipynb is not written yet, so its page is not checked")
    assert page_path(MINIGPT).exists()


def test_readme_links_use_the_one_repository_location():
    """README's launch links are written by hand: they must match docs/conf.py's, notebook by notebook."""
    readme = (ROOT / "README.md").read_text()
    for nb in NOTEBOOKS:
        path = f"notebooks/{nb.name}"
        for url in (CONF.colab_url(path), CONF.kaggle_url(path)):
            assert f"({url})" in readme, f"README.md lacks {url}: its links must follow GITHUB_REPO in docs/conf.py"
        assert f"]({path})" in readme, f"README.md's table should link {path}"
