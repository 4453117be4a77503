"""Every example runs as written, as a script (`python examples/<name>.py`, no TRITON_INTERPRET preset: the scripts
switch the interpreter on themselves without a GPU), with the Hub served by an offline cache; examples/README.md
lists every script."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from device_under_test import DEVICE

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(script: str, hf_home: Path) -> str:
    env = dict(os.environ, HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    # as a user runs them: examples/_common.py switches the interpreter on where there is no GPU
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, str(EXAMPLES / script)], env=env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "MISMATCH" not in output
    return output


@pytest.mark.slow
def test_eager_layers_example(offline_hub):
    output = _run("eager_layers.py", offline_hub)
    assert "swapped 2 Qwen2MLP module(s) -> MyAwesomeMLP" in output  # INFO: one line per class
    assert "swapped 1 SiluAndMul module(s) -> SiluAndMulKernel" in output and "hub kernels-community/activation" in output
    assert "after undo, bit-identical to the original: True" in output


@pytest.mark.slow
def test_function_kernels_example(offline_hub):
    output = _run("function_kernels.py", offline_hub)
    assert "patched: ['my_pkg.math_ops.add', 'my_pkg.math_ops.mul']" in output
    assert "patched my_pkg.activations.silu_and_mul -> hub kernels-community/activation (revision main)" in output
    assert "silu_and_mul matches: True" in output
    assert "restored: my_pkg.math_ops my_pkg.activations" in output


@pytest.mark.slow
def test_register_config_example(offline_hub):
    output = _run("register_config.py", offline_hub)
    assert "Qwen2RMSNorm module(s) -> RMSNorm" in output
    assert "Qwen2MLP module(s) -> MyAwesomeMLP" in output  # a training kernel serves inference
    assert "logits: max abs error" in output


@pytest.mark.parametrize("script", ["make_offline_hub_cache.py"])
def test_cache_builder_example(tmp_path, script):
    done = subprocess.run([sys.executable, str(EXAMPLES / script), str(tmp_path / "hf")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for repo in ("kernels--kernels-community--activation", "kernels--kernels-community--linear"):
        assert (tmp_path / "hf" / "hub" / repo / "refs" / "main").is_file()
    assert (tmp_path / "hf" / "hub" / "kernels--kernels-community--activation" / "refs" / "layers").is_file()


def _losses(output: str) -> list[str]:
    """The demo's lines of losses, without the seconds they took."""
    return [line.split("max diff")[0] for line in output.splitlines() if ": losses " in line]


@pytest.mark.slow
def test_demo(offline_hub):
    output = _run("demo.py", offline_hub)
    # its own family only: 5 norms, 2 MLPs and the fused-loss head; one function, the rotary
    assert "kernelize_model swapped 8 layers and patched 1 function\n" in output
    # twinkle_fx.compile installed the head: nothing is reported kept about the demo's own setup (on CUDA the
    # measured policy keeps the norms and MLPs where Inductor's code was measured faster, and says so)
    assert "<compiled module>" not in output and "the module being compiled" not in output
    if DEVICE == "cpu":
        assert "12 region(s) swapped, 0 kept" in output  # and 3 residual adds joined to their norms
    assert "losses match" in output
    losses = _losses(output)
    assert len(losses) == 3, output
    assert _losses(_run("demo.py", offline_hub)) == losses  # seeded: the same numbers every run


SCRIPTS = sorted(p for p in EXAMPLES.rglob("*.py") if not p.name.startswith("_") and "local_repo" not in p.parts
                 and "my_pkg" not in p.parts and "hub_repos" not in p.parts)


def test_examples_index_lists_every_script():
    index = (EXAMPLES / "README.md").read_text()
    assert SCRIPTS and [str(p.relative_to(EXAMPLES)) for p in SCRIPTS if f"`{p.relative_to(EXAMPLES)}`" not in index] == []


@pytest.mark.parametrize("script", SCRIPTS, ids=[str(p.relative_to(EXAMPLES)) for p in SCRIPTS])
def test_scripts_set_up_the_device_before_transformers_imports_triton(script):
    """The interpreter must be on before triton is first imported (transformers imports it with `kernels`):
    a script imports its setup module (examples/_common.py or examples/docs/_setup.py) before transformers."""
    lines = script.read_text().splitlines()
    setup = next((i for i, line in enumerate(lines) if line.startswith(("from _common import", "from _setup import",
                                                                          "import _common", "import _setup"))), None)
    first_transformers = next((i for i, line in enumerate(lines) if line.startswith(("from transformers",
                                                                                       "import transformers"))), None)
    if setup is not None and first_transformers is not None:
        assert setup < first_transformers, f"{script.name}: transformers imported (line {first_transformers + 1}) " \
                                           f"before the setup module (line {setup + 1})"


@pytest.mark.slow
def test_qwen3_quickstart_runs_as_a_script(offline_hub):
    assert "logits match: True" in _run("docs/quickstart_3_qwen3_layer.py", offline_hub)
