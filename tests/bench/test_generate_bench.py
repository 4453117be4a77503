"""``python -m twinkle_fx.bench.generate --tiny``: every row runs generate() on the tiny config,
generates the asked-for tokens, and the fp32 token check compares each row with eager."""

import json

import pytest

from twinkle_fx.bench import generate


@pytest.mark.slow
def test_tiny_generate_bench_runs_every_row_and_compares_tokens(tmp_path, capsys):
    out = tmp_path / "generate.json"
    assert generate.main(["--tiny", "--batches", "2", "--prompt", "8", "--new-tokens", "3", "--repeats", "1",
                          "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = {r["row"]: r for r in result["rows"]}
    assert set(rows) == set(generate.GENERATE_ROWS)
    for row in rows.values():
        assert row["error"] is None, row
        assert row["prefill_ms"] > 0 and row["tokens_equal"] is True, row
    table = capsys.readouterr().out
    assert "| twinkle | 2 |" in table and "fp32 tokens" in table


@pytest.mark.parametrize("argv, message", [(["--rows", "nope"], "unknown row"), (["--new-tokens", "1"], "at least 2"),
                                           (["--batches", "x"], "positive integers")])
def test_bad_arguments_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        generate.main(["--tiny", *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_a_steps_device_time_counts_overlapping_kernels_once():
    """Kernels launched as programmatic dependents start (and wait) while the one before runs: the step's device
    time is the time some kernel runs, while the split by class sums each kernel's duration."""
    from types import SimpleNamespace

    def event(name, start, end, device="CUDA"):
        return SimpleNamespace(name=name, device_type=SimpleNamespace(name=device), device_time=end - start,
                               time_range=SimpleNamespace(start=start, end=end))

    def trace(steps):  # each step: a GEMV, then another that starts 2 us before the first ends
        events = [event("cudaLaunchKernel", 0.0, 1.0, device="CPU"), event("Memcpy HtoD", 0.0, 3.0)]
        for i in range(steps):
            t = 100.0 * i
            events += [event("_gemv_kernel", t, t + 10.0), event("_gemv_swiglu_kernel", t + 8.0, t + 20.0)]
        return generate._DeviceKernels.of(events)

    kernels, ms, split, names = generate._per_step(trace(1), trace(4), 3, top=1)
    assert kernels == 2 and ms == pytest.approx(0.020)  # 20 us of device time a step, not the 22 us summed
    assert split == "GEMM 2 x 0.022 ms" and names == "_gemv_swiglu_kernel 1.0 x 12.0 us"
