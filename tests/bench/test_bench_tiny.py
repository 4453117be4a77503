"""The benchmark harness end to end on the CPU: ``twinkle-fx bench --tiny`` (the same code path as a
GPU run, with a tiny config and the Triton interpreter), plus the judging logic on hand-made rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from twinkle_fx.bench import BACKENDS, BenchResult, ModelBenchOptions, ModelRow, run_model_bench
from twinkle_fx.bench.backends import Backend, BackendUnavailable, _module_state_restored, parse_backends
from twinkle_fx.bench.micro import MICRO_CASES
from twinkle_fx.bench.report import annotate_model_rows, format_table

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _bench(*args: str, out: Path) -> subprocess.CompletedProcess:
    """``python -m twinkle_fx bench ARGS --out OUT`` on this checkout (not whatever is installed)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "kernels"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "twinkle_fx", "bench", *args, "--out", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def _png(path: Path) -> None:
    """A PNG chart where matplotlib (optional) is installed; none (the CLI says so) where it is not."""
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError:
        assert not path.exists(), f"{path} written without matplotlib"
        return
    assert path.is_file() and path.read_bytes()[:8] == PNG_MAGIC, f"{path} is not a PNG"


def test_the_first_backend_runs_again_after_the_others_when_asked(tmp_path):
    options = ModelBenchOptions(model="qwen2", backends=["eager"], batch=1, seq=8, dtype=torch.float32, steps=1,
                                warmup=0, device=torch.device("cpu"), tiny=True, repeat_first=True,
                                profile_dir=tmp_path)
    lines = []
    result = run_model_bench(options, progress=lines.append)
    assert [row.backend for row in result.rows] == ["eager", "eager again"]
    again = result.rows[1]
    assert again.status == "ok" and again.first_loss == result.rows[0].first_loss
    assert again.vs_eager["throughput"] > 0  # compared with the first run of the same code
    assert any(line.startswith("[2/2] eager again:") for line in lines)
    # each run keeps its own profile
    assert [row.notes["profile"]["report"] for row in result.rows] == [
        str(tmp_path / "eager" / "profile_report.txt"), str(tmp_path / "eager-again" / "profile_report.txt")]
    assert all((tmp_path / d / "profile_trace.json").is_file() for d in ("eager", "eager-again"))


@pytest.mark.slow
@pytest.mark.interpreter  # --tiny is the CPU through the Triton interpreter by definition
def test_tiny_model_bench_eager_and_kernelize(tmp_path):
    proc = _bench("--tiny", "--backends", "eager,kernelize", "--warmup", "0", out=tmp_path)
    result = json.loads((tmp_path / "bench-qwen2.json").read_text())
    _png(tmp_path / "bench-qwen2.png")

    assert result["kind"] == "model" and result["workload"]["tiny"]
    assert result["environment"]["triton_interpret"] is True
    eager, kernelize = result["rows"]
    assert [eager["backend"], kernelize["backend"]] == ["eager", "kernelize"]
    assert eager["status"] == kernelize["status"] == "ok", kernelize["error"]
    # the built-in kernels really ran (through the interpreter), and the loss agrees with eager
    assert kernelize["notes"]["swapped_layers"] == {
        "Qwen2MLP -> SwiGLUMLP": 2, "Qwen2RMSNorm -> RMSNorm": 5, "Qwen2ForCausalLM -> CausalLMFusedLoss": 1,
        "Qwen2DecoderLayer -> DecoderLayer": 2}
    assert kernelize["notes"]["patched_functions"] == ["transformers.models.qwen2.modeling_qwen2.apply_rotary_pos_emb"]
    assert kernelize["first_loss"] == pytest.approx(eager["first_loss"], rel=1e-4)
    for row in (eager, kernelize):
        assert len(row["step_ms"]) == 2 and row["tokens_per_s"] > 0 and row["first_step_s"] > 0
        assert row["peak_gib"] is None  # no allocator statistics on the CPU
        assert row["host_ms"] > 0
    assert kernelize["vs_eager"]["throughput"] == pytest.approx(kernelize["tokens_per_s"] / eager["tokens_per_s"])
    # the terminal got progress lines (stderr) and the table (stdout)
    assert "[2/2] kernelize" in proc.stderr
    assert "kernelize" in proc.stdout and "speed/eager" in proc.stdout


@pytest.mark.slow
@pytest.mark.interpreter  # --tiny is the CPU through the Triton interpreter by definition
def test_tiny_micro_bench_every_kernel_against_its_reference(tmp_path):
    _bench("--micro", "--tiny", "--backends", "eager,twinkle,liger,cce", "--warmup", "0", "--steps", "1", out=tmp_path)
    result = json.loads((tmp_path / "bench-micro.json").read_text())
    _png(tmp_path / "bench-micro.png")

    rows = {(r["op"], r["phase"], r["impl"]): r for r in result["rows"]}
    copy = rows["copy", "-", "torch"]
    assert copy["gbps"] > 0 and result["workload"]["copy_gbps"] == copy["gbps"]
    for case in MICRO_CASES:
        for phase in ("fwd", "fwd+bwd"):
            eager, twinkle = rows[case.label, phase, "eager"], rows[case.label, phase, "twinkle"]
            assert eager["status"] == "ok", eager["error"]
            assert twinkle["status"] == "ok", (twinkle["error"], twinkle["max_rel_error"])
            assert twinkle["max_rel_error"] <= 1e-4 and twinkle["ms"] > 0 and twinkle["host_us"] > 0
            assert (twinkle["host_bwd_us"] is None) == (phase == "fwd")
            assert twinkle["kernel_ms"] is None and twinkle["kernel_vs_inductor"] is None  # GPU profiles only
            assert twinkle["vs_eager"] == pytest.approx(eager["ms"] / twinkle["ms"])
            if case.op in ("fused_linear_cross_entropy", "moe_swiglu_experts", "gqa_attention"):  # matmul-bound
                assert twinkle["tflops"] > 0 and twinkle["gbps"] is None
            else:
                assert twinkle["copy_fraction"] == pytest.approx(twinkle["gbps"] / copy["gbps"])
        liger = [r for (op, _, impl), r in rows.items() if op == case.label and impl == "liger"]
        # a Liger row only where Liger has the op; here liger-kernel is not installed
        assert len(liger) == (2 if case.liger else 0)
        assert all(r["status"] == "unavailable" and "not installed" in r["error"] for r in liger)
        # a Cut Cross-Entropy row for the fused linear cross-entropy only (its one op)
        cce = [r for (op, _, impl), r in rows.items() if op == case.label and impl == "cce"]
        assert len(cce) == (2 if case.op == "fused_linear_cross_entropy" else 0)
        # on the CPU (installed with the bench extra or not): its kernels need a GPU
        assert all(r["status"] == "unavailable" and "need a CUDA device" in r["error"] for r in cce)


@pytest.mark.interpreter
def test_tiny_micro_bench_runs_one_case_of_an_op_by_its_name(tmp_path):
    _bench("--micro", "--tiny", "--ops", "moe_swiglu_experts mixtral", "--backends", "eager", "--warmup", "0",
           "--steps", "1", out=tmp_path)
    rows = json.loads((tmp_path / "bench-micro.json").read_text())["rows"]
    assert {r["op"] for r in rows} == {"copy", "moe_swiglu_experts mixtral"}


def _row(backend: str, loss: float, tokens_per_s: float = 100.0, peak: float | None = 1.0) -> ModelRow:
    return ModelRow(backend, tokens_per_s=tokens_per_s, ms_per_step=1.0, first_step_s=1.0, first_loss=loss,
                    peak_gib=peak)


def test_loss_disagreeing_with_eager_is_marked_wrong_and_ratios_use_eager_and_inductor():
    rows = [_row("eager", 11.93), _row("inductor", 11.931, 200.0, 0.5), _row("twinkle", 11.5, 300.0, 0.25)]
    annotate_model_rows(rows, dtype=torch.bfloat16)
    assert [r.status for r in rows] == ["ok", "ok", "wrong"]
    assert rows[2].vs_eager == {"throughput": 3.0, "memory": 0.25}
    assert rows[2].vs_inductor == {"throughput": 1.5, "memory": 0.5, "first_step": 1.0}
    nan_row = [_row("eager", 11.93), _row("kernelize", float("nan"))]
    annotate_model_rows(nan_row, dtype=torch.bfloat16)
    assert nan_row[1].status == "wrong"


def test_a_later_step_loss_unlike_the_first_marks_the_row_wrong():
    """Same weights and batch every step: a replayed CUDA graph whose loss moves is wrong even when
    its first (un-graphed) step agreed with eager."""
    rows = [_row("eager", 11.93), _row("inductor+cudagraphs", 11.93), _row("twinkle+cudagraphs", 11.93)]
    rows[1].last_loss, rows[2].last_loss = 11.9301, 10.2
    annotate_model_rows(rows, dtype=torch.bfloat16)
    assert [r.status for r in rows] == ["ok", "ok", "wrong"]
    assert "a later step's loss 10.200000 differs from the first step's 11.930000" in rows[2].loss_check


def test_a_raising_backend_is_a_failed_row_and_the_run_goes_on(monkeypatch):
    def broken(model, family, device):
        raise RuntimeError("kernel exploded")

    def missing(model, family, device):
        raise BackendUnavailable("some-package not installed")

    monkeypatch.setitem(BACKENDS, "broken", Backend("broken", "raises", broken))
    monkeypatch.setitem(BACKENDS, "missing", Backend("missing", "unavailable", missing))
    options = ModelBenchOptions(model="llama", backends=["broken", "missing", "eager"], batch=1, seq=8,
                                dtype=torch.float32, steps=1, warmup=0, device=torch.device("cpu"), tiny=True)
    lines: list[str] = []
    result = run_model_bench(options, progress=lines.append)
    broken_row, missing_row, eager_row = result.rows
    assert (broken_row.status, broken_row.error) == ("failed", "RuntimeError: kernel exploded")
    assert "kernel exploded" in broken_row.traceback
    assert (missing_row.status, missing_row.error) == ("unavailable", "some-package not installed")
    assert eager_row.status == "ok" and eager_row.first_loss > 0
    assert any(line.startswith("[1/3] broken: failed") for line in lines)
    table = format_table(result)
    assert "broken: failed: RuntimeError: kernel exploded" in table


@pytest.mark.parametrize("hide_matplotlib", [False, True])
def test_saved_result_is_rendered_again(tmp_path, monkeypatch, hide_matplotlib):
    if hide_matplotlib:  # the optional dependency missing: no PNG, no failure
        monkeypatch.setitem(sys.modules, "matplotlib", None)
    rows = [_row("eager", 11.93), _row("inductor", 11.93, 150.0, 0.6)]
    annotate_model_rows(rows, dtype=torch.bfloat16)
    workload = {"model": "qwen2", "shape_of": "Qwen2-0.5B", "batch": 4, "seq": 1024, "dtype": "bfloat16",
                "step": "forward + backward with labels", "steps": 20, "warmup": 3}
    environment = {"device": "NVIDIA H200 (140 GiB)", "device_type": "cuda", "date": "2026-01-01 00:00 UTC",
                   "versions": {"torch": "2.11.0"}, "commit": "abc1234"}
    saved = tmp_path / "run.json"
    BenchResult("model", environment, workload, rows).save(saved)
    loaded = BenchResult.load(saved)
    assert loaded.rows == rows

    from twinkle_fx.__main__ import main

    assert main(["bench", "--plot", str(saved), "--out", str(tmp_path / "png")]) == 0
    _png(tmp_path / "png" / "run.png")


def test_liger_style_module_patches_are_undone():
    from transformers.models.qwen2 import modeling_qwen2

    original_norm, original_rope = modeling_qwen2.Qwen2RMSNorm, modeling_qwen2.apply_rotary_pos_emb
    original_forward = modeling_qwen2.Qwen2ForCausalLM.forward
    with _module_state_restored(modeling_qwen2):
        modeling_qwen2.Qwen2RMSNorm = object
        modeling_qwen2.apply_rotary_pos_emb = len
        modeling_qwen2.Qwen2ForCausalLM.forward = len
        modeling_qwen2.added_by_patch = True
    assert modeling_qwen2.Qwen2RMSNorm is original_norm
    assert modeling_qwen2.apply_rotary_pos_emb is original_rope
    assert modeling_qwen2.Qwen2ForCausalLM.forward is original_forward
    assert not hasattr(modeling_qwen2, "added_by_patch")


def test_backend_names_are_checked():
    assert parse_backends("eager, liger+inductor,eager") == ["eager", "liger+inductor"]
    with pytest.raises(ValueError, match="Unknown backend.*'fast'.*valid: eager, inductor"):
        parse_backends("eager,fast")


@pytest.mark.slow
@pytest.mark.interpreter  # --tiny is the CPU through the Triton interpreter by definition
def test_tiny_inference_bench_prefill_and_static_cache_decode(tmp_path):
    """``--inference`` runs prefill and a static-cache decode step per row and checks
    each row's logits against eager's."""
    _bench("--inference", "--tiny", "--backends", "eager,kernelize", "--warmup", "0", out=tmp_path)
    result = json.loads((tmp_path / "bench-inference-qwen2.json").read_text())
    assert result["kind"] == "inference"
    rows = {row["backend"]: row for row in result["rows"]}
    assert [rows[name]["status"] for name in ("eager", "kernelize")] == ["ok", "ok"]
    assert rows["kernelize"]["prefill_rel_error"] < 1e-3 and rows["kernelize"]["decode_rel_error"] < 1e-3
    assert rows["eager"]["decode_tokens_per_s"] > 0


def test_device_time_counts_kernels_not_the_ranges_around_them():
    """A profile's device time sums kernels once: the record_function ranges the profiler projects onto
    the GPU timeline (a training step, DDP's forward, nccl:all_reduce) are not kernels. A 2-GPU DDP
    profile counted them and reported 184% of the wall time as kernel time."""
    from types import SimpleNamespace

    from twinkle_fx.measure.profiler_events import device_us

    cuda = torch.autograd.DeviceType.CUDA
    kernel = SimpleNamespace(device_type=cuda, is_user_annotation=False, self_device_time_total=250.0)
    step = SimpleNamespace(device_type=cuda, is_user_annotation=True, self_device_time_total=90_000.0)
    operator = SimpleNamespace(device_type=torch.autograd.DeviceType.CPU, is_user_annotation=False,
                               self_device_time_total=250.0)
    assert [device_us(e) for e in (kernel, step, operator)] == [250.0, 0.0, 0.0]


@pytest.mark.gpu
def test_kernel_time_counts_the_kernels_without_the_host_or_the_cache_flush():
    from twinkle_fx.bench.timing import kernel_ms, time_calls
    from twinkle_fx.measure.clock import DeviceClock

    clock = DeviceClock(torch.device("cuda"))
    x = torch.ones(1024, device="cuda")

    def small_launches():  # a few µs of host a launch for a µs or two of kernel
        for _ in range(200):
            x.add_(1)

    interval, _ = time_calls(small_launches, clock, warmup=1, reps=3)
    kernels = kernel_ms(small_launches, clock, reps=3)
    assert 0 < kernels < interval
    # the 256 MiB written before each call to cool the L2 is not the call's
    assert kernel_ms(lambda: None, clock, reps=3) < 0.002
    assert kernel_ms(small_launches, DeviceClock(torch.device("cpu")), reps=3) is None


def test_inference_rows_say_whether_the_timed_steps_replayed_cuda_graphs():
    from collections import Counter

    from twinkle_fx.bench.inference import _graph_note, _Timed

    none = torch.zeros(1)
    assert _graph_note("decode", _Timed(none, none, 1.0, 2.0), steps=20) is None  # no graphs in the row
    replayed = _Timed(none, none, 1.0, 2.0, graph_passes=20, graph_eager=Counter())
    assert _graph_note("decode", replayed, steps=20) == "decode: 20 of 20 timed steps replayed CUDA graphs"
    eager = _Timed(none, none, 1.0, 2.0, graph_passes=0, graph_eager=Counter({"an argument of type X": 20}))
    assert _graph_note("decode", eager, steps=20) == ("WARNING decode: 0 of 20 timed steps replayed CUDA graphs "
                                                      "(the others ran eagerly: 20 x an argument of type X)")


def test_a_profiled_row_says_what_the_host_spends_per_kernel_call():
    """The host cost stays visible: the host time of a step over the device operations it ran,
    whatever launched them (a CUDA-graph replay runs many operations for one launch)."""
    profile = {"host_ms_per_step": 36.0, "device_ms_per_step": 30.0, "launches_per_step": 24.0,
               "kernels_per_step": 1500.0}
    graphed = _row("kernelize+cudagraphs", 11.93)
    graphed.host_ms, graphed.notes = 12.0, {"profile": profile}
    rows = [_row("eager", 11.93), graphed]
    annotate_model_rows(rows, dtype=torch.bfloat16)
    workload = {"model": "qwen2", "shape_of": "Qwen2-0.5B", "batch": 4, "seq": 1024, "dtype": "bfloat16",
                "step": "forward + backward with labels", "steps": 20, "warmup": 3}
    environment = {"device": "NVIDIA H100", "device_type": "cuda", "date": "2026-01-01 00:00 UTC",
                   "versions": {"torch": "2.11.0"}, "commit": "abc1234"}
    table = format_table(BenchResult("model", environment, workload, rows))
    assert ("kernelize+cudagraphs: profiled: 36.0 ms wall, 30.0 ms device, 24 launches and 1500 device "
            "operations per step; host us per kernel call 8.0") in table


def test_compiler_warm_up_runs_on_a_gpu_only_and_a_failure_does_not_stop_the_run():
    from twinkle_fx.bench.model_bench import warm_compiler

    said = []
    assert warm_compiler(torch.device("cpu"), ["inductor"], said.append) is None and not said  # CPU: smoke runs
    assert warm_compiler(torch.device("cuda"), ["eager", "kernelize"], said.append) is None and not said  # nothing compiles
    if not torch.cuda.is_available():  # the warm-up's own failure is said, and the rows run (and fail) as they would
        assert warm_compiler(torch.device("cuda"), ["inductor"], said.append) is None
        assert said and said[0].startswith("compiler warm-up failed"), said


@pytest.mark.slow
@pytest.mark.interpreter  # --tiny is the CPU through the Triton interpreter by definition
def test_the_matrix_runs_every_model_and_checks_each_against_its_first_backend(tmp_path):
    """``bench --matrix --tiny``: one table over the models, each row's first-step loss checked (here
    against eager, the model benchmark's own check), ratios to the model's first backend."""
    proc = _bench("--matrix", "--tiny", "--models", "qwen2,qwen3_moe", out=tmp_path)
    matrix = json.loads((tmp_path / "bench-matrix.json").read_text())
    assert [r["workload"]["model"] for r in matrix["results"]] == ["qwen2", "qwen3_moe"]
    for result in matrix["results"]:
        assert [row["backend"] for row in result["rows"]] == ["eager", "kernelize"]
        assert all(row["status"] == "ok" for row in result["rows"]), result["rows"]
        assert result["rows"][0]["vs_reference"]["throughput"] == 1.0
        assert "vs eager" in result["rows"][1]["loss_check"]
    table = proc.stdout
    assert "| qwen3_moe (Qwen3-30B-A3B, 4 of 48 layers (tiny config)), 2×32 | kernelize |" in table
    assert table.count("| agrees |") == 2 and table.count("| reference |") == 2, table


def test_the_matrix_profiles_each_model_in_a_folder_of_its_own(tmp_path, monkeypatch):
    from twinkle_fx.bench import matrix

    seen = []

    def model_bench(options, progress):
        seen.append((options.model, options.profile_dir))
        return BenchResult("model", {}, {}, [])

    monkeypatch.setattr(matrix, "run_model_bench", model_bench)
    options = ModelBenchOptions(model="qwen2", backends=["eager"], batch=1, seq=8, dtype=torch.float32, steps=1,
                                warmup=0, device=torch.device("cpu"), profile_dir=tmp_path)
    matrix.run_matrix(("qwen2", "llama1b"), options, progress=lambda _: None)
    assert seen == [("qwen2", tmp_path / "qwen2"), ("llama1b", tmp_path / "llama1b")]
    seen.clear()
    matrix.run_matrix(("qwen2",), replace(options, profile_dir=None), progress=lambda _: None)
    assert seen == [("qwen2", None)]


def test_without_eager_the_matrix_checks_losses_against_the_first_backend():
    from twinkle_fx.bench.matrix import _check_against_reference

    rows = [ModelRow("inductor+cudagraphs", tokens_per_s=100.0, peak_gib=2.0, first_step_s=10.0, first_loss=12.0,
                     loss_check="not checked: no eager row in this run"),
            ModelRow("twinkle+cudagraphs", tokens_per_s=150.0, peak_gib=1.0, first_step_s=12.0, first_loss=12.001),
            ModelRow("kernelize+cudagraphs", tokens_per_s=120.0, peak_gib=1.5, first_step_s=2.0, first_loss=12.5)]
    result = BenchResult("model", {}, {}, rows)
    _check_against_reference(result, rtol=1e-2 / 12)
    assert [r.status for r in rows] == ["ok", "ok", "wrong"]
    assert rows[0].loss_check is None and "vs inductor+cudagraphs 12.000000" in rows[1].loss_check
    assert rows[1].vs_reference == {"throughput": 1.5, "memory": 0.5, "first_step": 1.2}


def test_a_twinkle_backend_without_one_graph_rewrite():
    """``<twinkle backend>-<rewrite>``: the backend with that rewrite off in its registry scope, and only there."""
    import twinkle_fx
    from twinkle_fx.bench.backends import backend

    assert parse_backends("twinkle+cudagraphs,twinkle+cudagraphs-embedding_grad") == [
        "twinkle+cudagraphs", "twinkle+cudagraphs-embedding_grad"]
    for name in ("inductor-embedding_grad", "twinkle+cudagraphs-no_such_rewrite"):
        with pytest.raises(ValueError, match="a twinkle backend followed by -<graph rewrite>"):
            parse_backends(name)
    ablated = backend("twinkle-residual_norm")
    assert ablated.name == "twinkle-residual_norm" and ablated.description.endswith("without the residual_norm rewrite")
    model = torch.nn.Linear(4, 4)
    with ablated.prepare(model, "qwen2", torch.device("cpu")):  # Dynamo compiles at the first call: nothing here
        assert not twinkle_fx.get_registry().has_graph_rewrite("residual_norm")
        assert twinkle_fx.get_registry().has_graph_rewrite("embedding_grad")
    assert twinkle_fx.get_registry().has_graph_rewrite("residual_norm")


def test_the_fused_experts_backend_binds_the_experts_to_the_fused_kernel_in_its_scope_only():
    """``twinkle+cudagraphs+fused-experts``: twinkle+cudagraphs with ``use_builtin_kernels(fused_experts=True)``,
    which reaches Mixtral's experts too (by default they keep transformers' implementation)."""
    from twinkle_fx.bench.backends import backend

    fused = backend("twinkle+cudagraphs+fused-experts")
    with fused.prepare(torch.nn.Linear(4, 4), "mixtral", torch.device("cpu")) as prepared:
        assert "MixtralExperts -> FusedSwiGLUExperts" in prepared.notes["builtin_kernels"]
    with backend("twinkle+cudagraphs").prepare(torch.nn.Linear(4, 4), "mixtral", torch.device("cpu")) as prepared:
        assert "MixtralExperts -> SwiGLUExperts" in prepared.notes["builtin_kernels"]
