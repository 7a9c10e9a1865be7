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
itself only lets such a cell fail; it does not require it to).
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
    return (f"notebooks run on {DEVICES} emulated CPU devices; data in {os.environ['COURSE_DATA_DIR']}; "
            f"network: {network}")


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
