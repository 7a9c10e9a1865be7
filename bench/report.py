"""The benchmark's table: printed, and written as JSON + Markdown under bench/results/."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def machine() -> dict:
    """Where the numbers come from: CPU, cores, load, JAX backend and devices, commit."""
    import jax

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass

    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        except OSError:
            return ""

    device = jax.devices()[0]
    return {
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
        "cpu": cpu,
        "cpu_cores": os.cpu_count(),
        "load_average_1min_at_start": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "backend": device.platform,
        "devices": f"{jax.device_count()} x {device.device_kind}"
        + (" (emulated on the host CPU)" if device.platform == "cpu" else ""),
        "commit": git("rev-parse", "--short", "HEAD") + (" (modified)" if git("status", "--porcelain", "md") else ""),
    }


def markdown(results: dict) -> str:
    m = results["machine"]
    lines = [
        f"Machine: {m['cpu']}, {m['cpu_cores']} cores (1-min load average {m['load_average_1min_at_start']} "
        f"at start, {m.get('load_average_1min_at_end', '?')} at end); JAX {m['jax']} on {m['devices']}; "
        f"commit {m['commit']}; {m['date_utc']} UTC; the benchmark took {m.get('bench_wall_s', 0):.0f} s.",
        "",
        "| benchmark | configuration | result | compile (s) |",
        "|---|---|---|---|",
    ]
    for row in results["rows"]:
        compile_s = "" if row.get("compile_s") is None else f"{row['compile_s']:.1f}"
        lines.append(f"| {row['benchmark']} | {row['config']} | {row['result']} | {compile_s} |")
    if results["targets"]:
        lines += ["", "| target | required | measured | met |", "|---|---|---|---|"]
        for t in results["targets"]:
            lines.append(f"| {t['target']} | {t['required']} | {t['measured']} | {'yes' if t['met'] else '**no**'} |")
    if results["errors"]:
        lines += ["", "Sections that failed:"] + [f"- {name}: {err}" for name, err in results["errors"].items()]
    return "\n".join(lines) + "\n"


def write(results: dict, dated: bool = False) -> tuple[Path, Path]:
    """bench/results/latest.{json,md} (rewritten after every section), plus a dated copy of each
    at the end."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    tag = f"{stamp}-{results['machine']['backend']}"
    text, blob = markdown(results), json.dumps(results, indent=2, default=str)
    for name in ("latest", tag) if dated else ("latest",):
        (RESULTS / f"{name}.md").write_text(text)
        (RESULTS / f"{name}.json").write_text(blob)
    return RESULTS / "latest.md", RESULTS / "latest.json"


README_BEGIN = "<!-- bench:begin (written by `make bench ARGS=--readme`) -->"
README_END = "<!-- bench:end -->"


def update_readme(results: dict, readme: Path = ROOT / "README.md") -> bool:
    """Put this run's table between the bench markers of README.md; False if it has none."""
    text = readme.read_text()
    if README_BEGIN not in text or README_END not in text:
        return False
    head, rest = text.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    readme.write_text(f"{head}{README_BEGIN}\n{markdown(results)}{README_END}{tail}")
    return True
