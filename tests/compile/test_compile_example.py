"""examples/compile_qwen2.py runs as written and its numerics match."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.slow
def test_compile_qwen2_example():
    # the suite's device: conftest put TRITON_INTERPRET=1 in the environment on a CPU-only machine,
    # and the example picks the same device from it (CUDA on a GPU machine)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    done = subprocess.run([sys.executable, str(EXAMPLES / "compile_qwen2.py"), "--compiler", "aot_eager"],
                          env=env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    # 5 norms, 2 MLPs, 2 rotaries, and 3 residual adds joined to their norms' kernels
    assert "12 region(s) swapped, 0 kept" in output
    assert output.count("-> match") == 3 and "MISMATCH" not in output
