"""What the fsdp job of tools/gpu.sh records: its runs merged into one JSON with the scaling table (each FSDP2 run
against its 1-GPU twin, the losses against the global batch, each backend against torch.compile), and the
profiled communication row of a run's table."""

from __future__ import annotations

import json

import pytest

from twinkle_fx.bench.distributed_args import parse_args
from twinkle_fx.bench.distributed_results import RankSwaps, RunResult, main, scaling_table, table
from twinkle_fx.measure.overlap import communication_overlap

SHAPE = "--model llama3b --size tiny --batch 2 --seq 8 --steps 3 --regional"


def run(flags: str, world: int, ms: float, losses=(5.0, 4.0, 3.0), peak=None) -> RunResult:
    args = vars(parse_args(f"{SHAPE} {flags}".split()))
    return RunResult(args, world, "cuda:0", list(losses), [], [RankSwaps(r) for r in range(world)],
                     [1000.0, ms, ms, ms], [peak] * world)


def runs() -> list[RunResult]:
    return [
        run("--parallel none --backend inductor", 1, 100.0, peak=30.0),
        run("--parallel none --backend twinkle", 1, 90.0, peak=25.0),
        run("--parallel none --backend twinkle --batch 4", 1, 180.0, losses=(5.0, 4.0, 3.003)),  # global batch
        run("--parallel fsdp2 --backend inductor", 2, 125.0, peak=20.0),
        run("--parallel fsdp2 --backend twinkle", 2, 100.0, peak=15.0),
    ]


def test_scaling_pairs_each_fsdp2_run_with_its_twin_and_the_global_batch():
    text = scaling_table(runs())
    # 2 x 2 x 8 tokens in 125 ms against 2 x 8 in 100 ms: 1.60x; twinkle: 2 x 90 / 100 = 1.80x
    assert "| torch.compile regional | 160 | 256 | 1.60x | 100.0; 125.0 | 30.00; 20.00, 20.00 |" in text
    assert "| twinkle regional | 178 | 320 | 1.80x | 90.0; 100.0 | 25.00; 15.00, 15.00 | max relative 1.0e-03 " \
           "(twinkle regional) |" in text
    assert "twinkle regional / torch.compile regional under fsdp2 x 2: 1.25x" in text


def test_copy_engine_runs_are_compared_with_torch_compile_on_copy_engines_and_with_nccl():
    ce = [run("--parallel fsdp2 --backend inductor --collectives copy-engine", 2, 100.0),
          run("--parallel fsdp2 --backend twinkle --collectives copy-engine", 2, 80.0)]
    text = scaling_table(runs() + ce)
    # the same 1-GPU twin as the NCCL run: 2 x 2 x 8 tokens in 80 ms against 2 x 8 in 90 ms
    assert "| twinkle regional, copy-engine collectives | 178 | 400 | 2.25x |" in text
    assert ("twinkle regional, copy-engine collectives / torch.compile regional, copy-engine collectives under "
            "fsdp2 x 2: 1.25x") in text
    assert "twinkle regional, copy-engine collectives / twinkle regional under fsdp2 x 2: 1.25x" in text
    assert "twinkle regional / torch.compile regional under fsdp2 x 2: 1.25x" in text  # NCCL against NCCL


def test_a_run_without_its_twin_is_still_listed():
    text = scaling_table([r for r in runs() if not (r.world_size == 1 and r.args["backend"] == "inductor")])
    assert "| torch.compile regional | - | 256 | - |" in text


def test_merge_names_every_run_and_leaves_out_the_missing(tmp_path, capsys):
    paths = []
    for name, result in zip(("single-inductor", "single-twinkle", "global", "fsdp2-inductor", "fsdp2-twinkle"),
                            runs()):
        path = tmp_path / f"{name}.json"
        environment = {"device": "NVIDIA H200", "world": result.world_size}
        path.write_text(json.dumps({"environment": environment, "runs": [result.to_json()], "tables": [name]}))
        paths.append(f"{name}={path}")
    out = tmp_path / "all.json"
    assert main(["--out", str(out), *paths, f"fsdp2-cudagraphs={tmp_path / 'missing.json'}"]) == 0
    merged = json.loads(out.read_text())
    assert list(merged["runs"]) == ["single-inductor", "single-twinkle", "global", "fsdp2-inductor", "fsdp2-twinkle"]
    assert merged["environment"]["world"] == 2  # a multi-device run's environment
    assert merged["tables"] == list(merged["runs"]) and "1.80x" in merged["scaling"]
    printed = capsys.readouterr().out
    assert "fsdp2-cudagraphs: no " in printed and "left out" in printed and "| twinkle regional |" in printed


def test_merge_needs_a_name_for_each_file(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "all.json"), str(tmp_path / "run.json")])
    assert "give NAME=FILE" in capsys.readouterr().err


def test_profiled_communication_has_a_row_per_rank():
    ag = "ncclDevKernel_AllGather_RING_LL"
    overlap = communication_overlap([(20, ag, 0, 10_000), (7, "gemm", 0, 6_000)]).to_json()
    result = runs()[-1]
    result.communication = [overlap, overlap]
    text = table(result)
    assert "| communication ms/step, rank 1 (profiled) | 10.0 with a collective, 4.0 exposed (AllGather 4.0)" in text


def test_a_gpu_profile_reports_its_exposed_communication():
    """On a GPU the profiled steps' trace, parsed once, also gives the exposed communication (the CPU has none)."""
    from twinkle_fx.bench.profile import exposed_communication

    events = [{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "ts": 0, "dur": 9000,
               "args": {"device": 1, "stream": 24}},
              {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 0, "dur": 3000, "args": {"device": 1, "stream": 7}},
              # a copy-engine collective: its barrier kernel, then (after 2.5 ms of nothing) its copy from the peer
              {"ph": "X", "cat": "kernel", "name": "c10d::symmetric_memory::barrier_kernel(unsigned int**)",
               "ts": 9000, "dur": 500, "args": {"device": 1, "stream": 30}},
              {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy PtoP (Device -> Device)", "ts": 12000, "dur": 1000,
               "args": {"device": 1, "stream": 30}},
              {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "ts": 13000, "dur": 1000,
               "args": {"device": 1, "stream": 7}}]
    comm, text = exposed_communication({"traceEvents": events}, 3)
    # 6 ms of the reduce-scatter, the barrier's 0.5 and the copy's 1 with no compute beside them, over 3 steps; the
    # local copy is not communication
    assert comm["exposed_ms"] == pytest.approx(2.5) and comm["collectives"]["ReduceScatter"]["calls"] == pytest.approx(1 / 3)
    assert set(comm["collectives"]) == {"ReduceScatter", "PeerBarrier", "PeerCopy"}
    assert comm["gaps"] == [{"ms": 2.5, "before": "c10d::symmetric_memory::barrier_kernel(unsigned int**)",
                             "after": "Memcpy PtoP (Device -> Device)"}]
    # the report's section, after a blank line
    assert text.startswith("\ncommunication per step (NCCL kernels, peer copies and barriers, 3 step(s)):")
    assert "   2.50 ms  after c10d::symmetric_memory::barrier_kernel(unsigned int**)  before Memcpy PtoP" in text
