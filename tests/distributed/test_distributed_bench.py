"""twinkle_fx.bench.distributed on 2 CPU processes (gloo), the tiny Qwen2 and Llama shapes, fp32, Triton interpreter.

One torchrun launch runs every configuration (DDP and FSDP2; compiled whole with backend="twinkle"
and its inner aot_eager, compiled per decoder layer, eagerly kernelized; gradient accumulation,
FSDP2 mixed precision with activation checkpointing, explicit prefetching, no reshard after forward,
compiled autograd, tied_embedding_ddp); each must reproduce, step by step, the losses of a single-process
eager run over the same global batch (mixed precision: within bf16's tolerance), and every rank must report
the swaps.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from dist_launch import torchrun

# gloo runs CPU processes, so the kernels run through the Triton interpreter: not on a GPU run
pytestmark = pytest.mark.interpreter

import twinkle_fx.bench.distributed as distributed_bench
from twinkle_fx.bench.distributed_models import MODELS
from twinkle_fx.bench.distributed_results import RankSwaps, RunResult, describe_args, load_baseline, table

HERE = Path(__file__).resolve().parent

STEPS = 3
COMMON = f"--size tiny --batch 1 --seq 8 --steps {STEPS} --dtype fp32"
SHORT = "--size tiny --batch 1 --seq 8 --steps 2 --dtype fp32"  # the added runs: 2 steps keep CI short
ACCUM = f"{SHORT} --accum 2"
RUNS = {
    # 1 MB buckets split the 4 MB model: DDPOptimizer hands the backend one subgraph per bucket
    "ddp_twinkle": f"{COMMON} --parallel ddp --backend twinkle --compiler aot_eager --bucket-cap-mb 1",
    # DDP's static graph and gradients as bucket views (--ddp-static-graph, --grad-as-bucket-view)
    # and DDP's built-in all-reduce hook (one division per bucket) without the buffer broadcast
    "ddp_kernelize": f"{COMMON} --parallel ddp --backend kernelize --ddp-static-graph --grad-as-bucket-view "
                     "--ddp-comm-hook allreduce --no-broadcast-buffers",
    # AdamW(fused=True) on DTensors; the layers keep their gathered parameters until their backward
    "fsdp2_kernelize": f"{COMMON} --parallel fsdp2 --backend kernelize --fused-adamw --no-reshard-after-forward",
    "fsdp2_twinkle": f"{COMMON} --parallel fsdp2 --backend twinkle --compiler aot_eager",
    "ddp_kernelize_twinkle": f"{COMMON} --parallel ddp --backend kernelize+twinkle --compiler aot_eager",
    # regional: every decoder layer compiled on its own (one shared graph), the head eager on the root
    "ddp_regional_accum": f"{ACCUM} --parallel ddp --backend twinkle --compiler aot_eager --regional",
    "fsdp2_regional_mixed": f"{SHORT} --parallel fsdp2 --backend twinkle --compiler aot_eager --regional "
                            "--mixed-precision --checkpoint",
    "ddp_compiled_autograd": f"{SHORT} --parallel ddp --backend twinkle --compiler aot_eager --compiled-autograd",
    # twinkle_fx.distributed.tied_embedding_ddp: regional with accumulation (no_sync), regional with DDP's
    # static graph and bucket views (the GPU recipe), and compiled whole
    "ddp_tied_regional_accum": f"{ACCUM} --parallel ddp --backend twinkle --compiler aot_eager --regional "
                               "--tied-embedding-ddp",
    "ddp_tied_regional_static": f"{SHORT} --parallel ddp --backend twinkle --compiler aot_eager --regional "
                                "--tied-embedding-ddp --ddp-static-graph --grad-as-bucket-view --ddp-comm-hook allreduce",
    "ddp_tied_twinkle": f"{SHORT} --parallel ddp --backend twinkle --compiler aot_eager --tied-embedding-ddp",
    # the Llama family: its decoder layers compiled regionally under FSDP2, the fused AdamW on the shards,
    # each layer prefetching the next two all-gathers and keeping its gathered parameters until its backward
    "llama_fsdp2_regional": f"--model llama3b {COMMON} --parallel fsdp2 --backend twinkle --compiler aot_eager "
                            "--regional --fused-adamw --prefetch 2 --reshard-after-forward false",
}
LAYERS = MODELS["qwen2"].sizes["tiny"]["num_hidden_layers"]
ROTARY = "function transformers.models.qwen2.modeling_qwen2.apply_rotary_pos_emb"
RMSNORM = "layer Qwen2RMSNorm -> RMSNorm"
MLP = "layer Qwen2MLP -> SwiGLUMLP"
RESIDUAL = "function residual add + RMSNorm layer"  # a layer's attention residual joins its post-attention norm
ATTENTION = "scaled_dot_product_attention"  # the backend's attention rewrites (which fire depends on transformers' masks)
EAGER_SWAPS = {"kernelized Qwen2RMSNorm -> RMSNorm": 2 * LAYERS + 1, "kernelized Qwen2MLP -> SwiGLUMLP": LAYERS,
               "patched transformers.models.qwen2.modeling_qwen2.apply_rotary_pos_emb": 1}


@pytest.fixture(scope="module")
def distributed(tmp_path_factory) -> dict:
    # no GPU visible: the benchmark then takes gloo on the CPU even on a machine with one
    return torchrun(HERE / "distributed_bench_runs.py", tmp_path_factory.mktemp("gloo") / "runs.json",
                    *(f"{name}={flags}" for name, flags in RUNS.items()), timeout=300, env={"TRITON_INTERPRET": "1"})


@pytest.fixture(scope="module")
def single_process() -> dict[str, list[float]]:
    """Eager, no kernels, one process (``--parallel none``) over the global batch (2 rows): the reference
    losses, without and with gradient accumulation, and of the tiny Llama."""
    def losses(common: str) -> list[float]:
        args = distributed_bench.parse_args(f"{common} --batch 2 --backend eager --parallel none".split())
        return distributed_bench.train(args, 0, 1, torch.device("cpu")).losses

    return {"": losses(COMMON), "accum": losses(ACCUM), "llama": losses(f"--model llama3b {COMMON}")}


def _swaps(result: dict) -> list[dict]:
    assert [s["rank"] for s in result["swaps"]] == [0, 1]
    return result["swaps"]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_losses_equal_single_process(distributed, single_process, name):
    losses = distributed[name]["losses"]
    family = "accum" if "accum" in name else "llama" if name.startswith("llama") else ""
    reference = single_process[family][:len(losses)]  # some runs take 2 steps
    assert distributed[name]["world_size"] == 2 and len(losses) == distributed[name]["args"]["steps"]
    assert len(set(reference)) == len(reference)  # the model trains: each step's loss differs
    # mixed precision computes in bf16 (8 mantissa bits): its losses agree to bf16's resolution
    tolerance = 2e-2 if "mixed" in name else 1e-4
    assert losses == pytest.approx(reference, abs=tolerance), (name, losses, reference)
    assert len(distributed[name]["peak_gib"]) == 2 and len(distributed[name]["step_ms"]) == len(reference)


@pytest.mark.slow
def test_regional_swaps_in_the_shared_layer_graph(distributed):
    """--regional: the decoder layers share one compiled graph, which carries one layer's swaps; the
    fused-loss head is installed eagerly on the uncompiled root (FSDP2: on its FSDP subclass), also
    with mixed precision and activation checkpointing."""
    for name, head in (("ddp_regional_accum", "Qwen2ForCausalLM"), ("fsdp2_regional_mixed", "FSDPQwen2ForCausalLM"),
                       ("ddp_tied_regional_accum", "Qwen2ForCausalLM")):
        for swaps in _swaps(distributed[name]):
            assert swaps["graphs"] == 1 and swaps["graph_breaks"] == 0, (name, swaps)
            assert swaps["swapped"] == {RMSNORM: 2, MLP: 1, ROTARY: 1, RESIDUAL: 1,
                                        f"kernelized {head} -> CausalLMFusedLoss": 1}, (name, swaps)
            assert swaps["kept"] == {}, (name, swaps)


@pytest.mark.slow
def test_llama_layers_compile_regionally_with_the_llama_kernels(distributed):
    """--model llama3b: compile_layers finds the LlamaDecoderLayers (one shared graph) and the built-in
    kernels bound for the llama family swap in it; the head goes on FSDP2's subclass of the root."""
    for swaps in _swaps(distributed["llama_fsdp2_regional"]):
        assert swaps["graphs"] == 1 and swaps["graph_breaks"] == 0, swaps
        assert swaps["swapped"] == {"layer LlamaRMSNorm -> RMSNorm": 2, "layer LlamaMLP -> SwiGLUMLP": 1,
                                    "function transformers.models.llama.modeling_llama.apply_rotary_pos_emb": 1,
                                    RESIDUAL: 1, "kernelized FSDPLlamaForCausalLM -> CausalLMFusedLoss": 1}, swaps
        assert swaps["kept"] == {}, swaps


def test_compiled_root_reported_once_per_compilation(world_of_one):
    """DDPOptimizer hands the backend one subgraph per bucket, each with the root's parameters: the root
    whose kernel (the head) the rewrite cannot apply is reported once, not once per piece."""
    import twinkle_fx
    from torch.nn.parallel import DistributedDataParallel as DDP
    from twinkle_fx.builtin import use_builtin_kernels
    from twinkle_fx.compiler import collect_reports
    from twinkle_fx.core.reasons import ReasonKind

    torch._dynamo.reset()
    with twinkle_fx.scoped_registry(), collect_reports() as report, torch.no_grad():
        use_builtin_kernels(devices=("cpu",), models=("qwen2",))
        model = distributed_bench.build_model("qwen2", "tiny", torch.float32, torch.device("cpu"), 0)
        compiled = torch.compile(DDP(model, bucket_cap_mb=1), backend="twinkle",
                                 options={"compiler": "eager", "mode": "train"})
        ids = torch.arange(8).unsqueeze(0)
        compiled(input_ids=ids, labels=ids)
    torch._dynamo.reset()
    assert report.graph_count >= 3, report.summary()  # split at the 1 MB buckets
    heads = [r for r in report.not_swapped if "CausalLMFusedLoss" in r.target]
    assert len(heads) == 1 and heads[0].reason.kind is ReasonKind.COMPILED_ROOT, report.summary()


def test_table_compares_with_the_single_device_baselines(tmp_path):
    """The table of a 2-rank run names its speed-up over the 1-device run of the same per-rank batch and
    its loss difference from the 1-device run of its global batch (what --compare-single writes)."""
    args = distributed_bench.parse_args("--parallel ddp --batch 2 --steps 3".split())
    single = distributed_bench.parse_args("--parallel none --batch 2 --steps 3 --compare-single 2".split())
    swaps = [RankSwaps(0, swapped={"layer Qwen2RMSNorm -> RMSNorm": 9})]
    both = [*swaps, RankSwaps(1, swapped={"layer Qwen2RMSNorm -> RMSNorm": 9})]
    # steps 3+ take 100, 100 and 700 ms (one stalled step): the median, 100, is the run's figure
    run = RunResult(vars(args), 2, "cpu", [5.0, 4.0, 3.0], [], both,
                                      [900.0, 200.0, 100.0, 100.0, 700.0], [None, None])
    speed = RunResult(vars(single), 1, "cpu", [9.0] * 3, [], swaps, [900.0, 100.0, 160.0], [None])
    loss = RunResult({**vars(single), "batch": 4}, 1, "cpu", [5.0, 4.001, 3.0], [], swaps,
                                       [900.0, 300.0, 300.0], [None])
    path = tmp_path / "single.json"
    path.write_text(json.dumps({"runs": [speed.to_json(), loss.to_json()]}))
    text = table(run, load_baseline(str(path)))
    assert "qwen2 tiny · ddp x 2 · twinkle (inductor) · fp32 · 2 x 8 per rank · optimize_ddp ddp_optimizer" in text
    assert "| ms/step (median; fastest-slowest)" in text and "| 100.0 (100.0-700.0) |" in text  # steps 3+ only
    assert "3.20x (100 tokens/s)" in text  # 2 x 2 x 8 tokens in 0.1 s against 2 x 8 in 0.16 s
    assert "max |diff| 1.00e-03" in text
    assert "r0: 9; r1: 9" in text and "9 x RMSNorm" in text


def test_profile_writes_a_trace_and_report_per_rank(tmp_path, capsys):
    """--profile DIR: three more steps under torch.profiler after the timed ones; the losses of the timed
    steps are those of a run without it."""
    common = "--parallel none --batch 1 --steps 2 --backend eager"
    plain = distributed_bench.train(distributed_bench.parse_args(common.split()), 0, 1, torch.device("cpu"))
    args = distributed_bench.parse_args(f"{common} --profile {tmp_path}".split())
    profiled = distributed_bench.train(args, 0, 1, torch.device("cpu"))
    assert profiled.losses == plain.losses
    assert (tmp_path / "rank0" / "profile_trace.json").stat().st_size > 0
    report = (tmp_path / "rank0" / "profile_report.txt").read_text()
    assert "3 profiled step(s) on cpu" in report and "1 device, no wrapper · eager" in report
    assert "host (wall) time per step" in capsys.readouterr().out


@pytest.mark.slow
def test_ddp_twinkle_swaps_in_every_bucket_subgraph(distributed):
    """DDPOptimizer splits the graph at the 1 MB bucket boundaries; the rewrite still applies in each
    subgraph. A layer cut by a boundary cannot become one kernel call: it is kept, with the reason."""
    rank0, rank1 = _swaps(distributed["ddp_twinkle"])
    assert {k: v for k, v in rank0.items() if k != "rank"} == {k: v for k, v in rank1.items() if k != "rank"}
    assert rank0["graphs"] >= 3 and rank0["graph_breaks"] == rank0["graphs"]  # DDPOptimizer's splits
    assert rank0["graphs_with_swaps"] == rank0["graphs"]
    assert rank0["swapped"][RMSNORM] == 2 * LAYERS + 1
    assert rank0["swapped"][ROTARY] == LAYERS
    # one MLP is cut by a bucket boundary: its two halves land in two subgraphs, each kept
    assert rank0["swapped"][MLP] == LAYERS - 1
    kept_mlps = sum(n for what, n in rank0["kept"].items() if what.startswith(MLP))
    assert kept_mlps == 2 and sum(rank0["kept"].values()) == kept_mlps, rank0["kept"]
    # each half says why (it used to read as "state from outside the module", or failed the reference)
    assert all("a DDP gradient-bucket boundary cuts this Qwen2MLP" in what for what in rank0["kept"]), rank0["kept"]
    # twinkle_fx.compile(DDP(model)) installed the fused-loss head on the wrapped model
    assert rank0["swapped"]["kernelized Qwen2ForCausalLM -> CausalLMFusedLoss"] == 1, rank0["swapped"]


@pytest.mark.slow
def test_tied_embedding_ddp_compiled_whole_keeps_the_swaps(distributed):
    """tied_embedding_ddp's hooks run between the graphs of a whole-model compile: every rank still
    swaps every norm and the head (the losses are checked above)."""
    rank0, rank1 = _swaps(distributed["ddp_tied_twinkle"])
    assert {k: v for k, v in rank0.items() if k != "rank"} == {k: v for k, v in rank1.items() if k != "rank"}
    assert rank0["swapped"][RMSNORM] == 2 * LAYERS + 1 and rank0["swapped"][ROTARY] == LAYERS, rank0
    assert rank0["swapped"]["kernelized Qwen2ForCausalLM -> CausalLMFusedLoss"] == 1, rank0


@pytest.mark.slow
def test_compiled_autograd_trains_and_keeps_the_head(distributed):
    """--compiled-autograd (DDP's Python reducer) trains to the same losses (checked above); the head is
    swapped on every rank. What the backend finds of the layers under it is reported as it is."""
    for swaps in _swaps(distributed["ddp_compiled_autograd"]):
        assert swaps["swapped"]["kernelized Qwen2ForCausalLM -> CausalLMFusedLoss"] == 1, swaps
        assert swaps["graphs"] >= 1, swaps


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ddp_kernelize", "fsdp2_kernelize"])
def test_kernelize_swaps_on_every_rank(distributed, name):
    head = "Qwen2ForCausalLM" if name.startswith("ddp") else "FSDPQwen2ForCausalLM"  # fully_shard's subclass
    for swaps in _swaps(distributed[name]):
        assert swaps["swapped"] == EAGER_SWAPS | {f"kernelized {head} -> CausalLMFusedLoss": 1}, swaps


@pytest.mark.slow
def test_kernelize_then_twinkle_swaps_on_every_rank(distributed):
    """Eager swaps first (the fused-loss head among them); the backend finds those layers already
    kernelized (their kernels are in the graph) and swaps nothing twice."""
    for swaps in _swaps(distributed["ddp_kernelize_twinkle"]):
        registered = {k: v for k, v in swaps["swapped"].items() if ATTENTION not in k}
        assert registered == EAGER_SWAPS | {"kernelized Qwen2ForCausalLM -> CausalLMFusedLoss": 1}, swaps
        assert all("already kernelized eagerly" in reason for reason in swaps["kept"]), swaps["kept"]


@pytest.mark.slow
def test_fsdp2_twinkle_swaps_on_every_rank(distributed):
    """FSDP2's hooks end Dynamo's graphs at each fully_shard module; identical decoder layers share
    one compiled graph, so one decoder layer's swaps stand for all of them."""
    rank0, rank1 = _swaps(distributed["fsdp2_twinkle"])
    assert {k: v for k, v in rank0.items() if k != "rank"} == {k: v for k, v in rank1.items() if k != "rank"}
    assert rank0["graphs"] > 1
    registered = {k: v for k, v in rank0["swapped"].items() if ATTENTION not in k}
    assert registered == {RMSNORM: 2, MLP: 1, ROTARY: 1, RESIDUAL: 1,
                          "kernelized FSDPQwen2ForCausalLM -> CausalLMFusedLoss": 1}


@pytest.mark.parametrize("extra", ["--compiler aot_eager", "--backend eager"])
def test_cudagraphs_refuses_what_it_cannot_replay(extra, capsys):
    argv = f"--size tiny --backend twinkle --cudagraphs {extra}".split()
    with pytest.raises(SystemExit):
        distributed_bench.parse_args(argv)
    assert "--cudagraphs needs a compiled --backend with --compiler inductor" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--no-reshard-after-forward", "--reshard-after-forward false",
                                  "--reshard-after-forward 2", "--prefetch 1", "--collectives copy-engine"])
def test_fsdp2_options_need_fsdp2(flag, capsys):
    with pytest.raises(SystemExit):
        distributed_bench.parse_args(f"--size tiny --parallel ddp {flag}".split())
    assert ("--prefetch, --layers-per-unit, --reduce-dtype, --replicate and --collectives are FSDP2 options"
            in capsys.readouterr().err)


@pytest.mark.parametrize(("value", "expected"), [("true", True), ("False", False), ("4", 4)])
def test_reshard_after_forward_takes_a_bool_or_a_group_size(value, expected):
    args = distributed_bench.parse_args(f"--parallel fsdp2 --reshard-after-forward {value}".split())
    assert args.reshard_after_forward is expected if isinstance(expected, bool) else args.reshard_after_forward == 4
    assert distributed_bench.parse_args("--parallel fsdp2".split()).reshard_after_forward is True


@pytest.mark.parametrize("value", ["1", "0", "yes"])
def test_reshard_after_forward_refuses_what_fully_shard_cannot_take(value, capsys):
    with pytest.raises(SystemExit):
        distributed_bench.parse_args(f"--parallel fsdp2 --reshard-after-forward {value}".split())
    assert f"takes true, false, inner or a group size of 2 or more ranks, not '{value}'" in capsys.readouterr().err


@pytest.mark.parametrize(("group", "world"), [(2, 2), (3, 4), (4, 4)])
def test_reshard_group_must_split_the_world(group, world):
    """A group size must divide the world and leave more than one group; a 2-rank world has none."""
    args = distributed_bench.parse_args(f"--parallel fsdp2 --reshard-after-forward {group}".split())
    with pytest.raises(ValueError, match=f"--reshard-after-forward {group}: .* must divide the world size {world}"):
        distributed_bench.check_world(args, world)
    distributed_bench.check_world(distributed_bench.parse_args("--parallel fsdp2".split()), world)


def test_reshard_group_that_splits_the_world_passes():
    distributed_bench.check_world(distributed_bench.parse_args("--parallel fsdp2 --reshard-after-forward 2".split()), 4)


def test_inductor_cudagraphs_under_fsdp2_is_refused_with_the_reason(capsys):
    """Inductor's CUDA graphs would be recorded again every step (FSDP2 gathers parameters into new memory):
    the tool says so before the run instead of running at re-recording speed."""
    with pytest.raises(SystemExit):
        distributed_bench.parse_args("--parallel fsdp2 --backend inductor --regional --cudagraphs".split())
    err = capsys.readouterr().err
    assert "--backend inductor --cudagraphs under FSDP2" in err and "use --backend twinkle --cudagraphs" in err
    assert distributed_bench.parse_args("--parallel none --backend inductor --regional --cudagraphs".split()).cudagraphs


def test_fsdp2_choices_name_the_run():
    args = distributed_bench.parse_args("--model llama3b --parallel fsdp2 --reshard-after-forward 4 --prefetch 2 "
                                        "--nccl-ctas 16 --sm-carveout 16 --fused-adamw".split())
    text = describe_args(args, 8, torch.device("cpu"))
    assert text.startswith("llama3b tiny · fsdp2 x 8 · ")
    assert ("reshard after forward to 4 ranks · prefetch 2 layer(s) · NCCL on 16 CTAs · GEMMs leave 16 SMs · "
            "fused AdamW") in text


def test_llama3b_reference_is_the_llama_3_2_3b_shape():
    from transformers import LlamaConfig

    from twinkle_fx.bench.distributed_models import model_config

    config = LlamaConfig(**model_config("llama3b", "reference"))
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (3072, 8192, 28)
    assert (config.num_attention_heads, config.num_key_value_heads, config.vocab_size) == (24, 8, 128256)
    assert config.tie_word_embeddings and config.rope_parameters["rope_theta"] == 500000.0
    with torch.device("meta"):
        from transformers import LlamaForCausalLM

        model = LlamaForCausalLM(config)
    # Llama-3.2-3B: 3.21 B parameters, the tied embedding counted once
    assert round(sum(p.numel() for p in model.parameters()) / 1e9, 2) == 3.21


def test_static_graph_refuses_accumulation(capsys):
    """DDP(static_graph=True) with no_sync() fails an internal assert on the first backward (reproduced
    with torch 2.13 on gloo; pytorch#143580), and past it would stop reducing gradients: the example
    refuses the pair and says why."""
    with pytest.raises(SystemExit):
        distributed_bench.parse_args("--size tiny --parallel ddp --ddp-static-graph --accum 2".split())
    assert "pytorch/pytorch/issues/143580" in capsys.readouterr().err


def test_ddp_options_need_ddp(capsys):
    with pytest.raises(SystemExit):
        distributed_bench.parse_args("--size tiny --parallel fsdp2 --ddp-static-graph".split())
    assert "--tied-embedding-ddp, --ddp-comm-hook and --no-broadcast-buffers are DistributedDataParallel options" \
        in capsys.readouterr().err


def test_cudagraphs_names_the_run():
    args = distributed_bench.parse_args("--size tiny --backend twinkle --regional --cudagraphs".split())
    assert "regional, CUDA graphs" in describe_args(args, 1, torch.device("cpu"))


def test_builtin_comm_hook_refuses_compiled_autograd(capsys):
    with pytest.raises(SystemExit):
        distributed_bench.parse_args("--size tiny --parallel ddp --backend twinkle --compiled-autograd "
                                     "--ddp-comm-hook allreduce".split())
    assert "DDP's Python reducer all-reduces each gradient in its own hook" in capsys.readouterr().err


@pytest.mark.parametrize("extra", ["", "--cudagraphs --parallel fsdp2 --regional"])
def test_persistent_grads_needs_cudagraphs_without_fsdp2(extra, capsys):
    with pytest.raises(SystemExit):
        distributed_bench.parse_args(f"--size tiny --backend twinkle --persistent-grads {extra}".split())
    assert "--persistent-grads is how --cudagraphs runs keep gradients" in capsys.readouterr().err


def test_fsdp2_cudagraphs_refuse_accumulation(capsys):
    """Between FSDP2 micro-steps each unsharded parameter keeps its gradient, the backward graph's output:
    the next replay would overwrite it."""
    with pytest.raises(SystemExit):
        distributed_bench.parse_args("--size tiny --parallel fsdp2 --regional --cudagraphs --accum 2".split())
    assert "--cudagraphs with FSDP2 and --accum" in capsys.readouterr().err
    args = distributed_bench.parse_args("--size tiny --parallel fsdp2 --regional --cudagraphs".split())
    assert args.cudagraphs and not distributed_bench.persistent_grads(args)
