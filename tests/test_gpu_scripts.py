"""The shell scripts for GPU machines: usage errors exit 2, and the shared-machine check on a
machine without a CUDA GPU ends with exit status 2, a one-line reason and its files written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ["gpu_check.sh", "offline_wheels.sh", "offline_install.sh"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_usage_error_exits_2(script):
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / script)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage:")


def test_offline_install_rejects_a_missing_folder(tmp_path):
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "offline_install.sh"),
                           str(tmp_path / "nope")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "usage:" in proc.stderr


@pytest.mark.slow
def test_gpu_check_without_a_gpu_exits_2_and_says_why(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU: benchmarks/gpu_check.sh would run for real")
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(out)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    summary = (out / "summary.txt").read_text()
    assert "pytest -m gpu exit status: 0" in summary    # the CUDA tests skip cleanly
    result = json.loads((out / "gpu_check.json").read_text())
    assert result["ok"] is False
    assert "\n" not in result["error"] and "CUDA" in result["error"]


def test_gpu_tests_collect_without_the_solvers_dependencies():
    """A GPU image has torch but not lowtime, ortools, pymoo, zeus or ray: `pytest -m gpu` must
    still collect (a collection error would stop every GPU test)."""
    code = ("import sys\n"
            "for m in ('lowtime', 'ortools', 'pymoo', 'zeus', 'ray', 'pynvml'):\n"
            "    sys.modules[m] = None  # import raises ImportError\n"
            "import pytest\n"
            "sys.exit(pytest.main(['-m', 'gpu', '--collect-only', '-q', '-p', "
            "'no:cacheprovider', 'tests']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "error" not in proc.stdout.lower().split("collected")[-1]
    assert "test_gpu_cuda.py::test_backend_measures_a_plan_on_one_gpu" in proc.stdout
