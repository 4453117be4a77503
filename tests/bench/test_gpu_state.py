"""The GPU's clocks, power and temperature during timed steps: what nvidia-smi's CSV lines say, a sampler that
runs its loop beside the measurement and stops with it, and the rows and tables that carry the state."""

from __future__ import annotations

import os
import sys
import time
import types

import pytest
import torch

from twinkle_fx.bench.matrix import format_matrix
from twinkle_fx.measure.gpu_state import QUERY, GpuState, GpuStateSampler, gpu_state_from_csv

# as nvidia-smi --format=csv,noheader,nounits printed them on an H200 (loaded, then capped)
LINES = ["1980, 1980, 512.40, 700.00, 48, Not Active, Not Active, Not Active",
         "1755, 1980, 699.10, 700.00, 63, Active, Not Active, Not Active",
         "1740, 1980, 698.70, 700.00, 64, Active, Not Active, Not Active"]


def test_the_state_of_three_samples_says_the_clock_dropped_under_the_power_cap():
    state = gpu_state_from_csv(LINES)
    assert state.samples == 3
    assert state.sm_mhz_mean == pytest.approx((1980 + 1755 + 1740) / 3, abs=0.05)
    assert (state.sm_mhz_min, state.sm_mhz_max_supported, state.power_limit_w, state.temperature_c_max) == (
        1740.0, 1980.0, 700.0, 64.0)
    assert state.slowdowns == ("power cap",)
    assert "slowed by: power cap" in state.describe()
    assert GpuState.from_json(state.to_json()) == state


def test_unreadable_fields_and_foreign_lines_are_skipped():
    lines = ["WARNING: infoROM is corrupted at gpu 0000:00:00.0",
             "1410, [N/A], [N/A], [N/A], 40, [N/A], [N/A], [N/A]",
             "[N/A], 1980, 100, 700, 40, Not Active, Not Active, Not Active"]
    state = gpu_state_from_csv(lines)
    assert (state.samples, state.sm_mhz_mean, state.power_w_mean, state.sm_mhz_max_supported) == (1, 1410.0, None, None)
    assert state.slowdowns == ()
    assert state.describe() == "SM clock 1410 MHz (min 1410), up to 40 C"
    assert gpu_state_from_csv(["", "garbage"]) is None


def test_samples_without_the_slowdown_reasons_of_an_older_driver_are_read():
    state = gpu_state_from_csv([", ".join(line.split(", ")[:5]) for line in LINES])
    assert (state.samples, state.sm_mhz_min, state.power_limit_w, state.slowdowns) == (3, 1740.0, 700.0, ())


def test_the_sampler_reads_its_command_until_the_block_ends(tmp_path):
    # a stand-in for nvidia-smi's loop: prints a sample every 10 ms until terminated
    script = tmp_path / "smi.py"
    script.write_text("import sys, time\n"
                      f"lines = {LINES!r}\n"
                      "for i in range(10_000):\n"
                      "    print(lines[i % 3], flush=True)\n"
                      "    time.sleep(0.01)\n")
    with GpuStateSampler(torch.device("cpu"), command=[sys.executable, str(script)]) as sampler:
        time.sleep(0.5)
        process = sampler._process
    assert process.poll() is not None  # stopped with the block
    assert sampler.state is not None and sampler.state.samples >= 3
    assert sampler.state.slowdowns == ("power cap",)


def test_a_sampler_without_a_gpu_or_a_command_records_nothing(tmp_path):
    with GpuStateSampler(torch.device("cpu")) as sampler:
        pass
    assert sampler.state is None
    with GpuStateSampler(torch.device("cpu"), command=[str(tmp_path / "no-such-tool")]) as sampler:
        pass
    assert sampler.state is None


def test_the_matrix_table_shows_each_rows_clock():
    row = {"backend": "twinkle+cudagraphs", "ms_per_step": 55.9, "tokens_per_s": 73_000.0, "loss_check": "agrees",
           "vs_reference": {"throughput": 1.08}, "notes": {"gpu_state": gpu_state_from_csv(LINES).to_json()}}
    reference = {"backend": "inductor+cudagraphs", "ms_per_step": 60.4, "tokens_per_s": 67_800.0, "notes": {}}
    matrix = {"environment": {"device": "H200", "versions": {}, "commit": "abc"},
              "results": [{"workload": {"model": "llama1b", "shape_of": "Llama-3.2-1B", "batch": 4, "seq": 1024},
                           "rows": [reference, row]}]}
    table = format_matrix(matrix)
    assert table.splitlines()[2].endswith("| SM MHz |")
    reference_line, row_line = (line for line in table.splitlines() if line.startswith("| llama1b"))
    assert reference_line.endswith("| reference | – |")
    assert row_line.endswith("| agrees | 1825 (min 1740) |")


@pytest.mark.gpu
def test_nvidia_smi_reports_the_gpu_under_load(device):
    import shutil

    if not shutil.which("nvidia-smi"):
        pytest.skip("this GPU machine has no nvidia-smi")
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    with GpuStateSampler(device, interval_ms=50) as sampler:
        deadline = time.perf_counter() + 0.5
        while time.perf_counter() < deadline:
            a @ a
        torch.cuda.synchronize(device)
    assert sampler.state is not None, f"nvidia-smi printed no sample for --query-gpu={','.join(QUERY)}"
    assert sampler.state.samples >= 2 and sampler.state.sm_mhz_mean > 0


def test_a_driver_without_uuid_ids_or_slowdown_fields_is_asked_what_it_answers(tmp_path, monkeypatch):
    # a stand-in nvidia-smi that rejects UUID ids and the slowdown-reason fields, as some drivers do, and loops
    # when asked to
    tool = tmp_path / "nvidia-smi"
    tool.write_text(f"#!{sys.executable}\n"
                    "import sys, time\n"
                    "args = ' '.join(sys.argv[1:])\n"
                    "if '--id=GPU-' in args: sys.exit(6)\n"
                    "if 'clocks_event_reasons' in args: sys.exit(2)\n"
                    "for _ in range(10_000 if '--loop-ms' in args else 1):\n"
                    "    print('1755, 1980, 640.0, 700.00, 61', flush=True)\n"
                    "    time.sleep(0.01)\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: types.SimpleNamespace(uuid="58a3c4f2"))
    from twinkle_fx.measure import gpu_state

    gpu_state._query.cache_clear()
    try:
        assert gpu_state._query(0) == ("0", QUERY[:5])
        with GpuStateSampler(torch.device("cuda", 0)) as sampler:
            time.sleep(0.3)
    finally:
        gpu_state._query.cache_clear()
    assert sampler.state is not None and sampler.state.sm_mhz_mean == 1755.0 and sampler.state.slowdowns == ()
