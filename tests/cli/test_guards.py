"""The guards of ``check`` and ``bench`` that need torch: the device, the CPU without ``--tiny``, the
kernels a check names, the setup it runs; and a CPU run chooses the Triton interpreter in-process
(no restart) and prints nothing but its report and progress."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from twinkle_fx.cli import main

ROOT = Path(__file__).resolve().parents[2]

# a kernel in plain PyTorch: the check runs every item on it in seconds, no Triton kernel involved
SETUP = ("import sys, types\n"
         "from twinkle_fx import register_function_kernel\n"
         "m = types.ModuleType('user_ops_guard'); m.scale = lambda x: x * 2; sys.modules['user_ops_guard'] = m\n"
         "def scale_kernel(x):\n"
         "    '''x * 2.'''\n"
         "    return x + x\n"
         "register_function_kernel(func_name='scale', target_module='user_ops_guard', func_impl=scale_kernel, "
         "device='cpu')\n")


def _command(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # as a user's shell has it
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "kernels"), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "twinkle_fx", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _fails(argv: list[str], capsys) -> str:
    threads = torch.get_num_threads()
    try:
        status = main(argv)
    except SystemExit as e:
        status = e.code
    finally:
        torch.set_num_threads(threads)
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Traceback" not in err
    (error,) = [line for line in err.splitlines() if "error:" in line]
    return error


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_check_and_bench_refuse_a_full_size_cpu_run_alike():
    check, bench = _command("check", timeout=120), _command("bench", timeout=120)
    assert (check.returncode, bench.returncode) == (2, 2), check.stderr + bench.stderr
    tail = "through the Triton interpreter) takes hours; use --tiny for the CPU smoke test, a GPU (--device cuda), " \
           "or --force to run it anyway"
    assert check.stderr.startswith("twinkle-fx check: error: a full-size run on the CPU (") and tail in check.stderr
    assert bench.stderr.startswith("twinkle-fx bench: error: a full-size run on the CPU (") and tail in bench.stderr


@pytest.mark.interpreter  # a CPU run through the Triton interpreter, which the GPU image's numpy does not run
def test_a_cpu_check_runs_the_interpreter_without_restarting_and_prints_no_profiler_noise(tmp_path):
    setup = tmp_path / "setup_guard.py"
    setup.write_text(SETUP)
    proc = _command("check", "--tiny", "--device", "cpu", "--no-builtin", "--dtypes", "fp32", "--setup", str(setup))
    assert proc.returncode == 0, proc.stderr
    assert "restart" not in proc.stderr
    assert "profiler PASS" in proc.stderr, proc.stderr
    # kineto's "USDT: ... profiler_start" / "STAGE: ... Completed Stage" lines
    assert not [line for line in proc.stderr.splitlines() if line.startswith(("USDT:", "STAGE:"))], proc.stderr
    assert "scale_kernel  user_ops_guard.scale  PASS" in proc.stdout


@pytest.mark.interpreter  # check --tiny on the CPU, in this process: the interpreter must be on from the start
def test_check_names_an_unknown_kernel_and_the_registered_ones(tmp_path, capsys):
    setup = tmp_path / "setup_guard.py"
    setup.write_text(SETUP)
    error = _fails(["check", "--tiny", "--device", "cpu", "--no-builtin", "--setup", str(setup),
                    "--kernels", "scale,NoSuchKernel"], capsys)
    assert "--kernels: unknown kernel name(s) 'NoSuchKernel'" in error
    assert "registered: scale, user_ops_guard.scale" in error


@pytest.mark.interpreter  # check --tiny on the CPU, in this process: the interpreter must be on from the start
def test_check_setup_naming_a_missing_submodule_is_a_usage_error(capsys):
    error = _fails(["check", "--tiny", "--device", "cpu", "--no-builtin", "--setup", "json.no_such_module"], capsys)
    assert "--setup json.no_such_module: no module named 'json.no_such_module'" in error


def test_check_on_a_device_this_machine_lacks_says_what_to_use(capsys):
    missing = "cuda" if not torch.cuda.is_available() else "cuda:99"
    error = _fails(["check", "--tiny", "--no-builtin", "--device", missing], capsys)
    assert f"--device {missing}:" in error
    assert "use --device cpu" in error or "this machine has" in error


def test_the_names_checked_before_import_are_the_library_tables():
    from twinkle_fx.bench.backends import BACKENDS
    from twinkle_fx.bench.inference import INFERENCE_BACKENDS
    from twinkle_fx.bench.micro import MICRO_CASES, MICRO_IMPLS
    from twinkle_fx.bench.workloads import WORKLOADS
    from twinkle_fx.builtin import BUILTIN_MODELS
    from twinkle_fx.cli import names
    from twinkle_fx.checklist.checklist import _DTYPE_NAMES

    assert names.MODEL_BACKENDS == tuple(BACKENDS)
    from twinkle_fx.bench.backends import _TWINKLE
    from twinkle_fx.core.registry import GRAPH_REWRITES

    assert names.TWINKLE_BACKENDS == tuple(_TWINKLE) and names.GRAPH_REWRITES == tuple(GRAPH_REWRITES)
    assert names.INFERENCE_BACKENDS == tuple(INFERENCE_BACKENDS)
    assert names.MICRO_IMPLS == tuple(MICRO_IMPLS)
    assert names.MICRO_OPS == tuple(dict.fromkeys(case.op for case in MICRO_CASES))
    assert names.MICRO_CASE_NAMES == tuple(case.name for case in MICRO_CASES if case.name)
    assert names.WORKLOADS == tuple(WORKLOADS)
    assert names.BUILTIN_FAMILIES == tuple(BUILTIN_MODELS)
    assert names.DTYPES == tuple(_DTYPE_NAMES)
    from twinkle_fx.bench import matrix

    assert (names.MATRIX_MODELS, names.MATRIX_BACKENDS, names.TINY_MATRIX_BACKENDS) == (
        matrix.MATRIX_MODELS, matrix.MATRIX_BACKENDS, matrix.TINY_MATRIX_BACKENDS)
    assert set(names.MATRIX_MODELS) <= set(WORKLOADS) and set(names.MATRIX_BACKENDS) <= set(BACKENDS)


def test_the_device_types_checked_before_import_are_torchs():
    from twinkle_fx.cli.common import DEVICE_TYPES

    for name in DEVICE_TYPES:
        assert torch.device(name).type == name


def test_the_model_types_read_from_the_source_are_transformers_mapping():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from twinkle_fx.cli.explain import causal_lm_model_types

    assert causal_lm_model_types() == list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def test_a_cpu_run_after_triton_was_imported_says_to_set_the_variable(monkeypatch, capsys):
    import types

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setitem(sys.modules, "triton", sys.modules.get("triton") or types.ModuleType("triton"))
    error = _fails(["check", "--tiny", "--no-builtin", "--device", "cpu"], capsys)
    assert "triton was imported before TRITON_INTERPRET=1 was set, so twinkle-fx check cannot run" in error
    assert "set TRITON_INTERPRET=1 before importing torch" in error
