"""``twinkle-fx bench --model <family>``: every family of the built-in mapping is a workload (real size
on a GPU, ``--tiny`` on the CPU), and the CLI lists them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from twinkle_fx.bench.workloads import WORKLOADS, _transformers_class, get_workload
from twinkle_fx.builtin import BUILTIN_MODELS

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "kernels"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "twinkle_fx", "bench", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def test_every_family_is_a_workload_and_the_cli_lists_it():
    assert set(BUILTIN_MODELS) <= set(WORKLOADS)
    help_text = " ".join(_cli("--help").stdout.split())  # argparse wraps the line anywhere
    for family in BUILTIN_MODELS:
        assert f" {family}," in help_text or f" {family} (" in help_text, family
        workload = get_workload(family)
        assert workload.family == family  # the family use_builtin_kernels binds
        config_class = _transformers_class(workload, workload.config_class)
        for tiny in (False, True):  # both configs are valid for transformers (ids inside the vocabulary)
            config = config_class(**workload.config_kwargs(tiny=tiny))
            assert config.model_type == BUILTIN_MODELS[family].model_type
            for name in ("pad_token_id", "bos_token_id"):
                assert getattr(config, name, None) is None or getattr(config, name) < config.vocab_size or not tiny


@pytest.mark.slow
@pytest.mark.interpreter  # --tiny is the CPU through the Triton interpreter by definition
@pytest.mark.parametrize(("family", "swapped"), [
    ("gemma", {"GemmaRMSNorm -> GemmaRMSNorm", "GemmaMLP -> GeGLUMLP", "GemmaForCausalLM -> CausalLMFusedLoss"}),
    ("mixtral", {"MixtralRMSNorm -> RMSNorm", "MixtralExperts -> SwiGLUExperts",
                 "MixtralForCausalLM -> MoECausalLMFusedLoss"}),
])
def test_tiny_bench_runs_a_family(family, swapped, tmp_path):
    _cli("--model", family, "--tiny", "--backends", "eager,kernelize", "--warmup", "0", "--out", str(tmp_path))
    result = json.loads((tmp_path / f"bench-{family}.json").read_text())
    eager, kernelize = result["rows"]
    assert eager["status"] == kernelize["status"] == "ok", kernelize["error"]
    assert set(kernelize["notes"]["swapped_layers"]) == swapped
    assert kernelize["notes"]["patched_functions"] == [f"transformers.models.{family}.modeling_{family}."
                                                       "apply_rotary_pos_emb"]
    assert kernelize["first_loss"] == pytest.approx(eager["first_loss"], rel=1e-4)
