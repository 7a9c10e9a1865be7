"""The documentation site: built from the committed notebooks, checked as a reader sees it.

One fresh Sphinx build (the one `make docs` runs, plus `-E` so every page is re-read and every
warning shows), then:

* the build is clean: exit status 0 and no warning (warnings are errors);
* every notebook has a page, listed on the home page, with Colab, Kaggle and source links
  built from the one repository location in docs/conf.py;
* every image output of a notebook is embedded in its page as a file of the site;
* cells tagged `check` or `helper` are folded (MyST-NB's <details>, closed, labelled "Check: ..."
  / "Helper: ..."); a check's output stays in view;
* in headless Chromium (Debian's `chromium`), the home page and each notebook page load, and the
  rendered DOM holds the code cells, their outputs and the plot images; the MiniGPT page must
  show at least one plot; every check/helper cell is closed when the page opens and one click on
  its label opens it. The folding is also checked on a small site built from a copy of a
  notebook with tagged cells, so it is tested whatever the notebooks carry. Screenshots (each
  notebook's first screenful, folds closed) go to _build/screenshots/ for people to look at.
  Without Chromium these checks skip, saying why; in CI (CI=true) they fail instead.
"""

from __future__ import annotations

import base64
import fcntl
import importlib.util
import json
import os
import select
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
FOLD_TAGS = ("check", "helper")
# The first screenful a reader sees of a page (a laptop's browser window).
SCREEN = (1280, 900)


def load_conf():
    """docs/conf.py as a module: the single source of the repository location and link forms."""
    spec = importlib.util.spec_from_file_location("course_docs_conf", ROOT / "docs" / "conf.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    return conf


CONF = load_conf()


def test_fold_labels_say_what_the_cell_does():
    """A fold's label names the cell's job: its first specific comment, else what it defines; the
    generic Colab title ('Helper (machinery, not part of the lesson)') never repeats the kind."""
    generic = "# @title Helper (machinery, not part of the lesson)\n"
    closed, _ = CONF.fold_labels("helper", "input", generic + "def load(path):\n    return path\n")
    assert closed.startswith("Helper: defines load ·"), closed
    closed, _ = CONF.fold_labels("helper", "input", generic + "# tokenise once\nx = 1\n")
    assert closed.startswith("Helper: Tokenise once ·"), closed
    closed, _ = CONF.fold_labels("check", "input", "# @title Check: the loss went down\nassert 1\n")
    assert closed.startswith("Check: The loss went down · show the code (2 lines, 1 assert)"), closed
    for kind, title in (("helper", "Helper"), ("check", "Check")):
        closed, _ = CONF.fold_labels(kind, "input", f"# @title {title} (asserts the claims above)\ny = 2\n")
        assert closed.startswith(f"{title} · show the code (2 lines)"), closed


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


class Folds(HTMLParser):
    """The `check`/`helper` code cells of a page as the HTML has them: for each, in page order,
    its tag, whether a <details> folds it (and is closed), the fold's label, and whether the
    cell's source and output sit inside the fold."""

    def __init__(self, html: str):
        super().__init__()
        self.cells: list[dict] = []
        self._stack: list[tuple[str, str | None]] = []  # (tag, role) of each open element
        self._summary = None
        self.feed(html)

    def _role(self, tag, classes):
        if tag == "div" and "cell" in classes and ({"tag_check", "tag_helper"} & classes):
            kind = "check" if "tag_check" in classes else "helper"
            self.cells.append({"kind": kind, "details": [], "input_in": None, "output_in": None})
            return "cell"
        if not self._stack or not any(role == "cell" for _, role in self._stack):
            return None
        cell, in_details = self.cells[-1], any(role == "details" for _, role in self._stack)
        if tag == "details" and "hide" in classes:
            cell["details"].append({"open": False, "label": ""})
            return "details"
        if tag == "summary":
            self._summary = cell["details"][-1] if cell["details"] else None
            return "summary"
        if tag == "div" and "cell_input" in classes:
            cell["input_in"] = in_details
        if tag == "div" and "cell_output" in classes:
            cell["output_in"] = in_details
        return None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = set((attrs.get("class") or "").split())
        role = self._role(tag, classes)
        if role == "details" and "open" in attrs:
            self.cells[-1]["details"][-1]["open"] = True
        if tag in ("div", "details", "summary"):
            self._stack.append((tag, role))

    def handle_endtag(self, tag):
        if tag in ("div", "details", "summary"):
            while self._stack:
                open_tag, role = self._stack.pop()
                if role == "summary":
                    self._summary = None
                if open_tag == tag:
                    break

    def handle_data(self, data):
        # the closed fold's label: the summary's first paragraph (p.collapsed)
        if self._summary is not None and not self._summary["label"] and data.strip():
            self._summary["label"] = " ".join(data.split())


def expected_folds(nb_path: Path) -> list[dict]:
    """The check/helper cells a page must fold, in order, with docs/conf.py's fold rule."""
    folds = []
    for cell in json.loads(nb_path.read_text())["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] != "code" or "remove-cell" in tags:
            continue
        if {"remove-input", "remove-output"} <= set(tags):
            continue
        if kind := CONF.fold_kind(tags):
            folds.append({"kind": kind, "mode": CONF.fold_mode(tags),
                          "outputs": bool(cell.get("outputs")) and "remove-output" not in tags})
    return folds


def check_folds_in_html(html_file: Path, nb_path: Path) -> int:
    """Assert that the page folds every check/helper cell as the rule says; the number folded."""
    name, want, got = nb_path.stem, expected_folds(nb_path), Folds(html_file.read_text()).cells
    assert [c["kind"] for c in got] == [w["kind"] for w in want], (
        f"{name}: the page has {len(got)} check/helper cells, the notebook {len(want)}")
    for number, (cell, rule) in enumerate(zip(got, want, strict=True), start=1):
        where = f"{name}: {rule['kind']} cell {number} of {len(want)}"
        assert cell["details"], f"{where} is not folded (no <details>): see docs/conf.py's fold rule"
        first = cell["details"][0]
        assert not first["open"], f"{where} is open when the page loads"
        assert first["label"].startswith(CONF.FOLD_KINDS[rule["kind"]]), (
            f"{where}: its fold is labelled {first['label']!r}, not '{CONF.FOLD_KINDS[rule['kind']]}: ...'")
        assert cell["input_in"], f"{where}: its source is not inside the fold"
        if rule["outputs"]:
            folded_output = rule["mode"] in ("all", "input+output")
            assert cell["output_in"] == folded_output, (
                f"{where}: its output is {'in' if cell['output_in'] else 'out of'} the fold; the rule "
                f"({rule['mode']}) wants it {'in' if folded_output else 'out of'} it")
    return len(want)


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


def in_ci() -> bool:
    """CI services set CI=true (GitHub Actions, GitLab, ...); .ci/run runs there."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def find_chromium() -> str:
    """The browser: $CHROMIUM, else the first of BROWSERS on the PATH. Without one the browser
    checks skip, saying why; in CI they fail, so that a site nobody looked at cannot pass."""
    names = [os.environ["CHROMIUM"]] if "CHROMIUM" in os.environ else BROWSERS
    exe = next((path for name in names if (path := shutil.which(name))), None)
    if exe is None:
        why = (f"no Chromium on this machine ({' / '.join(names)} not on the PATH), so the rendered "
               "pages are not checked in a browser: install Debian's `chromium` "
               "(`apt-get install chromium`; .ci/run does it when it can)")
        if in_ci():
            pytest.fail(f"CI=true and {why}", pytrace=False)
        pytest.skip(why)
    return exe


@pytest.fixture(scope="module")
def chromium(site):
    exe = find_chromium()
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


# ----------------------------------------------------------------------------------------
# The folds in a browser: closed when a page opens, open with one click. Chromium is driven
# over its DevTools protocol on a pipe (--remote-debugging-pipe), with no package beyond the
# standard library: real mouse clicks at the label's place on the screen.


class DevTools:
    """One headless Chromium page, driven over the DevTools protocol."""

    def __init__(self, exe: str, profile: str):
        # Chromium reads commands from fd 3 and writes replies to fd 4 (NUL-terminated JSON).
        to_browser, from_browser = os.pipe(), os.pipe()
        # Above fd 4, so that placing them at 3 and 4 in the child cannot clobber one another.
        theirs = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser[0], from_browser[1])]

        def at_3_and_4():  # in the child, before exec (os.dup2 makes them inheritable)
            os.dup2(theirs[0], 3)
            os.dup2(theirs[1], 4)

        command = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                   "--no-first-run", "--hide-scrollbars", f"--user-data-dir={profile}",
                   "--remote-debugging-pipe", "about:blank"]
        # close_fds=False: subprocess would close 3 and 4 after preexec_fn (Python's own fds are
        # not inheritable, so nothing else leaks).
        # Its log goes to a file: a pipe nobody reads would fill and stall the browser.
        self.log = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            command, preexec_fn=at_3_and_4, close_fds=False, stdin=subprocess.DEVNULL,
            stdout=self.log, stderr=self.log)
        for fd in (*theirs, to_browser[0], from_browser[1]):
            os.close(fd)
        self._out, self._in = to_browser[1], from_browser[0]
        self._buffer, self._next_id, self.events = b"", 0, []
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.send("Page.enable", session=True)

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._in], [], [], left)[0]:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                self.log.seek(0)
                log = self.log.read().decode(errors="replace")
                raise RuntimeError(f"chromium closed its DevTools pipe; its log:\n{log[-2000:]}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, session: bool = False, **params):
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + BROWSER_TIMEOUT_S
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                assert "error" not in reply, f"chromium: {method} failed: {reply['error']}"
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, event: str) -> None:
        deadline = time.monotonic() + BROWSER_TIMEOUT_S
        while not any(e.get("method") == event for e in self.events):
            self.events.append(self._read(deadline))

    def open(self, url: str, width: int, height: int) -> None:
        self.send("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)
        self.events.clear()
        self.send("Page.navigate", session=True, url=url)
        self.wait_for("Page.loadEventFired")
        self.js("document.fonts.ready.then(() => true)")

    def js(self, expression: str):
        result = self.send("Runtime.evaluate", session=True, expression=expression,
                           returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in result, f"script failed: {result['exceptionDetails']}"
        return result["result"].get("value")

    def click(self, x: float, y: float) -> None:
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", session=True, type=kind, x=x, y=y,
                      button="left", clickCount=1)

    def screenshot(self, path: Path) -> None:
        data = self.send("Page.captureScreenshot", session=True, format="png")["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._out)
        os.close(self._in)
        self.log.close()


@pytest.fixture(scope="module")
def devtools(site):
    exe = find_chromium()
    with tempfile.TemporaryDirectory(prefix="course-chromium-") as profile:
        browser = DevTools(exe, profile)
        yield browser
        browser.close()


# For each check/helper cell, in page order: its tag, whether its fold is open, the label a
# reader sees, and whether its source and output are rendered visible.
FOLD_STATE_JS = """
[...document.querySelectorAll('div.cell.tag_check, div.cell.tag_helper')].map(cell => {
  // checkVisibility: false inside a closed <details> (whose content keeps its layout size)
  const shown = el => !!el && el.checkVisibility({visibilityProperty: true,
    contentVisibilityAuto: true}) && el.getClientRects().length > 0;
  const fold = cell.querySelector('details.hide');
  const label = fold && [...fold.querySelectorAll(':scope > summary > p')].find(shown);
  return {id: cell.id, kind: cell.classList.contains('tag_check') ? 'check' : 'helper',
          open: fold ? fold.open : null, label: label ? label.innerText.trim() : '',
          input: shown(cell.querySelector('div.cell_input')),
          output: shown(cell.querySelector('div.cell_output'))};
})
"""

# Scroll a cell's fold label to the middle of the screen; where to click it (its left end).
LABEL_PLACE_JS = """
(() => {
  const summary = document.querySelector('#%s details.hide > summary');
  summary.scrollIntoView({block: 'center'});
  const box = summary.getBoundingClientRect();
  return [box.left + Math.min(40, box.width / 2), box.top + box.height / 2];
})()
"""


def check_folds_in_browser(browser: DevTools, html_file: Path, nb_path: Path) -> int:
    """Every check/helper cell is closed when the page opens (source hidden, a check's output in
    view) and opens with one click on its label; returns how many were clicked open."""
    name, want = nb_path.stem, expected_folds(nb_path)
    browser.open(html_file.as_uri(), *SCREEN)
    cells = browser.js(FOLD_STATE_JS)
    assert [c["kind"] for c in cells] == [w["kind"] for w in want], (
        f"{name}: the browser shows {len(cells)} check/helper cells, the notebook has {len(want)}")
    for cell, rule in zip(cells, want, strict=True):
        where = f"{name}: {rule['kind']} cell #{cell['id']}"
        assert cell["open"] is False, f"{where} is not folded when the page opens"
        assert not cell["input"], f"{where}: its source is on screen before any click"
        assert cell["label"].startswith(CONF.FOLD_KINDS[rule["kind"]]), (
            f"{where}: the reader sees the label {cell['label']!r}")
        if rule["outputs"]:
            assert cell["output"] == (rule["mode"] == "input"), (
                f"{where}: output {'shown' if cell['output'] else 'hidden'} before any click "
                f"(rule: {rule['mode']})")
    for cell in cells:
        where = f"{name}: {cell['kind']} cell #{cell['id']}"
        browser.click(*browser.js(LABEL_PLACE_JS % cell["id"]))
        after = next(c for c in browser.js(FOLD_STATE_JS) if c["id"] == cell["id"])
        assert after["open"] and after["input"], f"{where}: one click on its label does not open it"
        assert "hide" in after["label"], f"{where}: the open fold's label reads {after['label']!r}"
    return len(cells)


def first_screenful(browser: DevTools, html_file: Path, name: str) -> list[Path]:
    """What a reader sees first of a page (NAME-first-screen.png) and, where the page has
    folds, the screen around the first one (NAME-first-fold.png), folds closed; saved for
    people to look at."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shots = [SCREENSHOTS / f"{name}-first-screen.png"]
    browser.open(html_file.as_uri(), *SCREEN)
    browser.screenshot(shots[0])
    if browser.js("""(() => {
          const cell = document.querySelector('div.cell.tag_check, div.cell.tag_helper');
          if (cell) { cell.scrollIntoView({block: 'start'}); window.scrollBy(0, -120); }
          return !!cell; })()"""):
        shots.append(SCREENSHOTS / f"{name}-first-fold.png")
        browser.screenshot(shots[1])
    for shot in shots:
        assert matplotlib.image.imread(shot).std() > 0.02, f"the screenshot {shot.name} is blank"
    return shots


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_check_and_helper_cells_folded_in_html(site, nb):
    if not check_folds_in_html(page_path(nb.stem), nb):
        pytest.skip(f"{nb.stem} has no cell tagged check or helper yet")


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_check_and_helper_cells_fold_in_browser(devtools, nb):
    first_screenful(devtools, page_path(nb.stem), nb.stem)
    if not check_folds_in_browser(devtools, page_path(nb.stem), nb):
        pytest.skip(f"{nb.stem} has no cell tagged check or helper yet (its first screen is saved)")


# A small site from a copy of one notebook with tagged cells, so that the folding is tested
# whatever the committed notebooks carry: the first code cell (the install cell) and the first
# that draws a picture are `helper`, the first other cell that prints without asserting is a
# `helper` with `hide-output`, every cell with an assert is `check`, the last of them with
# `hide-cell`: every fold mode of docs/conf.py's rule appears.
TAGGED_SOURCE = "00_setup"


@pytest.fixture(scope="module")
def tagged_site(tmp_path_factory):
    source = ROOT / "notebooks" / f"{TAGGED_SOURCE}.ipynb"
    if not source.exists():
        pytest.skip(f"notebooks/{source.name} is not written yet")
    src, out = tmp_path_factory.mktemp("tagged-src"), tmp_path_factory.mktemp("tagged-html")
    (src / "docs").mkdir()
    (src / "notebooks").mkdir()
    shutil.copy(ROOT / "docs" / "index.md", src / "docs" / "index.md")
    nb = json.loads(source.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    fold_tags = {*FOLD_TAGS, "hide-input", "hide-output", "hide-cell"}
    for cell in code:
        cell["metadata"]["tags"] = [t for t in cell["metadata"].get("tags", []) if t not in fold_tags]
    picture = next(c for c in code if any(set(o.get("data", {})) & IMAGE_MIMES
                                          for o in c.get("outputs", [])))
    checks = [c for c in code if "assert " in "".join(c["source"]) and c not in (code[0], picture)]
    noisy = next(c for c in code if c.get("outputs") and c not in (code[0], picture, *checks))
    for cell in (code[0], picture):
        cell["metadata"]["tags"].append("helper")
    noisy["metadata"]["tags"] += ["helper", "hide-output"]
    for cell in checks:
        cell["metadata"]["tags"].append("check")
    checks[-1]["metadata"]["tags"].append("hide-cell")
    nb_path = src / "notebooks" / source.name
    nb_path.write_text(json.dumps(nb))
    # No -W: the copy's links to the other notebooks have no target in this small site.
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-b", "html", "-c", str(ROOT / "docs"), "-q", "-E",
         str(src), str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"the tagged copy's site does not build:\n{result.stderr[-3000:]}"
    return {"nb": nb_path, "html": out / "notebooks" / f"{TAGGED_SOURCE}.html"}


def test_tagged_copy_folded_in_html(tagged_site):
    folds = expected_folds(tagged_site["nb"])
    assert {f["kind"] for f in folds} == {"check", "helper"}, "the tagged copy lacks a check or helper"
    assert {f["mode"] for f in folds} == {"input", "input+output", "all"}, "a fold mode is not tested"
    assert check_folds_in_html(tagged_site["html"], tagged_site["nb"]) == len(folds)


def test_tagged_copy_folds_in_browser(devtools, tagged_site):
    clicked = check_folds_in_browser(devtools, tagged_site["html"], tagged_site["nb"])
    assert clicked == len(expected_folds(tagged_site["nb"])) > 0
    first_screenful(devtools, tagged_site["html"], f"{TAGGED_SOURCE}-tagged-copy")


@pytest.mark.parametrize("ci", ["true", ""])
def test_no_browser_fails_in_ci_and_skips_elsewhere(monkeypatch, ci):
    """Issue 27: in CI a missing Chromium fails the browser checks with a clear line, rather
    than skipping them; on a laptop they skip, saying why."""
    monkeypatch.setenv("CI", ci)
    monkeypatch.setenv("CHROMIUM", "no-such-browser-here")
    outcome = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(outcome, match="no Chromium on this machine") as caught:
        find_chromium()
    assert ("CI=true" in str(caught.value)) == bool(ci)
    assert "apt-get install chromium" in str(caught.value)
