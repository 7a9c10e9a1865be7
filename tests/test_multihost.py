"""The multi-process training script of notebook 05, run for real: 2 processes x 4 CPU devices.

The script's only source is the notebook: its `%%writefile` cells in md/05_multihost.md. We
assemble them as the notebook does, then check that the 2-process job trains like one process
with 8 devices (to float32 round-off), writes checkpoints collectively, and that a process
crashing in the middle of training ends the job promptly with a clear message and leaves no
process behind, even when the launcher itself is killed. Jobs stopped mid-run (a worker killed
with SIGKILL; SIGTERM, a preemption notice, to the launcher; the launcher killed) are relaunched
and must resume from their last complete checkpoint with the losses of an uninterrupted run,
also on another process count; a half-written checkpoint is never restored. The launcher's
bookkeeping of exits, the validation of the command line and the check of --model-axis against
the model are tested on their own, without JAX.
"""

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jupytext
import numpy as np
import pytest

from bench.course import load_course_lib

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "md" / "05_multihost.md"
JOB_TIMEOUT_S = 600  # generous: a shared 2-core machine can be slow


def script_source() -> str:
    """The cells `%%writefile [-a] multihost_train.py`, magic lines removed, in notebook order."""
    cells = [c.source for c in jupytext.read(NOTEBOOK).cells  # (other cells write the cluster recipes)
             if c.cell_type == "code" and re.match(r"%%writefile (-a )?multihost_train\.py\n", c.source)]
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


# The notebook's own helpers for running the launcher (its cells tagged `course-lib`: run_job,
# run_and_signal, result_of, logged_losses, ...), not copies of them.
TOOLS = load_course_lib("05_multihost")
result_of, logged_losses = TOOLS.result_of, TOOLS.logged_losses


def run_job(folder: Path, *flags: str, timeout_s: float = JOB_TIMEOUT_S):
    """The notebook's run_job, in `folder`, with that folder's vocabulary size."""
    TOOLS.V = int(folder.joinpath("vocab.txt").read_text())
    return TOOLS.run_job(*flags, timeout_s=timeout_s, cwd=folder)


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


@pytest.fixture(scope="module")
def uninterrupted(workdir):
    """The reference: 2 processes x 4 devices, 8 steps, a checkpoint every 2 steps, never stopped."""
    code, output, seconds = run_job(workdir, "--launch", "2", "--devices-per-process", "4", "--steps", "8",
                                    "--checkpoint-dir", "ckpt-2x4", "--checkpoint-every", "2")
    assert code == 0, output
    return result_of(output), output, seconds


def test_two_processes_train_like_one(workdir, uninterrupted):
    two, output, two_s = uninterrupted
    assert "process 1: local devices" in output and "[process 1]" not in output, "only process 0 prints"

    code, output, one_s = run_job(workdir, "--launch", "1", "--devices-per-process", "8", "--steps", "8")
    assert code == 0, output
    one = result_of(output)

    assert (two["processes"], two["devices"], one["processes"], one["devices"]) == (2, 8, 1, 8)
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-5)
    assert two["losses"][-1] < two["losses"][0] - 0.5, "the loss did not go down"
    step_dir = workdir / "ckpt-2x4" / str(len(two["losses"]))
    assert (step_dir / "commit_success.txt").exists(), "the collective checkpoint was not committed"
    assert {"ocdbt.process_0", "ocdbt.process_1"} <= {p.name for p in (step_dir / "params").iterdir()}
    assert {"params", "opt_state", "data"} <= {p.name for p in step_dir.iterdir()}, "parameters, Adam, data"
    assert [s["step"] for s in two["saves"]] == [1, 2, 4, 6, 8], two["saves"]
    for save in two["saves"]:  # printed, not asserted: timings on a shared machine vary
        print(f"save of step {save['step']}: blocked {save['blocked_s']:.2f} s, written within "
              f"{save.get('finished_within_s', float('nan')):.2f} s over {save.get('steps_meanwhile')} step(s)")
    print(f"wall time: 2 processes x 4 devices {two_s:.1f} s, 1 process x 8 devices {one_s:.1f} s")


def test_a_plain_run_reports_nothing(workdir):
    """Without --report 1 (a real cluster's command line) the worker trains as written: no
    instruments, so no RESULT line and no gather of the whole state onto every host."""
    vocab = workdir.joinpath("vocab.txt").read_text()
    done = subprocess.run([sys.executable, "multihost_train.py", "--tokens", "tokens.npy", "--vocab", vocab,
                           "--launch", "1", "--devices-per-process", "2", "--steps", "2"],
                          cwd=workdir, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "step 1 " in output and "RESULT " not in output, output


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


def run_and_signal(folder: Path, *flags: str, at_step: int, sig: int, process: int | None = None,
                   timeout_s: float = JOB_TIMEOUT_S):
    """The notebook's run_and_signal, in `folder`: (exit code, output)."""
    TOOLS.V = int(folder.joinpath("vocab.txt").read_text())
    code, output, _ = TOOLS.run_and_signal(*flags, at_step=at_step, sig=sig, process=process,
                                           timeout_s=timeout_s, cwd=folder)
    return code, output


def resumed_from(output: str) -> int:
    match = re.search(r"resumed from the checkpoint of step (\d+)", output)
    assert match, f"the job did not resume:\n{output}"
    return int(match[1])


def assert_same_losses(reference: dict, run: dict) -> float:
    """The relaunched job's losses, step for step, against the uninterrupted run's; returns the gap."""
    steps = range(run["first"], run["first"] + len(run["losses"]))
    expected = [reference["losses"][s] for s in steps]
    np.testing.assert_allclose(run["losses"], expected, rtol=1e-6, err_msg="resumed losses differ")
    gap = float(np.abs(np.array(run["losses"]) - expected).max()) if run["losses"] else 0.0
    print(f"steps {steps.start}-{steps.stop - 1}: largest difference from the uninterrupted run {gap:.1e}")
    return gap


def test_sigkill_of_a_worker_then_resume(workdir, uninterrupted):
    """kill -9 on one worker: the launcher stops the job; the relaunch resumes from the last commit."""
    reference = uninterrupted[0]
    flags = ["--launch", "2", "--devices-per-process", "4", "--steps", "8", "--checkpoint-dir", "ckpt-kill",
             "--checkpoint-every", "2"]
    code, output = run_and_signal(workdir, *flags, at_step=4, sig=signal.SIGKILL, process=1)
    assert code == 1 and "process 1 failed" in output and "SIGKILL" in output, output
    for step, loss in logged_losses(output).items():  # the steps before the kill, as printed
        assert abs(loss - reference["losses"][step]) <= 5e-7 + 1e-6 * abs(loss), (step, loss)
    assert not workers_alive(workdir), "a worker outlived the launcher"
    code, output, _ = run_job(workdir, *flags)
    assert code == 0, output
    run = result_of(output)
    assert run["first"] == resumed_from(output) >= 2 and run["first"] + len(run["losses"]) == 8
    assert_same_losses(reference, run)


def test_sigterm_saves_at_the_sync_point_then_resume_on_fewer_processes(workdir, uninterrupted):
    """SIGTERM to the launcher of 4 processes: all save the same step and exit with 75; the job
    resumes on 2 processes, restores the same global arrays and goes on with the same losses."""
    reference = uninterrupted[0]
    flags = ["--steps", "8", "--checkpoint-dir", "ckpt-term", "--checkpoint-every", "4"]
    code, output = run_and_signal(workdir, "--launch", "4", "--devices-per-process", "2", *flags,
                                  at_step=2, sig=signal.SIGTERM)
    assert code == 75, output
    preempted = result_of(output)
    stop = preempted["first"] + len(preempted["losses"])
    assert preempted["preempted"] and 3 <= stop < 8, preempted
    assert (workdir / "ckpt-term" / str(stop) / "commit_success.txt").exists(), "the preemption save was not committed"
    assert_same_losses(reference, preempted)
    code, output, _ = run_job(workdir, "--launch", "2", "--devices-per-process", "4", *flags)
    assert code == 0, output
    resumed = result_of(output)
    assert resumed["first"] == resumed_from(output) == stop
    assert resumed["restored"] == preempted["final"], "4 processes saved other arrays than 2 restored"
    assert_same_losses(reference, resumed)


def test_the_issue_command_killed_and_relaunched(workdir, uninterrupted):
    """`--launch 4 --devices-per-process 2 --checkpoint-dir D --checkpoint-every 2`, the launcher
    killed with SIGKILL (the workers die with it) and the same command run again."""
    reference = uninterrupted[0]
    command = ["--launch", "4", "--devices-per-process", "2", "--checkpoint-dir", "D", "--checkpoint-every", "2",
               "--steps", "8"]
    code, output = run_and_signal(workdir, *command, at_step=4, sig=signal.SIGKILL)
    assert code == -signal.SIGKILL, output
    deadline = time.monotonic() + 10
    while workers_alive(workdir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not workers_alive(workdir), "workers outlived the killed launcher"
    code, output, _ = run_job(workdir, *command)
    assert code == 0, output
    run = result_of(output)
    assert run["first"] == resumed_from(output) >= 2
    assert_same_losses(reference, run)


def test_a_torn_checkpoint_is_never_restored(workdir, uninterrupted, tmp_path):
    """A save cut short leaves `<step>.orbax-checkpoint-tmp`: the relaunch ignores it, deletes it,
    and resumes from the latest committed step."""
    folder = workdir / "ckpt-torn"
    shutil.copytree(workdir / "ckpt-2x4", folder)
    torn = folder / "10.orbax-checkpoint-tmp"
    shutil.copytree(folder / "8", torn)
    for f in [f for f in torn.rglob("*") if f.is_file()][::2]:
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])  # half-written files
    (torn / "commit_success.txt").unlink(missing_ok=True)
    code, output, _ = run_job(workdir, "--launch", "2", "--devices-per-process", "4", "--steps", "10",
                              "--checkpoint-dir", "ckpt-torn", "--checkpoint-every", "2")
    assert code == 0, output
    assert resumed_from(output) == 8 and "unfinished checkpoint 10.orbax-checkpoint-tmp" in output
    run = result_of(output)
    assert run["first"] == 8 and len(run["losses"]) == 2
    assert (folder / "10" / "commit_success.txt").exists() and not torn.exists()


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
