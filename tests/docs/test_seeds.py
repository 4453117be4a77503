"""Every code block of the four user documents (docs/seeds/) runs as written.

Each block lives in a script under examples/docs/ (one block each; hf-kernels-layers.md's ten
blocks build on each other and share one script). The first test checks that every block of the
documents appears in its script as written, up to the substitutions below and indentation; the
others run the scripts in this process (the registry is scoped per test by conftest, patched
functions are restored), the Hub served by the session's offline cache.
"""

from __future__ import annotations

import json
import re
import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SEEDS = ROOT / "docs" / "seeds"
SCRIPTS = ROOT / "examples" / "docs"
sys.path.insert(0, str(SCRIPTS))  # the scripts import _setup and quickstart_4_triton_kernel

# The only changes between a document's block and its script, in order.
SUBSTITUTIONS = (
    ("from twinkle.kernel.function import", "from twinkle_fx.function import"),
    ("from twinkle.kernel import", "from twinkle_fx import"),
    ('"/path/to/local/repo"', "LOCAL_REPO"),                    # examples/local_repo
    ('device="cuda"', "device=DEVICE"),                          # the machine's device
    ('"device": "cuda"', '"device": DEVICE'),
    ("device='cuda'", "device=DEVICE"),
    ('device="cpu"', "device=DEVICE"),                           # user-scenarios.md scenario 3 names the CPU
    ('"cuda": LayerRepository(', "DEVICE: LayerRepository("),
    ("from nanovllm.kernels import benchmark_kernel", "from twinkle_fx import benchmark_kernel"),
    ("nanovllm.layers.custom_mlp", "custom_mlp"),              # examples/custom_mlp.py
    ("nanovllm.kernels", "twinkle_triton"),
    ("from somelibrary import", "from my_pkg.layers import"),   # the document's placeholder library
)

# document -> the script of each of its python blocks, in document order
SCRIPT_OF_BLOCK = {
    "twinkle-kernel-module.md": [f"kernel_module_{n}" for n in (
        "1_local_repo", "2_hub", "3_minimal_repo", "4_batch_functions", "5_function_sources", "6_unified")],
    "user-scenarios.md": [f"user_scenarios_{n}" for n in range(1, 5)],
    "hf-kernels-layers.md": ["hf_kernels_layers"] * 10,
    "custom-kernel-quickstart.md": [f"quickstart_{n}" for n in (
        "1_kernels", "2_custom_layer", "3_qwen3_layer", "4_triton_kernel", "5_benchmark", "6_profiler", "7_fusion",
        "8_debugging", "9_fallback")],
}


def _python_blocks(document: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", document.read_text(), flags=re.S | re.M)


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _contains(haystack: list[str], needle: list[str]) -> bool:
    return any(haystack[i:i + len(needle)] == needle for i in range(len(haystack) - len(needle) + 1))


@pytest.mark.parametrize("document", sorted(SCRIPT_OF_BLOCK))
def test_every_block_is_in_its_script_as_written(document):
    blocks = _python_blocks(SEEDS / document)
    assert len(blocks) == len(SCRIPT_OF_BLOCK[document]), f"{document}: {len(blocks)} python blocks"
    for index, (block, script) in enumerate(zip(blocks, SCRIPT_OF_BLOCK[document]), 1):
        for old, new in SUBSTITUTIONS:
            block = block.replace(old, new)
        text = (SCRIPTS / f"{script}.py").read_text()
        assert _contains(_lines(text), _lines(block)), f"{document} block {index} is not as written in {script}.py"


def _run(script: str, capsys, monkeypatch, tmp_path) -> str:
    import _setup
    from device_under_test import DEVICE

    # the scripts pick their device as the suite does (examples/_common.py); a module first imported
    # while something had switched the interpreter on in-process would have picked the CPU for good
    assert _setup.DEVICE == DEVICE, f"the scripts run on {_setup.DEVICE}, the suite on {DEVICE}"
    monkeypatch.chdir(tmp_path)  # scripts that write files (trace.json) write them here
    runpy.run_path(str(SCRIPTS / f"{script}.py"), run_name="__main__")
    return capsys.readouterr().out


@pytest.fixture
def run(offline_hub, capsys, monkeypatch, tmp_path):
    return lambda script: _run(script, capsys, monkeypatch, tmp_path)


# -- twinkle-kernel-module.md -------------------------------------------------------------------------


def test_module_local_repo(run):
    out = run("kernel_module_1_local_repo")
    assert "mlp forward: <twinkle_fx kernel forward MyAwesomeMLP of Qwen2MLP>" in out
    assert "train step through the local repo kernel: loss" in out


def test_module_hub(run):
    out = run("kernel_module_2_hub")
    assert "activation forward: <twinkle_fx kernel forward SiluAndMulKernel of SiluAndMul>" in out
    assert "SimpleModel matches the original: True" in out


def test_module_minimal_repo_as_documented(run):
    out = run("kernel_module_3_minimal_repo")
    assert "repo layout: ['my_kernels/__init__.py', 'my_kernels/layers.py']" in out
    assert "mlp forward: <twinkle_fx kernel forward MyAwesomeMLP of Qwen2MLP>" in out
    assert "logits equal the original: True" in out


def test_module_batch_functions(run):
    assert "my_pkg.math_ops.add(1, 1) is now: [3.0, 3.0, 3.0]" in run("kernel_module_4_batch_functions")


def test_module_function_sources(run):
    out = run("kernel_module_5_function_sources")
    assert "patched: ['my_pkg.math_ops.add', 'my_pkg.math_ops.mul']" in out
    assert "math_ops.add is fast_add: True" in out and "math_ops.mul is MyKernelFunc: True" in out
    assert "activations.silu_and_mul from the Hub matches: True" in out


def test_module_unified(run, caplog):
    out = run("kernel_module_6_unified")
    # mode="train": the inference-only add is kept; the Hub repo has no relu: kept, with the reason
    assert "model[0] swapped: False" in out
    assert "my_pkg.math_ops.add patched: False" in out and "my_pkg.activations.relu patched: False" in out
    assert re.search(r"kept 2: .*my_pkg\.activations\.relu \(.*no function named 'relu'", caplog.text)


# -- user-scenarios.md --------------------------------------------------------------------------------


def test_scenario_1_layers(run):
    out = run("user_scenarios_1")
    assert "swapped by the block: False" in out
    assert "after register_external_layer(nn.Linear, 'linear'): <twinkle_fx kernel forward linear of Linear>" in out
    assert "outputs match: True" in out


def test_scenario_1_says_no_class_is_bound_to_linear(run, caplog):
    """kernelize_model warns once about a registered layer kernel that no class is bound to, naming the fix."""
    run("user_scenarios_1")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("linear" in w and re.search(r"register_external_layer\((torch\.)?nn\.Linear, ['\"]linear['\"]\)", w)
               for w in warnings), warnings


def test_scenario_2_functions(run):
    assert "my_pkg.math_ops.add(1, 1) is now: [3.0, 3.0]" in run("user_scenarios_2")


def test_scenario_3_function_sources(run):
    out = run("user_scenarios_3")
    assert "patched: ['my_pkg.math_ops.add', 'my_pkg.math_ops.mul']" in out
    assert "add(1, 1): [3.0, 3.0, 3.0] mul(1, 1): [4.0, 4.0, 4.0]" in out  # the repo's MyKernelFunc: x + y + 2
    assert "silu_and_mul from the Hub matches: True" in out


def test_scenario_4_one_config(run):
    out = run("user_scenarios_4")
    assert "model[0] swapped: False" in out and "my_pkg.math_ops.add patched: True" in out


# -- hf-kernels-layers.md -----------------------------------------------------------------------------

def test_hf_kernels_layers_blocks(run):
    out = run("hf_kernels_layers")
    assert "kernelize(model) before any mapping is registered: swapped nothing" in out
    # the bound library layer gets the Hub kernel (revision "layers") inside the with block only
    assert "with use_kernel_mapping(...): kernelize(model): swapped ['external']" in out
    assert "outputs match the original model: True" in out
    assert "outside the with block, kernelize(MyModel(...)): swapped nothing" in out
    for flags in ("device=...", "needs_backward=False", "needs_torch_compile=True"):
        assert re.search(rf"kernelize\(model, {re.escape(flags)}\): swapped \['external'\]", out), (flags, out)


def test_hf_kernels_layers_block_7_refuses_the_layer_whose_parameter_names_differ(run):
    """Block 1's layer names its forward argument `input`, the Hub layer `x`: twinkle_fx refuses differing
    parameter names (selection.signature_mismatch), where Hugging Face kernels compares only their number and
    kinds; with use_fallback=False the refusal is the error the script prints."""
    out = run("hf_kernels_layers")
    assert re.search(r"use_fallback=False\) refused: .*forward signature \(x\) differs from the layer's \(input\)",
                     out), out


# -- custom-kernel-quickstart.md ----------------------------------------------------------------------


def test_quickstart_kernels(run):
    out = run("quickstart_1_kernels")
    assert "fused_add_gelu == gelu(x + bias): True" in out and "element_wise_mul_add == a * b + c: True" in out


def test_quickstart_aliases_are_the_ops():
    import twinkle_triton

    assert twinkle_triton.fused_add_gelu is twinkle_triton.add_gelu
    assert twinkle_triton.element_wise_mul_add is twinkle_triton.mul_add
    assert {"fused_add_gelu", "element_wise_mul_add"} <= set(twinkle_triton.__all__)


def test_quickstart_custom_layer(run):
    assert "forward and backward: True" in run("quickstart_2_custom_layer")


def test_quickstart_qwen3_gated_mlp(run):
    out = run("quickstart_3_qwen3_layer")
    assert "the block's layer: Qwen3Attention + CustomGatedMLP(" in out and "use_custom_kernels=True" in out
    assert "logits match: True" in out


def test_quickstart_custom_mlp_module_self_test(capsys):
    """Quick start step 2, `python -m <framework>.layers.custom_mlp`: `python examples/custom_mlp.py`."""
    runpy.run_path(str(ROOT / "examples" / "custom_mlp.py"), run_name="__main__")
    assert "-> ok" in capsys.readouterr().out


def test_quickstart_triton_kernel(run):
    assert "my_custom_op(x) == 2 * x: True" in run("quickstart_4_triton_kernel")


def test_quickstart_benchmark(run):
    out = run("quickstart_5_benchmark")
    assert re.search(r"^speed-up: \d+\.\d\dx$", out, flags=re.M), out
    assert re.search(r"my_custom_op: median [\d.]+ ms \(min [\d.]+, max [\d.]+\) over 100 calls after 20 warm-up", out)


def test_quickstart_profiler_writes_a_chrome_trace(run, tmp_path):
    out = run("quickstart_6_profiler")
    assert "Self CPU time total" in out
    assert "traceEvents" in json.loads((tmp_path / "trace.json").read_text())


def test_quickstart_fusion(run):
    out = run("quickstart_7_fusion")
    assert "the two halves compose as written: True" in out and "one pass == two passes: True" in out


def test_quickstart_debugging(run):
    out = run("quickstart_8_debugging")
    assert "Max diff: 0.0" in out
    assert re.search(r"Peak memory: \d+\.\d\d MB", out) or "torch.cuda statistics need a GPU" in out


def test_quickstart_fallback(run):
    assert "result == 2 * x: True" in run("quickstart_9_fallback")


def test_documented_semver_version_says_what_to_pass(offline_hub):
    """The documents pin kernels-community/linear at version="0.1.0"; kernels 0.17 pins whole versions."""
    import torch.nn as nn

    from twinkle_fx import KernelSelectionError, kernelize_model, register_external_layer, register_layer_kernel

    register_layer_kernel(kernel_name="linear", repo_id="kernels-community/linear", layer_name="Linear",
                          version="0.1.0", device="cpu", mode="inference")
    register_external_layer(nn.Linear, "linear")
    with pytest.raises(KernelSelectionError, match=r"version='0.1.0' is not a whole number.*revision='0.1.0'"):
        kernelize_model(nn.Linear(4, 4), mode="inference", device="cpu", use_fallback=False)


def test_kernels_api_refuses_bad_mappings():
    from twinkle_fx.integrations.kernels_api import LayerRepository, register_kernel_mapping

    with pytest.raises(ValueError, match="revision or version, not both"):
        LayerRepository(repo_id="org/name", layer_name="X", revision="main", version=1)
    with pytest.raises(TypeError, match="'SiluAndMul' / 'cpu': expected a LayerRepository, got str"):
        register_kernel_mapping({"SiluAndMul": {"cpu": {"repo_id": "org/name"}}})
