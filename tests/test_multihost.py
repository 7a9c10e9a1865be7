"""The multi-process training script of notebook 05, run for real: 2 processes x 4 CPU devices.

The script's only source is the notebook: its `%%writefile` cells in md/05_multihost.md. We
assemble them as the notebook does, then check that the 2-process job trains like one process
with 8 devices (to float32 round-off), writes a checkpoint collectively, and that a process
crashing in the middle of training ends the job promptly with a clear message and leaves no
process behind, even when the launcher itself is killed. The launcher's bookkeeping of exits,
the validation of the command line and the check of --model-axis against the model are tested
on their own, without JAX.
"""

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jupytext
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "md" / "05_multihost.md"
JOB_TIMEOUT_S = 300


def script_source() -> str:
    """The cells `%%writefile [-a] multihost_train.py`, magic lines removed, in notebook order."""
    cells = [c.source for c in jupytext.read(NOTEBOOK).cells
             if c.cell_type == "code" and c.source.startswith("%%writefile")]
    assert cells and re.match(r"%%writefile multihost_train\.py\n", cells[0]), "the first cell must create the file"
    assert all(re.match(r"%%writefile -a multihost_train\.py\n", c) for c in cells[1:]), "later cells must append"
    return "".join(c.split("\n", 1)[1] + "\n" for c in cells)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder with multihost_train.py and tokens.npy (the offline corpus, compact vocabulary).

    The tokens are prepared as in the notebook's data cells (keep the two in step).
    """
    import tiktoken

    folder = tmp_path_factory.mktemp("multihost")
    (folder / "multihost_train.py").write_text(script_source())
    data_dir = Path(os.environ["COURSE_DATA_DIR"])
    text = (data_dir / "offline-stories-valid.txt").read_text(encoding="utf-8")
    stories = [s.strip() for s in text.split("<|endoftext|>") if s.strip()][:2000]
    enc = tiktoken.get_encoding("gpt2")
    ids = np.concatenate([np.array(t + [enc.eot_token]) for t in enc.encode_ordinary_batch(stories)])
    used, tokens = np.unique(ids, return_inverse=True)
    np.save(folder / "tokens.npy", tokens.astype(np.int32))
    folder.joinpath("vocab.txt").write_text(str(-(-len(used) // 8) * 8))
    return folder


def run_job(folder: Path, *flags: str, timeout_s: float = JOB_TIMEOUT_S):
    vocab = folder.joinpath("vocab.txt").read_text()
    command = [sys.executable, "multihost_train.py", "--tokens", "tokens.npy", "--vocab", vocab,
               "--timeout", str(timeout_s), *flags]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=timeout_s + 60)
    return done.returncode, done.stdout + done.stderr, time.perf_counter() - start


def result_of(output: str) -> dict:
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, f"expected one RESULT line (from process 0 only):\n{output}"
    return json.loads(lines[0].removeprefix("RESULT "))


def workers_alive(folder: Path) -> dict[int, str]:
    """{pid: command line} of the workers still running our script (Linux /proc).

    Workers run the script by its absolute path, which contains `folder`; the launcher runs it
    by a relative one (cwd=folder), so it is not counted.
    """
    alive = {}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(a.endswith("multihost_train.py") for a in args) and str(folder) in " ".join(args):
            alive[int(cmdline.parent.name)] = " ".join(args)
    return alive


def stop_seconds(output: str, count: int) -> float:
    """How long the launcher took to stop `count` running workers, from its last message."""
    match = re.search(rf"launcher: stopped {count} process\(es\) in ([0-9.]+) s", output)
    assert match, f"the launcher did not report stopping {count} process(es):\n{output}"
    return float(match[1])


def test_script_passes_ruff(workdir):
    """Ruff skips `%%writefile` cells in the notebook, so lint the assembled script here."""
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--config",
                             str(ROOT / "pyproject.toml"), "multihost_train.py"],
                            cwd=workdir, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_two_processes_train_like_one(workdir):
    code, output, two_s = run_job(workdir, "--launch", "2", "--devices-per-process", "4",
                                  "--checkpoint-dir", "ckpt-2x4")
    assert code == 0, output
    two = result_of(output)
    assert "process 1: local devices" in output and "[process 1]" not in output, "only process 0 prints"

    code, output, one_s = run_job(workdir, "--launch", "1", "--devices-per-process", "8")
    assert code == 0, output
    one = result_of(output)

    assert (two["processes"], two["devices"], one["processes"], one["devices"]) == (2, 8, 1, 8)
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-5)
    assert two["losses"][-1] < two["losses"][0] - 0.5, "the loss did not go down"
    step_dir = workdir / "ckpt-2x4" / str(len(two["losses"]))
    assert (step_dir / "commit_success.txt").exists(), "the collective checkpoint was not committed"
    assert {"ocdbt.process_0", "ocdbt.process_1"} <= {p.name for p in (step_dir / "params").iterdir()}
    print(f"wall time: 2 processes x 4 devices {two_s:.1f} s, 1 process x 8 devices {one_s:.1f} s")


def test_a_crash_mid_training_stops_the_job(workdir):
    code, output, seconds = run_job(workdir, "--launch", "2", "--inject", "error", "--inject-process", "1",
                                    "--inject-step", "1", timeout_s=JOB_TIMEOUT_S)
    assert code == 1, output
    assert "launcher: process 1 failed" in output and "injected failure on process 1 at step 1" in output
    assert "step 0" in output, "the crash should come after a completed step"
    assert seconds < JOB_TIMEOUT_S, "the launcher waited for the timeout instead of reacting to the crash"
    # Process 0 is connected, so JAX catches SIGTERM (a preemption notice) and it would go on
    # waiting in its collective: the launcher must SIGKILL it, which takes a moment. (Should
    # process 0 notice the closed connection and fail first, there is nothing left to stop.)
    if "launcher: stopped" in output:
        assert stop_seconds(output, 1) < 5, "process 0 was not stopped promptly"
    assert not workers_alive(workdir), "a worker outlived the launcher"


def test_a_hang_hits_the_timeout(workdir):
    """Process 1 hangs once connected; both are alive, connected (so JAX catches SIGTERM), and stuck."""
    code, output, seconds = run_job(workdir, "--launch", "2", "--inject", "hang", "--inject-step", "-1",
                                    timeout_s=10)
    assert code == 124 and "timed out" in output, output
    assert seconds < 10 + 30
    assert stop_seconds(output, 2) < 5, "the workers were not stopped promptly"
    assert not workers_alive(workdir), "a worker outlived the launcher"


def test_workers_die_with_a_killed_launcher(workdir):
    """SIGKILL skips the launcher's `finally`: the workers' parent-death signal must end them."""
    vocab = workdir.joinpath("vocab.txt").read_text()
    launcher = subprocess.Popen(
        [sys.executable, "multihost_train.py", "--tokens", "tokens.npy", "--vocab", vocab, "--launch", "2",
         "--inject", "hang", "--inject-step", "-2", "--timeout", str(JOB_TIMEOUT_S)],
        cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while len(workers_alive(workdir)) < 2:
            assert launcher.poll() is None and time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.1)
        time.sleep(2)  # let them get past their start-up, into JAX
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 10
        while workers_alive(workdir) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not workers_alive(workdir), "workers outlived a SIGKILLed launcher"
    finally:
        launcher.kill()
        for pid in workers_alive(workdir):  # if the test failed, leave nothing behind
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def script(workdir):
    """The assembled script, imported as a module (its top level imports only the standard library)."""
    spec = importlib.util.spec_from_file_location("multihost_train_under_test", workdir / "multihost_train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("exit_codes", "expected"), [
    ((0, 0), 0),
    ((3, 0), 1),  # both end before the launcher first waits: the failure must not be overlooked
    ((0, 3), 1),
    ((3, 3, 0, 0), 1),
])
def test_the_launcher_sees_every_exit(script, monkeypatch, capsys, exit_codes, expected):
    """Workers that end at once, even before the launcher waits, are all examined."""
    commands = [[sys.executable, "-c", f"import sys; sys.exit({c})"] for c in exit_codes]
    monkeypatch.setattr(script, "worker_commands", lambda args: (commands, dict(os.environ)))
    args = script.parse_args(["--launch", str(len(commands)), "--tokens", "t.npy", "--vocab", "8",
                              "--timeout", "60"])
    for _ in range(5):  # the races are timing-dependent: try a few times
        start = time.monotonic()
        assert script.launch(args) == expected
        assert time.monotonic() - start < 30, "the launcher waited for the timeout"
        if expected:
            assert "failed (exit code 3)" in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "message"), [
    (["--coordinator", "h:1"], "--coordinator, --num-processes and --process-id together"),
    (["--num-processes", "2", "--process-id", "0"], "--coordinator, --num-processes and --process-id together"),
    (["--coordinator", "h:1", "--num-processes", "2", "--process-id", "2"], "--process-id 2 is not in 0 ... 1"),
    (["--steps", "0"], "--steps must be positive"),
    (["--launch", "0"], "N must be 1 or more"),
    (["--launch", "2", "--coordinator", "h:1"], "don't pass them too"),
    (["--launch", "2", "--model-axis", "3"], "--model-axis 3 must divide --devices-per-process 4"),
    (["--launch", "2", "--batch", "6"], "--batch 6 must be a multiple of the `data` axis, 4"),
])
def test_bad_command_lines_say_what_to_do(script, capsys, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        script.parse_args(["--tokens", "t.npy", "--vocab", "8", *flags])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_good_command_lines_pass(script):
    script.parse_args(["--tokens", "t.npy", "--vocab", "8"])  # a worker on a detected cluster
    script.parse_args(["--tokens", "t.npy", "--vocab", "8", "--coordinator", "h:1", "--num-processes", "2",
                       "--process-id", "1"])
    script.parse_args(["--tokens", "t.npy", "--vocab", "8", "--launch", "1", "--devices-per-process", "8"])


def test_model_axis_is_checked_against_the_model(script):
    cfg = script.Config(V=400, T=64)  # N = 4 heads
    for ok in (1, 2, 4):
        script.check_model_axis(cfg, ok)
    with pytest.raises(ValueError, match=r"--model-axis 8 does not divide .*N \(heads\).*\[1, 2, 4\]"):
        script.check_model_axis(cfg, 8)
