"""Test-session set-up shared by nbval (the notebooks) and tests/.

Runs at import, before any notebook kernel starts, so that every kernel inherits:

* ``XLA_FLAGS``: 8 emulated CPU devices, or ``CPU_DEVICES=N`` to choose another count
  (``make test-devices`` runs the notebooks at 1, 2 and 4). A caller who already put
  ``--xla_force_host_platform_device_count`` in ``XLA_FLAGS`` keeps it;
* ``TIKTOKEN_CACHE_DIR`` and ``COURSE_DATA_DIR``: the GPT-2 vocabulary and the offline
  TinyStories-format corpus (tools/offline.py), so nothing waits on the network;
* proxy variables that point at a closed local port (``offline.no_network_env``), so a
  download that slipped into a notebook fails at once. `make test` also runs pytest in a
  network namespace with loopback only (``tools/offline.py --no-network``), where even a raw
  socket cannot leave the machine.

It also makes nbval fail a cell tagged ``raises-exception`` that no longer raises (nbval
itself only lets such a cell fail; it does not require it to), and, under ``COURSE_LIVE_LOG=1``
(tools/run_notebooks.py), prints each cell's time, what it printed and any failure's message as
the cell ends.
"""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tools"))

import offline  # noqa: E402

os.environ.update(offline.course_env())
os.environ.update(offline.no_network_env())
DEVICES = offline.emulated_devices()


def pytest_report_header(config):
    network = os.environ.get("COURSE_NETWORK", "proxies at a closed port only (no network namespace)")
    where = (f"the attached accelerator (JAX's default backend; {DEVICES} emulated CPU devices beside it)"
             if os.environ.get("COURSE_ACCELERATOR") == "1" else f"{DEVICES} emulated CPU devices")
    return f"notebooks run on {where}; data in {os.environ['COURSE_DATA_DIR']}; network: {network}"


LIVE_LOG_CHARS = 6000  # of a failure's message, printed as it happens
LIVE_OUTPUT_CHARS = 2000  # of a cell's printed output (its end), printed after its time
SESSION: dict = {}


def pytest_configure(config):
    SESSION["config"] = config


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under COURSE_LIVE_LOG=1, a notebook cell's report carries what the cell printed (nbval keeps
    a cell's outputs in `item.test_outputs`), for the live log below."""
    outcome = yield
    if os.environ.get("COURSE_LIVE_LOG") == "1" and call.when == "call":
        outputs = getattr(item, "test_outputs", None) or []
        outcome.get_result().printed = "".join(out.get("text", "") for out in outputs
                                               if out.get("output_type") == "stream")


@pytest.hookimpl(trylast=True)  # after the terminal reporter has written the cell's PASSED/FAILED
def pytest_runtest_logreport(report):
    """COURSE_LIVE_LOG=1: each cell's time, what it printed, and a failure's message, written as
    the cell ends. pytest prints failures only when the session ends, so a notebook stopped from
    outside (a time limit on a lent GPU) would otherwise lose the one thing its log was for; and
    a run whose outputs are not compared (an accelerator, a preset) keeps its numbers (losses,
    tolerances) in the log."""
    if os.environ.get("COURSE_LIVE_LOG") != "1" or (report.when != "call" and not report.failed):
        return
    reporter = SESSION["config"].pluginmanager.get_plugin("terminalreporter") if SESSION else None
    if reporter is None:
        return
    reporter.write_line(f"    {report.when} {report.duration:.1f} s")
    printed = getattr(report, "printed", "").rstrip()
    if printed:
        printed = printed if len(printed) <= LIVE_OUTPUT_CHARS else "..." + printed[-LIVE_OUTPUT_CHARS:]
        reporter.write_line("\n".join("    | " + line for line in printed.splitlines()))
    if report.failed:
        text = report.longreprtext
        reporter.write_line(text if len(text) <= LIVE_LOG_CHARS else "..." + text[-LIVE_LOG_CHARS:])


def compares_outputs(environ=os.environ) -> bool:
    """The committed outputs were produced by `make run`: 8 emulated CPU devices, every TPU
    compile run, each notebook's own preset. Any other run executes every cell and asserts every
    check, but does not compare outputs."""
    return (DEVICES == offline.DEFAULT_DEVICES and environ.get("COURSE_TPU_COMPILE", "1") == "1"
            and not environ.get("COURSE_PRESET") and environ.get("COURSE_ACCELERATOR") != "1")


def pytest_collection_modifyitems(config, items):
    if compares_outputs():
        return
    for item in items:
        options = getattr(item, "options", None)
        if isinstance(options, dict) and "check" in options:
            options["check"] = False


def expects_exception(item) -> bool:
    """An nbval cell marked to raise, however nbval was told (the tags `raises-exception` or
    `nbval-raises-exception`, or `# NBVAL_RAISES_EXCEPTION` on any comment line): nbval's own
    reading of the cell, its `check_exception` option."""
    options = getattr(item, "options", None)
    return isinstance(options, dict) and bool(options.get("check_exception"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    if expects_exception(item):
        outputs = getattr(item, "test_outputs", None) or []
        errors = [out for out in outputs if out.get("output_type") == "error"]
        if getattr(item.parent, "timed_out", False) or any(e.get("ename") == "KeyboardInterrupt" for e in errors):
            item.raise_cell_error(f"{item.name} is tagged raises-exception but timed out: a timeout is not the "
                                  "error it shows.")
        if not errors:
            item.raise_cell_error(f"{item.name} is tagged raises-exception but raised nothing: the error it "
                                  "shows stopped happening. Fix the cell, or remove the tag and the claim.")
    return result
