"""``twinkle-fx`` answers ``--help``, ``--version`` and a bad argument before importing torch,
transformers or triton (seconds each on a 2-core machine), with exit status 2 for every usage error
in every subcommand; the package root imports none of them either."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "triton")

# The package root makes the backend name known: through the installed entry point (no import), or,
# from a checkout that was never installed (a bare PYTHONPATH), by importing torch._dynamo itself
pytestmark = pytest.mark.skipif(
    not any(ep.name == "twinkle" for ep in entry_points(group="torch_dynamo_backends")),
    reason="twinkle_fx is not installed here (pip install -e .): importing it registers the backend with torch")

# runs the command in this interpreter, then reports on stderr which heavy modules it imported
_PROBE = """
import sys
from twinkle_fx.cli import main
try:
    status = main(sys.argv[1:])
except SystemExit as e:
    status = e.code
print("heavy:" + ",".join(m for m in {heavy!r} if m in sys.modules), file=sys.stderr)
sys.exit(status)
"""


def _run(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "kernels"), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", _PROBE.format(heavy=HEAVY), *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["bench", "--help"], ["check", "--help"],
                                  ["explain", "--help"]])
def test_help_and_version_import_nothing_heavy(argv):
    proc = _run(*argv)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    assert proc.stderr.splitlines()[-1] == "heavy:", proc.stderr


@pytest.mark.parametrize("argv, expected", [
    (["bench", "--tiny", "--backends", "eager,fast"], "--backends: unknown backend(s) 'fast'"),
    (["bench", "--tiny", "--inference", "--backends", "liger"], "--backends: unknown backend(s) 'liger'"),
    (["bench", "--tiny", "--micro", "--backends", "kernelize"], "--backends: unknown backend(s) 'kernelize'"),
    (["bench", "--tiny", "--backends", ","], "argument --backends: is empty"),
    (["bench", "--tiny", "--model", "gpt9"], "--model: unknown model(s) 'gpt9'"),
    (["bench", "--inference", "--prefill", "-5"], "argument --prefill: must be a positive integer, got -5"),
    (["bench", "--inference", "--tiny", "--context", "0"], "argument --context: must be a positive integer, got 0"),
    (["bench", "--inference", "--tiny", "--decode-batch", "0"],
     "argument --decode-batch: must be a positive integer, got 0"),
    (["bench", "--tiny", "--loss-rtol", "-1"], "argument --loss-rtol: must be a positive number, got -1"),
    (["bench", "--tiny", "--inference", "--twinkle-options", "{nope"], "--twinkle-options is not JSON"),
    (["bench", "--tiny", "--micro", "--profile", "prof"], "--profile profiles the model benchmark's backends"),
    (["bench", "--tiny", "--micro", "--inference"], "are three benchmarks; give one"),
    (["bench", "--tiny", "--out", "pyproject.toml"], "--out pyproject.toml: is a file"),
    (["bench", "--tiny", "--device", "gpu"], "argument --device: 'gpu' is not a device name"),
    (["check", "--tiny", "--dtypes", "fp64"], "--dtypes: unknown dtype(s) 'fp64'; valid: fp32, bf16, fp16"),
    (["check", "--tiny", "--models", "gpt9"], "--models: unknown model family(s) 'gpt9'"),
    (["check", "--tiny", "--setup", "no_such_module"], "--setup no_such_module: no such file or module"),
    (["check", "--tiny", "--setup", "missing_setup.py"], "--setup missing_setup.py: no such file"),
    (["check", "--tiny", "--out", "tests"], "--out tests: is a directory"),
    (["check", "--tiny", "--out", "pyproject.toml/check.json"], "pyproject.toml is a file, not a folder"),
    pytest.param(["check", "--tiny", "--out", "/proc/check.json"],
                 "--out /proc/check.json: cannot create files in /proc",
                 marks=pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")),
    (["bench", "--tiny", "--profile", "pyproject.toml"], "--profile pyproject.toml: is a file"),
    (["bench", "--tiny", "--out", "pyproject.toml/results"], "pyproject.toml is a file, so no folder can be made"),
    (["check", "--tiny", "--device", "nonsense"], "argument --device: 'nonsense' is not a device name"),
    (["check", "--tiny", "--bogus"], "unrecognized arguments: --bogus"),
    (["explain", "--config", "lama"], "did you mean llama"),
    (["explain", "--device", "nonsense"], "argument --device: 'nonsense' is not a device name"),
])
def test_usage_errors_exit_2_before_any_heavy_import(argv, expected):
    proc = _run(*argv)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and not proc.stdout
    (error,) = [line for line in lines if "error:" in line]
    assert error.startswith(f"twinkle-fx {argv[0]}: error: ") and expected in error, error
    assert lines[-1] == "heavy:", proc.stderr


def test_the_package_root_imports_the_library_on_first_use():
    probe = ("import sys, twinkle_fx\n"
             "assert not {'torch', 'transformers', 'triton'} & set(sys.modules), sorted(sys.modules)\n"
             "from twinkle_fx import check_kernels, kernelize_model\n"
             "import twinkle_fx.compiler.entry\n"
             "import torch\n"
             "assert callable(twinkle_fx.explain) and twinkle_fx.explain.__name__ == 'explain'\n"
             "assert 'twinkle' in torch._dynamo.list_backends(exclude_tags=())\n"
             "print(check_kernels.__module__, kernelize_model.__name__)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "kernels"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["twinkle_fx.checklist.checklist", "kernelize_model"]
