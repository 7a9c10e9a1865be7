"""The `xprof` server that notebook 04 tells readers to run serves a trace JAX captured.

The test captures its own small trace in a temporary folder (in a subprocess, so this
process never starts JAX), starts `xprof --logdir DIR --port PORT` on free ports, asks
`http://127.0.0.1:PORT/data/plugin/profile/runs` until the run is listed (bounded wait),
checks that the server converts the capture into the trace viewer's data (the events of
the traced steps), and always stops the server by its PID.

The server binds to the wildcard address (xprof 2.24.2 has no host flag); the test only
talks to it over 127.0.0.1. It also starts a gRPC worker on `--grpc_port` (default 50051),
so both ports are chosen free to let two runs coexist.
"""

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
STARTUP_TIMEOUT_S = 60.0

CAPTURE = """
import jax, jax.numpy as jnp, sys
f = jax.jit(lambda x: jnp.tanh(x @ x).sum())
x = jnp.ones((64, 64))
f(x).block_until_ready()  # compile outside the trace
with jax.profiler.trace(sys.argv[1]):
    for i in range(3):
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            f(x).block_until_ready()
"""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout_s: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        body = response.read()
    return gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("xprof")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("XLA_FLAGS", None)  # one device is enough here
    subprocess.run([sys.executable, "-c", CAPTURE, str(logdir)], env=env, check=True, timeout=300)
    runs = sorted((logdir / "plugins" / "profile").iterdir())
    assert len(runs) == 1, runs
    assert list(runs[0].glob("*.xplane.pb")), f"no .xplane.pb in {runs[0]}"
    return logdir


def test_xprof_server_lists_the_captured_run(trace_dir):
    xprof = BIN / "xprof"
    assert xprof.exists(), "the xprof command is missing: install tensorboard-plugin-profile"
    run_name = next((trace_dir / "plugins" / "profile").iterdir()).name
    port, grpc_port = free_port(), free_port()
    while grpc_port == port:
        grpc_port = free_port()
    log = open(trace_dir / "server.log", "wb")
    server = subprocess.Popen(
        [str(xprof), "--logdir", str(trace_dir), "--port", str(port), "--grpc_port", str(grpc_port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: nothing of ours is signalled
    )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        runs, last_error = None, None
        while time.monotonic() < deadline:
            assert server.poll() is None, (
                f"xprof exited with {server.returncode}:\n{(trace_dir / 'server.log').read_text()}"
            )
            try:
                runs = json.loads(get(f"http://127.0.0.1:{port}/data/plugin/profile/runs"))
                if runs:
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
                last_error = e
            time.sleep(0.5)
        assert runs, f"no runs listed within {STARTUP_TIMEOUT_S:.0f} s (last error: {last_error})"
        assert any(run_name in str(run) for run in runs), f"{run_name} not in {runs}"
        # The front page is served too (what a reader opens in the browser).
        assert b"<html" in get(f"http://127.0.0.1:{port}/").lower()
        # The server reads the capture: the trace viewer's data holds the three traced steps.
        query = f"run={urllib.parse.quote(run_name)}&tag=trace_viewer@"
        hosts = json.loads(get(f"http://127.0.0.1:{port}/data/plugin/profile/hosts?{query}", timeout_s=60))
        assert hosts and all("hostname" in h for h in hosts), hosts
        host = urllib.parse.quote(hosts[0]["hostname"])
        trace = json.loads(get(f"http://127.0.0.1:{port}/data/plugin/profile/data?{query}&host={host}", timeout_s=120))
        names = {e.get("name") for e in trace.get("traceEvents", []) if e.get("ph") == "X"}
        steps = {f"train {i}" for i in range(3)}  # a StepTraceAnnotation shows as "<name> <step_num>"
        assert steps <= names, f"the traced steps {sorted(steps - names)} are missing from the trace viewer's data"
    finally:
        os.kill(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(server.pid, signal.SIGKILL)
            server.wait(timeout=10)
        log.close()
