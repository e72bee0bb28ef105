"""bench/gpu/check.sh, the GPU checks run on a lent GPU machine, as far as a CPU machine can
check it: it parses, and its dry run lists every step in order and ends with a summary."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu" / "check.sh"


def test_the_script_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True, timeout=30)


def test_the_dry_run_names_every_gpu_step(tmp_path):
    done = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SKULK_ENGINES_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stdout + done.stderr
    steps = [line.split(":", 1)[0].removeprefix("=== ") for line in done.stdout.splitlines() if line.startswith("=== ")]
    assert steps == ["nvml", "gpu-wheel", "gpu-wheel-list", "bundled-on-gpu", "native-cuda-build",
                     "native-cuda-version", "served-tests", "concurrency", "summary"]
    assert "--wheel" in done.stdout and "bench/concurrency.py" in done.stdout
    assert "SKIP vllm" in done.stdout
