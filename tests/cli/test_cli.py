"""``twinkle-fx``: --version, and every bad argument is one line on stderr (no traceback), with the
subcommand's usage for unknown options; a full-size CPU bench is refused without --force."""

from __future__ import annotations

import json

import pytest
import torch

import twinkle_fx
from twinkle_fx.cli import main
from twinkle_fx.cli.common import StepProgress
from twinkle_fx.bench.timing import time_training_steps
from twinkle_fx.measure.clock import DeviceClock


def _fails(argv: list[str], capsys) -> str:
    """Run the command; it must exit 2 with a one-line error on stderr and no traceback."""
    try:
        status = main(argv)
    except SystemExit as e:  # argparse's own errors (types, unknown options)
        status = e.code
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Traceback" not in err
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1, err
    return err


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"twinkle-fx {twinkle_fx.__version__} (torch {torch.__version__.split('+')[0]}")


@pytest.mark.parametrize("argv, expected", [
    (["explain", "--config", "bogus"], "'bogus' is not a transformers causal-LM model type; the built-in kernels cover qwen2"),
    (["explain", "--config", "lama"], "did you mean llama"),
    (["explain", "--seq", "0"], "argument --seq: must be a positive integer, got 0"),
    (["explain", "--device", "nonsense"], "'nonsense' is not a device name"),
    (["bench", "--batch", "-1"], "argument --batch: must be a positive integer, got -1"),
    (["bench", "--warmup", "x"], "argument --warmup: must be an integer, got 'x'"),
    (["bench", "--plot", "missing.json"], "--plot missing.json: no such file"),
    (["bench", "--tiny", "--backends", "eager,fast"], "--backends: unknown backend(s) 'fast'; valid: eager, inductor"),
    (["bench", "--tiny", "--model", "gpt9"], "--model: unknown model(s) 'gpt9'; valid: qwen2"),
    (["bench", "--tiny", "--micro", "--ops", "nope"], "--ops: unknown op(s) 'nope'; valid: silu_and_mul"),
    (["bench", "--tiny", "--matrix", "--models", "qwen2,gpt9"], "--models: unknown model(s) 'gpt9'; valid: qwen2"),
    (["bench", "--tiny", "--models", "qwen2"], "--models lists the models of --matrix"),
    (["bench", "--tiny", "--matrix", "--micro"], "are three benchmarks; give one"),
])
def test_bad_arguments_are_one_line_errors(argv, expected, capsys, device):
    if "--tiny" in argv:
        # --tiny defaults to the CPU (the Triton interpreter): on a GPU run, the GPU
        argv = [*argv, "--device", device]
    err = _fails(argv, capsys)
    assert expected in err
    assert len(err) < 1500  # the usage and one line, not the 12,266-character list of every transformers model type


def test_a_device_this_machine_lacks_says_what_to_use(capsys):
    missing = "cuda" if not torch.cuda.is_available() else "cuda:99"
    err = _fails(["explain", "--device", missing], capsys)
    assert f"--device {missing}:" in err
    assert "use --device cpu" in err or "this machine has" in err


def test_an_unknown_option_shows_the_subcommand_usage(capsys):
    err = _fails(["explain", "--confg", "qwen2"], capsys)
    assert err.startswith("usage: twinkle-fx explain")
    assert "unrecognized arguments: --confg qwen2" in err


def test_a_saved_file_that_is_no_result_is_named(tmp_path, capsys):
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"kind": "something else"}))
    assert "not a twinkle-fx bench result" in _fails(["bench", "--plot", str(bad)], capsys)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
@pytest.mark.parametrize("extra", [[], ["--micro"]])
def test_full_size_bench_on_cpu_needs_force(extra, capsys):
    err = _fails(["bench", "--backends", "eager", *extra], capsys)
    assert "takes hours; use --tiny" in err and "--force" in err


def test_step_progress_without_tqdm_prints_lines(monkeypatch, capsys):
    monkeypatch.setitem(__import__("sys").modules, "tqdm.auto", None)
    progress = StepProgress(3, "eager", every_s=3600)
    for _ in range(3):
        progress.tick()
    progress.close()
    assert capsys.readouterr().err == "    eager: 3/3\n"  # throttled: only the last line


def test_step_progress_ticks_after_every_warmup_and_timed_step():
    ticks, calls = [], []

    def step():
        calls.append(len(ticks))
        return torch.tensor(1.0)

    timing = time_training_steps(step, DeviceClock(torch.device("cpu")), warmup=2, steps=3,
                                 on_step=lambda: ticks.append(1))
    assert len(timing.step_ms) == 3 and len(ticks) == 5
    # the first (compiling) step, then one tick after each later step; then the host-time steps and the
    # step whose loss is compared with the first one's (last_loss), untimed
    assert calls == [0, 0, 1, 2, 3, 4] + [5] * (len(timing.host_ms) + 1)


def test_training_peak_covers_the_warmup_steps_where_cuda_graphs_are_recorded():
    """A CUDA graph allocates its memory when it is recorded (a warm-up step) and nothing when it
    replays: the reported peak covers the warm-up steps, the first (compiling) step's apart."""

    class Clock(DeviceClock):  # the allocator of a graphed model, simulated on the CPU
        def __init__(self):
            super().__init__(torch.device("cpu"))
            self.live, self.high = 0, 0

        def allocated(self):
            return self.live

        def reset_peak(self):
            self.high = self.live

        def peak(self):
            return self.high

        def peak_reserved(self):
            return self.high

    clock, calls = Clock(), []

    def step():
        calls.append(1)
        allocated = {1: 500, 2: 300}.get(len(calls), 10)  # eager first step, then the recording step
        clock.high = max(clock.high, clock.live + allocated)
        return torch.tensor(1.0)

    timing = time_training_steps(step, clock, warmup=2, steps=3)
    assert timing.first_step_peak_bytes == 500
    assert timing.peak_bytes == 300  # the recording (first warm-up) step, not the replays' 10
