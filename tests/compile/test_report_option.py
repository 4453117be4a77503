"""``options={"report": True}`` logs each graph's report through ``logging``: the short summary (what was
swapped or kept, and why) at INFO, the FX code diff at DEBUG; nothing is printed. Where logging would
show no INFO, one WARNING says how to see the report."""

import logging

import torch
from compile_kernels import GatedMLP, SiluAndMul, SiluAndMulKernel

from twinkle_fx import register_external_layer, register_layer_kernel
from twinkle_fx.compiler import backend

LOGGER = "twinkle_fx.compiler.backend"


def _compile_with_report():
    register_layer_kernel(kernel_name="SiluAndMul", layer=SiluAndMulKernel, device="cpu")
    register_external_layer(SiluAndMul, "SiluAndMul")
    with torch.no_grad():
        torch.compile(GatedMLP(), backend="twinkle", options={"compiler": "eager", "report": True})(torch.randn(2, 8))


def _report_records(caplog, level):
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level
            and r.getMessage().startswith("twinkle_fx report")]


def test_the_report_is_a_short_summary_logged_at_info(caplog, capfd):
    caplog.set_level(logging.INFO, logger="twinkle_fx")
    _compile_with_report()
    (summary,) = _report_records(caplog, logging.INFO)
    assert "swapped 1 x layer SiluAndMul" in summary and "layer_regions" not in summary  # the passes' total only
    assert len(summary.splitlines()) <= 3, summary  # the graph's line, one per swapped or kept group
    assert "@@" not in summary and "twinkle_test.silu_and_mul" not in summary  # no FX code at INFO
    assert _report_records(caplog, logging.DEBUG) == []
    assert capfd.readouterr() == ("", "")  # logged, not printed
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_fx_code_diff_is_logged_at_debug(caplog):
    caplog.set_level(logging.DEBUG, logger="twinkle_fx")
    _compile_with_report()
    (diff,) = _report_records(caplog, logging.DEBUG)
    assert "graph 0 before" in diff and "graph 0 after" in diff
    assert any(line.startswith("+") and "layer_SiluAndMul" in line for line in diff.splitlines()), diff


def test_without_info_shown_one_warning_says_how_to_see_the_report(caplog, monkeypatch):
    monkeypatch.setattr(backend, "_REPORT_UNSEEN_WARNED", False)
    caplog.set_level(logging.WARNING, logger="twinkle_fx")
    _compile_with_report()
    torch._dynamo.reset()
    _compile_with_report()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "logging.basicConfig(level=logging.INFO)" in warnings[0], warnings
    assert _report_records(caplog, logging.INFO) == []
