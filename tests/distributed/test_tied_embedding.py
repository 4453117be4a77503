"""twinkle_fx.distributed.tied_embedding_ddp on 2 CPU processes (gloo): the gradients of plain DDP.

One torchrun launch (tied_runs.py) runs every case; the ranks see different token counts, so the
embedding rows they exchange differ in number.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dist_launch import torchrun

HERE = Path(__file__).resolve().parent
GRADIENTS = ["sync", "accumulation", "preset_grads_accumulation", "two_forwards", "padding_not_hf", "compiled_root"]

pytestmark = pytest.mark.slow  # every test reads the runs torchrun makes once for the module


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    return torchrun(HERE / "tied_runs.py", tmp_path_factory.mktemp("tied") / "runs.json", timeout=180)


@pytest.mark.parametrize("case", GRADIENTS)
def test_gradients_equal_plain_ddp(runs, case):
    """Every parameter's gradient (the tied weight's included) is DDP's, to fp32 rounding; both ranks
    hold the same tied gradient, and it is not zero (the comparison would pass vacuously)."""
    result = runs[case]
    assert result["max_diff"] < 1e-6 and result["tied_diff"] < 1e-6, result
    assert result["ranks_differ"] == 0.0 and result["grad_norm"] > 0.1, result


@pytest.mark.parametrize("case", GRADIENTS)
def test_head_gradient_reduced_during_backward(runs, case):
    """One early all-reduce per head backward of the synchronising step (two forwards: two), one
    exchange at its end, however many no_sync micro-steps came before."""
    stats = runs[case]["stats"]
    assert stats["early_reductions"] == (2 if case == "two_forwards" else 1), stats
    assert stats["finalized"] == 1, stats
    # rows of every lookup of the window on both ranks: 2 x 7 + 1 x 5 tokens per forward
    lookups = {"accumulation": 3, "preset_grads_accumulation": 2, "two_forwards": 2, "padding_not_hf": 2,
               "compiled_root": 2}.get(case, 1)
    assert stats["rows_exchanged"] == 19 * lookups, stats


def test_whole_model_compile_does_not_recompile(runs):
    assert runs["compiled_root"]["recompiles"] == 0, runs["compiled_root"]


def test_gradient_from_outside_the_forward_is_refused(runs):
    """The embedding called by the user (inputs_embeds) would give the weight a gradient no rank
    reduces: the backward stops and says so."""
    error = runs["stray"]["error"]
    assert error is not None and "received a gradient from a use outside Qwen2ForCausalLM.forward" in error


def test_untied_model_gets_plain_ddp(runs):
    assert runs["untied"] == {"plain_ddp": True, "has_reduction": False}


def test_unsupported_embedding_is_refused_without_a_trace(runs):
    assert "sets max_norm" in runs["refused"]["error"] and runs["refused"]["ignored"] is None, runs["refused"]


def test_no_grad_forward_leaves_the_weight_alone(runs):
    assert runs["no_grad_eval"] == {"finite": True, "weights_restored": True}


def test_remove_hands_the_weight_back_to_ddp(runs):
    assert runs["removed"] == {"ignored": None, "local_grad": True, "plain_ddp_covers_it": True}
