"""``tools/family_reference.py``, the GPU machine's reference-size check of every family, run on its
``--tiny`` configs through the Triton interpreter: the table and JSON it writes, and that a family
that fails or runs past its timeout gets FAIL rows while the others go on."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "family_reference.py"


def _tool():
    spec = importlib.util.spec_from_file_location("family_reference", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.interpreter  # --tiny is the CPU through the Triton interpreter by definition
def test_tiny_run_compares_both_paths_and_writes_every_row(tmp_path, capsys):
    out = tmp_path / "families.json"
    assert _tool().main(["--tiny", "--families", "starcoder2", "--dtypes", "fp32", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["environment"]["tiny"] and result["environment"]["layers"] == 2
    kernelize, compiled = result["rows"]
    for row in (kernelize, compiled):
        assert row["status"] == "PASS", row["failed"]
        assert row["loss_rel_err"] <= 1e-5 and row["worst_grad_rel_err"] <= 1e-3 and row["logits_rel_err"] <= 1e-3
    # both paths swap StarCoder2's five LayerNorms (within its own classes), its MLPs and its rotary;
    # the fused-loss head is the compiled root's class, which a graph rewrite cannot swap (kept, reported);
    # compiled, the causal mask transformers materialises becomes is_causal=True in both layers
    assert kernelize["swaps"] == {"LayerNorm->TorchLayerNorm": 5, "Starcoder2MLP->BiasGeluMLP": 2,
                                  "Starcoder2ForCausalLM->CausalLMFusedLoss": 1, "apply_rotary_pos_emb": 1}
    assert kernelize["missing"] == []
    assert compiled["swaps"] == {"LayerNorm->TorchLayerNorm": 5, "Starcoder2MLP->BiasGeluMLP": 2,
                                 "apply_rotary_pos_emb": 2,
                                 "scaled_dot_product_attention with a constant causal mask": 2}
    assert compiled["missing"] == ["Starcoder2ForCausalLM->CausalLMFusedLoss"] and compiled["graphs"] == 1
    table = capsys.readouterr().out
    assert "starcoder2   fp32  kernelize PASS" in table and "# starcoder2:" in table and "2/2 rows pass" in table


@pytest.mark.interpreter
def test_a_failing_family_gets_fail_rows_and_the_table_goes_on(tmp_path):
    out = tmp_path / "families.json"
    tool = _tool()
    # a timeout far below one step: every family fails, each with its own rows, and the run ends
    assert tool.main(["--tiny", "--families", "llama,gemma", "--dtypes", "fp32", "--timeout", "0.01",
                      "--out", str(out)]) == 1
    rows = json.loads(out.read_text())["rows"]
    assert [(r["family"], r["path"], r["status"]) for r in rows] == [
        ("llama", "kernelize", "ERROR"), ("llama", "compile", "ERROR"),
        ("gemma", "kernelize", "ERROR"), ("gemma", "compile", "ERROR")]
    assert all("ran past --timeout 0.01 s" in r["error"] for r in rows)
    with pytest.raises(SystemExit, match="unknown family 'gpt2'"):
        tool.main(["--tiny", "--families", "gpt2"])
