"""``check_kernels`` and ``benchmark_kernel``: the checklist on kernels from every source (local repo,
Hub, the user's own), a wrong kernel caught (exit status 1), and the timing result.

The checks run on the suite's device with ``tiny`` sizes (on the CPU through the Triton interpreter;
on a GPU ``twinkle-fx check --tiny --device cuda`` keeps the small sizes without the interpreter)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from twinkle_fx import (KernelTiming, benchmark_kernel, check_kernels, register_external_layer,
                        register_function_kernel, register_layer_kernel)
from twinkle_fx.checklist import CheckInputs


def test_every_source_is_checked_against_its_original(offline_hub, local_repo, device):
    from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP

    from my_pkg.fast_ops import fast_add
    from my_pkg.layers import SiluAndMul

    register_layer_kernel(kernel_name="MyAwesomeMLP", repo_path=local_repo, package_name="my_kernels",
                          layer_name="Qwen2MLPTrainingKernel", device=device, mode="train")
    register_external_layer(Qwen2MLP, "MyAwesomeMLP")
    register_layer_kernel(kernel_name="SiluAndMul", repo_id="kernels-community/activation", device=device)
    register_external_layer(SiluAndMul, "SiluAndMul")
    register_function_kernel(func_name="add", target_module="my_pkg.math_ops", func_impl=fast_add, device=device)
    register_layer_kernel(kernel_name="linear", repo_id="kernels-community/linear", device=device)  # bound to nothing

    report = check_kernels(device=device, tiny=True, dtypes=["fp32"])
    checks = {c.target: c for c in report.checks}
    assert set(checks) == {"Qwen2MLP", "SiluAndMul", "my_pkg.math_ops.add", "-"}
    assert not report.failed
    mlp, act, add = checks["Qwen2MLP"], checks["SiluAndMul"], checks["my_pkg.math_ops.add"]
    assert mlp.source.startswith("local repo") and act.source.startswith("hub kernels-community/activation")
    for check in (mlp, act, add):
        assert check.verdicts["correctness"] == "PASS", check.notes
        assert check.verdicts["fallback"] == "PASS"
        # under the interpreter times are not speed; on a GPU the verdict is the timing's (PASS or WARN)
        assert check.verdicts["speed-up"] in (("N/A",) if device == "cpu" else ("PASS", "WARN"))
        assert len(check.correctness) == 3 and all(c.forward_error <= 1 for c in check.correctness)
    # training kernels are checked backward too; fast_add has no backward: forward only
    assert all(c.backward_error is not None for c in mlp.correctness + act.correctness)
    assert (add.mode, [c.backward_error for c in add.correctness]) == ("inference", [None] * 3)
    assert checks["-"].kernel == "linear" and "no class is bound" in checks["-"].notes["correctness"]
    assert "MyAwesomeMLP" in str(report) and report.to_json()["checks"][0]["speed"][0]["speedup"] > 0


def _wrong_silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """A kernel with a bug: drops the SiLU on part of the row."""
    out = torch.nn.functional.silu(gate) * up
    out[..., :3] = gate[..., :3] * up[..., :3]
    return out


def _silu_mul(gate, up):
    return torch.nn.functional.silu(gate) * up


def test_a_wrong_kernel_fails_correctness_and_the_cli_exits_1(tmp_path, monkeypatch, device):
    import sys
    import types

    module = types.ModuleType("user_ops_for_check")
    module.silu_mul = _silu_mul
    monkeypatch.setitem(sys.modules, "user_ops_for_check", module)
    register_function_kernel(func_name="silu_mul", target_module="user_ops_for_check", func_impl=_wrong_silu_mul,
                             device=device)
    report = check_kernels(device=device, tiny=True, dtypes=["fp32"])
    (check,) = report.checks
    assert report.failed and check.verdicts["correctness"] == "FAIL"
    assert check.verdicts["documented"] == "PASS"
    assert "FAILED float32" in check.notes["correctness"]

    setup = tmp_path / "setup_wrong.py"
    setup.write_text("import sys, types, torch\n"
                     "from twinkle_fx import register_function_kernel\n"
                     "m = types.ModuleType('user_ops_cli'); m.scale = lambda x: x * 2; sys.modules['user_ops_cli'] = m\n"
                     "register_function_kernel(func_name='scale', target_module='user_ops_cli', "
                     f"func_impl=lambda x: x * 2.001, device={device!r})\n")
    from twinkle_fx.__main__ import main

    threads = torch.get_num_threads()
    try:
        status = main(["check", "--tiny", "--device", device, "--no-builtin", "--dtypes", "fp32",
                       "--setup", str(setup), "--out", str(tmp_path / "out.json")])
    finally:
        torch.set_num_threads(threads)
    assert status == 1
    assert '"correctness": "FAIL"' in (tmp_path / "out.json").read_text()


def test_inputs_for_a_layer_the_check_cannot_build(device):
    class Scale(torch.nn.Module):
        def __init__(self, width):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(width))

        def forward(self, x):
            return x * self.weight

    class ScaleKernel(torch.nn.Module):
        """x * weight."""

        def forward(self, x):
            return torch.mul(x, self.weight)

    register_layer_kernel(kernel_name="Scale", layer=ScaleKernel, device=device)
    register_external_layer(Scale, "Scale")
    (unchecked,) = check_kernels(device=device, tiny=True, dtypes=["fp32"]).checks
    assert unchecked.verdicts["correctness"] == "SKIP" and "pass inputs=" in unchecked.notes["correctness"]

    def make(rows, dtype, device):
        return CheckInputs((torch.randn(rows, 5, dtype=dtype, device=device),), module=Scale(5).to(device, dtype))

    (check,) = check_kernels(device=device, tiny=True, dtypes=["fp32", "bf16"], inputs={Scale: make}).checks
    assert check.verdicts["correctness"] == "PASS" and len(check.correctness) == 6


def test_benchmark_kernel_result():
    x = torch.randn(1000)
    result = benchmark_kernel(torch.mul, x, x, warmup=1, iters=5, bytes=3 * 4000, flops=1000)
    assert isinstance(result, KernelTiming) and result.iters == 5 and result.timer == "perf_counter"
    assert result.min_ms <= result.median_ms <= result.max_ms
    assert result.gbps == pytest.approx(12000 / (result.median_ms * 1e-3) / 1e9)
    assert result.tflops == pytest.approx(1000 / (result.median_ms * 1e-3) / 1e12)
    other = benchmark_kernel(lambda a, b: a * b, x, b=x, warmup=0, iters=3)  # keyword arguments reach fn
    assert other / result == pytest.approx(other.median_ms / result.median_ms) and float(result) == result.median_ms
    assert "mul: median" in str(result) and "GB/s" in str(result) and "perf_counter on cpu" in str(result)
    with pytest.raises(ValueError, match="iters must be at least 1"):
        benchmark_kernel(torch.mul, x, x, iters=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.median_ms = math.pi
