"""Regional compilation under DistributedDataParallel (a world of one: gloo on the CPU, NCCL on a GPU),
and the CUDA-graph gradients of twinkle_fx.bench.distributed (GPU)."""

from __future__ import annotations


import pytest
import torch
import torch._dynamo.config as dynamo_config
from torch.nn.parallel import DistributedDataParallel as DDP

import twinkle_fx.bench.distributed as distributed_bench


def _step_under_ddp(device: str, compile_layers_of) -> tuple:
    """One forward and backward of the 'small' Qwen2 (3 MB of MLP weights a layer: more than DDP's 1 MB
    first bucket) under DDP, its layers compiled by ``compile_layers_of(model)``: the compile report and
    the gradients."""
    import twinkle_fx
    from twinkle_fx.builtin import use_builtin_kernels
    from twinkle_fx.compiler import collect_reports

    torch._dynamo.reset()
    with twinkle_fx.scoped_registry(), collect_reports() as report:
        use_builtin_kernels(devices=(device,), models=("qwen2",))
        model = distributed_bench.build_model("qwen2", "small", torch.float32, torch.device(device), 0)
        compile_layers_of(model)
        ddp = DDP(model, device_ids=[0] if device == "cuda" else None)
        ids = torch.arange(16, device=device).unsqueeze(0)
        ddp(input_ids=ids, labels=ids).loss.backward()
        twinkle_fx.undo_kernelize(model)
    torch._dynamo.reset()
    return report, {name: p.grad for name, p in model.named_parameters()}


def test_compile_layers_keeps_each_layer_one_graph_under_ddp(world_of_one, device):
    """DDPOptimizer splits each layer compiled by nn.Module.compile at its 1 MB first bucket (the control);
    compile_layers keeps every layer one graph with the same gradients, and leaves the setting as it was."""
    from twinkle_fx.compiler import compile_layers

    options = {"compiler": "eager"}

    def plain(model):
        for layer in model.model.layers:
            layer.compile(backend="twinkle", options=options)

    split, split_grads = _step_under_ddp(device, plain)
    whole, whole_grads = _step_under_ddp(
        device, lambda model: compile_layers(model, layers=model.model.layers, options=options, fused_loss=False))
    assert split.graph_count >= 2, split.summary()
    assert whole.graph_count == 1, whole.summary()
    assert not any("bucket boundary" in str(r.reason) for r in whole.not_swapped), whole.summary()
    assert dynamo_config.optimize_ddp is True
    assert split_grads.keys() == whole_grads.keys()
    for name, grad in whole_grads.items():
        torch.testing.assert_close(grad, split_grads[name], msg=name)


@pytest.mark.gpu
def test_cudagraph_gradients_handed_over_or_kept_train_alike():
    """--cudagraphs on one GPU: without accumulation the backward's gradients are taken as they are
    (no buffer, no add per parameter); with --persistent-grads or --accum each parameter keeps a
    buffer zeroed in place. All train to the losses of the eager run."""
    common = "--size tiny --batch 2 --seq 64 --steps 4 --dtype fp32 --parallel none"
    device = torch.device("cuda")

    def losses(flags: str) -> list[float]:
        return distributed_bench.train(distributed_bench.parse_args(f"{common} {flags}".split()), 0, 1, device).losses

    reference = losses("--backend eager")
    handed_over = losses("--backend twinkle --regional --cudagraphs")
    kept = losses("--backend twinkle --regional --cudagraphs --persistent-grads")
    assert len(set(reference)) == len(reference)
    assert handed_over == pytest.approx(reference, abs=2e-3) and kept == pytest.approx(handed_over, abs=1e-5)
    accum = "--batch 1 --accum 2"
    assert losses(f"--backend twinkle --regional --cudagraphs {accum}") == pytest.approx(
        losses(f"--backend eager {accum}"), abs=2e-3)
