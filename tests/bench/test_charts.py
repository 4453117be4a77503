"""The PNG charts read at a glance: no overlapping labels, no empty panels, interpreter runs marked,
no copy roofline off the GPU, the legend off the bars; saved results say which code ran."""

from __future__ import annotations

import itertools

import pytest
import torch

from twinkle_fx.measure.environment import describe_environment
from twinkle_fx.bench.report import _plot_micro, _plot_model, _pyplot, annotate_micro_rows, annotate_model_rows
from twinkle_fx.bench.results import BenchResult, MicroRow, ModelRow

plt = _pyplot()
pytestmark = pytest.mark.skipif(plt is None, reason="matplotlib (bench extra) draws the charts")

BACKENDS = ["eager", "inductor", "twinkle", "kernelize+twinkle", "kernelize", "liger", "liger+inductor"]


def _environment(device_type: str, interpreter: bool) -> dict:
    return {"device": "NVIDIA H200 (140 GiB)" if device_type == "cuda" else "CPU (x86_64, 2 cores)",
            "device_type": device_type, "date": "2026-11-22 03:00 UTC", "versions": {"torch": "2.11.0"},
            "commit": "abc1234", "triton_interpret": interpreter}


def _model_result(device_type: str) -> BenchResult:
    cuda = device_type == "cuda"
    rows = [ModelRow(b, tokens_per_s=50_000.0 + 10_000 * i, ms_per_step=80.0 - i, first_step_s=2.0, first_loss=11.93,
                     peak_gib=13.0 - i if cuda else None) for i, b in enumerate(BACKENDS)]
    annotate_model_rows(rows, dtype=torch.bfloat16)
    workload = {"model": "qwen2", "shape_of": "Qwen2-0.5B", "batch": 4, "seq": 1024, "dtype": "bfloat16",
                "step": "forward + backward with labels", "steps": 20, "warmup": 3}
    return BenchResult("model", _environment(device_type, interpreter=not cuda), workload, rows)


def _micro_result(device_type: str) -> BenchResult:
    cuda = device_type == "cuda"
    rows = [MicroRow("copy", "-", "torch", "1 GiB", ms=1.0, gbps=4000.0 if cuda else 10.0)]
    for op, shape in (("silu_and_mul", "x 4096 x 2*14336"), ("rms_norm", "x 16384 x 4096, eps 1e-6"),
                      ("apply_rotary_pos_emb", "q 4 x 32 x 1024 x 128, k 4 x 8 x 1024 x 128 (transposed views)")):
        for phase, impl in itertools.product(("fwd", "fwd+bwd"), ("eager", "inductor", "twinkle", "liger")):
            gbps = {"eager": 1000.0, "inductor": 3800.0, "twinkle": 3900.0, "liger": 3700.0}[impl] / (1 if cuda else 250)
            rows.append(MicroRow(op, phase, impl, shape, ms=1.0 / gbps, gbps=gbps, copy_fraction=gbps / rows[0].gbps))
    for impl, ms, extra in (("eager", 12.5, 6.96), ("inductor", 6.6, 1.42), ("twinkle", 6.7, 0.55)):
        rows.append(MicroRow("fused_linear_cross_entropy", "fwd+bwd", impl, "4096 tokens x 896 -> 151936 vocab",
                             ms=ms, tflops=3.35 / ms, extra_gib=extra if cuda else None))
    annotate_micro_rows(rows)
    return BenchResult("micro", _environment(device_type, interpreter=not cuda), {"dtype": "bfloat16", "reps": 50,
                                                                                  "warmup": 5}, rows)


def _boxes(fig, artists):
    renderer = fig.canvas.get_renderer()
    return [a.get_window_extent(renderer) for a in artists if a.get_text()]


def _no_overlaps(boxes) -> None:
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), (a, b)


def _tick_labels_apart(fig, ax) -> None:
    """Adjacent x tick labels do not touch. Rotated labels are slanted strips: two of them stay apart
    when the distance between their baselines, tick spacing x sin(angle), exceeds a line's height."""
    import math

    labels = [label for label in ax.get_xticklabels() if label.get_text()]
    xs = sorted(ax.transData.transform((x, 0))[0] for x in ax.get_xticks()[:len(labels)])
    spacing = min((b - a for a, b in zip(xs, xs[1:])), default=math.inf)
    for label in labels:
        angle = math.radians(label.get_rotation())
        line = label.get_fontsize() * fig.dpi / 72 * 1.2 * (label.get_text().count("\n") + 1)
        if angle == 0:
            _no_overlaps(_boxes(fig, labels))
        else:
            # anchored at their right end they are parallel strips one tick apart (centred ones are not)
            assert (label.get_rotation_mode(), label.get_horizontalalignment()) == ("anchor", "right")
            assert spacing * math.sin(angle) >= line, (label.get_text(), spacing, line)


@pytest.mark.parametrize("device_type", ["cuda", "cpu"])
def test_model_chart(device_type):
    fig = _plot_model(plt, _model_result(device_type))
    fig.canvas.draw()
    axes = fig.get_axes()
    # the memory panel only where memory was measured (no empty panel on the CPU)
    assert [ax.get_title() for ax in axes] == (["training throughput", "peak memory"] if device_type == "cuda"
                                               else ["training throughput"])
    for ax in axes:
        _tick_labels_apart(fig, ax)
        title = ax.title.get_window_extent(fig.canvas.get_renderer())
        for label in _boxes(fig, ax.texts):  # value labels stay inside the axes, below the title
            assert label.y1 <= ax.get_window_extent().y1 < title.y0
    marked = "TRITON INTERPRETER" in fig._suptitle.get_text()
    assert marked == (device_type == "cpu")
    plt.close(fig)


@pytest.mark.parametrize("device_type", ["cuda", "cpu"])
def test_micro_chart(device_type):
    fig = _plot_micro(plt, _micro_result(device_type))
    fig.canvas.draw()
    bars_ax, *side = fig.get_axes()
    _tick_labels_apart(fig, bars_ax)
    heights = [p.get_height() for p in bars_ax.patches]
    if device_type == "cuda":
        assert "% of device-to-device copy" in bars_ax.get_ylabel()
    else:  # the CPU rows are 2.6x eager here, not "97% of a copy" (or 151%)
        assert "speed-up over eager" in bars_ax.get_ylabel() and max(heights) == pytest.approx(3.9)
    # the legend sits outside the bars' axes
    legend = bars_ax.get_legend().get_window_extent(fig.canvas.get_renderer())
    assert legend.x0 >= bars_ax.get_window_extent().x1
    # the shapes are on the chart
    assert any("q 4 x 32 x 1024 x 128" in t.get_text() for t in bars_ax.texts)
    # the FLCE memory panel only where memory was measured
    assert [ax.get_title().splitlines()[-1] for ax in side] == (
        ["fwd+bwd ms (lower is better)", "extra GiB (lower is better)"] if device_type == "cuda"
        else ["fwd+bwd ms (lower is better)"])
    plt.close(fig)


def test_saved_results_say_which_code_ran(monkeypatch):
    import subprocess

    import twinkle_fx
    from twinkle_fx.measure import environment

    monkeypatch.delenv("TWINKLE_FX_COMMIT", raising=False)  # the GPU scripts set it (tools/gpu.sh)
    env = describe_environment(torch.device("cpu"))
    assert env["versions"]["twinkle_fx"] == twinkle_fx.__version__
    assert len(env["source_sha256"]) == 12
    if (environment._ROOT / ".git").exists():  # a checkout (CI): the commit, and whether the tree differs
        head = subprocess.run(["git", "-C", str(environment._ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        assert env["commit"] == head and isinstance(env["commit_dirty"], bool)
    # a tree copied without .git (a GPU machine): the commit comes from $TWINKLE_FX_COMMIT
    monkeypatch.setattr(environment, "_git", lambda *args: None)
    monkeypatch.setenv("TWINKLE_FX_COMMIT", "0123abc")
    source = environment.describe_source()
    assert source["commit"] == "0123abc" and source["commit_dirty"] is None
    assert source["source_sha256"] == env["source_sha256"]
    # a copy whose .git is stale (the lent GPU machine's): the caller's $TWINKLE_FX_COMMIT wins over git
    monkeypatch.setattr(environment, "_git", lambda *args: "6edc102")
    assert environment.describe_source()["commit"] == "0123abc"
