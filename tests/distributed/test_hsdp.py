"""HSDP past one host: twinkle_fx.bench.distributed on a 2-D (replicate, shard) mesh, run as 2 "nodes" of 2 CPU
processes each (two torchrun launches joined by a c10d rendezvous on localhost, gloo), against the losses of one
process over the same global batch; and what the mesh and the fully_shard units accept."""

from __future__ import annotations

import json

import pytest
import torch
from dist_launch import launch_nodes

import twinkle_fx.bench.distributed as distributed_bench
from twinkle_fx.bench.distributed_models import build_model
from twinkle_fx.bench.distributed_results import RunResult

STEPS = 3
SHAPE = f"--model llama3b --size tiny --seq 8 --steps {STEPS} --dtype fp32 --backend eager"
# every FSDP2 choice that changes the collectives, on the 2-D mesh: 2 layers per unit, the next unit prefetched,
# the last unit kept gathered from forward to backward, gradients reduced in fp32
KNOBS = "--layers-per-unit 2 --prefetch 1 --reshard-after-forward inner --reduce-dtype fp32"


@pytest.mark.slow
@pytest.mark.interpreter  # its CPU processes run twinkle_triton kernels through the interpreter
def test_hsdp_on_two_nodes_matches_one_process(tmp_path):
    """4 ranks as 2 replicas x 2 shards train to the losses of one process over the 4-row global batch; the
    layers' parameters are replicated across the nodes and sharded within each."""
    single = distributed_bench.train(distributed_bench.parse_args(f"{SHAPE} --parallel none --batch 4".split()),
                                     0, 1, torch.device("cpu"))
    baseline = tmp_path / "single.json"
    baseline.write_text(json.dumps({"runs": [single.to_json()]}))
    out = tmp_path / "hsdp.json"  # both launches name it: rank 0 is on whichever node joined first
    outputs = launch_nodes(["-m", "twinkle_fx.bench.distributed", *SHAPE.split(), "--parallel", "fsdp2", "--batch",
                            "1", "--replicate", "2", *KNOBS.split(), "--baseline", str(baseline), "--out", str(out)],
                           nodes=2, nproc_per_node=2, timeout=240)
    run = json.loads(out.read_text())["runs"][0]
    assert run["world_size"] == 4 and run["args"]["replicate"] == 2
    assert run["sharding"] == "(Replicate(), Shard(dim=0)) on mesh (replicate 2, shard 2)"
    assert len(set(single.losses)) == STEPS  # the model trains: each step's loss differs
    assert run["losses"] == pytest.approx(single.losses, abs=1e-5), (run["losses"], single.losses)
    # rank 0 printed the comparison the tool makes with --baseline
    table = next(text for text in outputs if "| losses vs 1 device" in text)
    assert "fsdp2 x 4 (HSDP: 2 replicas x 2 shards)" in table and "| losses vs 1 device, global batch 4 x 8 |" in table


@pytest.mark.parametrize(("replicate", "world"), [(3, 4), (4, 2)])
def test_replicate_must_divide_the_world(replicate, world):
    args = distributed_bench.parse_args(f"--parallel fsdp2 --replicate {replicate}".split())
    with pytest.raises(ValueError, match=f"--replicate {replicate}: HSDP needs the {world} processes in {replicate} "
                                         f"equal shard groups; give a divisor of {world}"):
        distributed_bench.check_world(args, world)
    distributed_bench.check_world(distributed_bench.parse_args("--parallel fsdp2 --replicate 2".split()), 4)


def test_reshard_group_must_split_the_shard_group():
    """Under HSDP, reshard_after_forward=N reshards within a shard group: N must split the group, not the world."""
    flags = "--parallel fsdp2 --reshard-after-forward 4"
    distributed_bench.check_world(distributed_bench.parse_args(flags.split()), 8)  # a 1-D mesh of 8
    with pytest.raises(ValueError, match=r"must divide the shard group of 4 \(world 8 / --replicate 2\) and lie "
                                         r"between 2 and 3"):
        distributed_bench.check_world(distributed_bench.parse_args(f"{flags} --replicate 2".split()), 8)
    distributed_bench.check_world(distributed_bench.parse_args(f"{flags} --replicate 2".split()), 16)


@pytest.mark.parametrize("flag", ["--replicate 2", "--layers-per-unit 2", "--reduce-dtype fp32",
                                  "--reshard-after-forward inner"])
def test_mesh_and_unit_options_need_fsdp2(flag, capsys):
    with pytest.raises(SystemExit):
        distributed_bench.parse_args(f"--parallel ddp {flag}".split())
    assert "are FSDP2 options: use them with --parallel fsdp2" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--replicate 0", "--layers-per-unit 0", "--layers-per-unit x"])
def test_counts_must_be_positive(flag, capsys):
    with pytest.raises(SystemExit):
        distributed_bench.parse_args(f"--parallel fsdp2 {flag}".split())
    assert "takes a whole number of 1 or more" in capsys.readouterr().err


def test_layers_per_unit_cannot_exceed_the_layers(capsys):
    with pytest.raises(SystemExit):
        distributed_bench.parse_args("--model llama3b --size reference --parallel fsdp2 --layers-per-unit 29".split())
    assert "--layers-per-unit 29: --model llama3b --size reference has 28 decoder layers; give 1 to 28" \
        in capsys.readouterr().err


def test_units_group_consecutive_layers_and_inner_keeps_the_last_gathered(world_of_one):
    """--layers-per-unit 3 on 4 layers: one fully_shard unit of layers 0-2 (gathering one gathers all three)
    and one of layer 3; with --reshard-after-forward inner only the last unit keeps its gathered parameters
    after the forward."""
    from torch.distributed.tensor import DTensor

    args = distributed_bench.parse_args("--model llama3b --parallel fsdp2 --layers-per-unit 3 --prefetch 1 "
                                        "--reshard-after-forward inner".split())
    model = build_model("llama3b", "tiny", torch.float32, torch.device("cpu"), 0)
    distributed_bench.shard_model(model, args, torch.device("cpu"))
    layers = list(model.model.layers)
    assert [len(unit) for unit in distributed_bench.fsdp_units(model, 3)] == [3, 1]

    def gathered(layer) -> bool:
        return not any(isinstance(p, DTensor) for p in layer.parameters())

    layers[0].unshard()
    assert [gathered(layer) for layer in layers] == [True, True, True, False]
    layers[0].reshard()
    ids = torch.arange(8).unsqueeze(0)
    loss = model(input_ids=ids, labels=ids).loss
    assert [gathered(layer) for layer in layers] == [False, False, False, True]
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_reduce_dtype_is_fsdp2s_mixed_precision_policy():
    from torch.distributed.fsdp import MixedPrecisionPolicy

    def policy(flags: str):
        return distributed_bench.mixed_precision(distributed_bench.parse_args(f"--parallel fsdp2 {flags}".split()))

    assert policy("") is None
    assert policy("--reduce-dtype fp32") == MixedPrecisionPolicy(reduce_dtype=torch.float32)
    assert policy("--mixed-precision") == MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    assert policy("--mixed-precision --reduce-dtype bf16") == MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                                 reduce_dtype=torch.bfloat16)


def test_hsdp_choices_name_the_run():
    args = distributed_bench.parse_args(f"--parallel fsdp2 --replicate 2 {KNOBS}".split())
    text = distributed_bench.describe_args(args, 4, torch.device("cpu"))
    assert "fsdp2 x 4 (HSDP: 2 replicas x 2 shards)" in text
    assert ("reshard after forward but the last unit · 2 layers per FSDP unit · reduce in fp32 · prefetch 1 unit(s)"
            in text)
    assert RunResult(vars(args), 4, "cpu", [], [], []).sharding == ""  # a run without FSDP2 names no sharding


@pytest.mark.parametrize(("flags", "rounded"), [("", False), ("--reduce-dtype bf16", True)])
def test_reduce_dtype_sets_the_dtype_gradients_are_reduced_in(world_of_one, flags, rounded):
    """fp32 parameters with --reduce-dtype bf16: the reduced gradients come back as bf16 values (what the
    collective carried), while compute stays fp32; without it they keep fp32's precision."""
    from torch.distributed.tensor import DTensor

    args = distributed_bench.parse_args(f"--model llama3b --parallel fsdp2 {flags}".split())
    model = build_model("llama3b", "tiny", torch.float32, torch.device("cpu"), 0)
    distributed_bench.shard_model(model, args, torch.device("cpu"))
    ids = torch.arange(8).unsqueeze(0)
    model(input_ids=ids, labels=ids).loss.backward()
    grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in model.model.layers.parameters()]
    assert all(g.dtype == torch.float32 for g in grads)
    assert all(torch.equal(g, g.bfloat16().float()) for g in grads) is rounded
