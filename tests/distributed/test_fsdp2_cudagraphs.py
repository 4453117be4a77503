"""FSDP2 with each decoder layer replayed as CUDA graphs (twinkle_fx.bench.distributed --parallel fsdp2
--regional --cudagraphs), in a world of one over NCCL."""

from __future__ import annotations

import re

import pytest
import torch

import twinkle_fx.bench.distributed as distributed_bench
from twinkle_fx.bench.distributed_models import MODELS

LAYERS = MODELS["qwen2"].sizes["tiny"]["num_hidden_layers"]


@pytest.mark.gpu
@pytest.mark.parametrize("compiled", ["--regional", "--regional --no-reshard-after-forward", ""])
def test_fsdp2_layers_replay_cuda_graphs_and_train_alike(compiled, world_of_one):
    """FSDP2 frees each layer's gathered parameters after its backward (and, by default, after its
    forward) and gathers them again into new memory: the graphs replay without re-recording only because
    the parameters are copied in. Every compiled function is recorded, none re-recorded (regional: each
    layer's forward and backward once), and the run trains to the losses of the same run without CUDA
    graphs. Whole-model compilation ends a graph at each fully_shard module's hooks (not measured for
    speed: `tools/gpu.sh distributed` runs the regional forms)."""
    common = f"--size tiny --batch 2 --seq 64 --steps 5 --dtype fp32 --parallel fsdp2 --backend twinkle {compiled}"
    device = torch.device("cuda", torch.cuda.current_device())

    def run(flags: str) -> distributed_bench.RunResult:
        return distributed_bench.train(distributed_bench.parse_args(f"{common} {flags}".split()), 0, 1, device)

    plain, graphs = run(""), run("--cudagraphs")
    assert len(set(plain.losses)) == len(plain.losses)
    assert graphs.losses == pytest.approx(plain.losses, abs=2e-3)
    (summary,) = graphs.cudagraphs
    # "... recorded (6 forward, 6 backward, 2 inference); ...": the whole model adds pieces without gradients
    recorded = re.search(r"(\d+) CUDA graph\(s\) recorded \((\d+) forward, (\d+) backward[,)]", summary)
    assert recorded, summary
    assert summary.endswith("; 0 re-recording(s)"), summary
    if compiled.startswith("--regional"):
        assert "every compiled function recorded" in summary, summary
        assert (int(recorded[2]), int(recorded[3])) == (LAYERS, LAYERS), summary
    else:  # the pieces between the hooks: at least one per layer
        assert int(recorded[2]) >= LAYERS and int(recorded[3]) >= LAYERS, summary


@pytest.mark.parametrize("sharded", [True, False])
def test_only_fsdp_managed_parameters_are_unpinned(sharded, world_of_one, device):
    """Dynamo marks every parameter of a compiled layer a static input; under fully_shard those are the
    gathered parameters, which unpin_fsdp_parameters hands to CUDA graphs as ordinary inputs. A layer
    outside FSDP2 keeps all of its marks."""
    from torch.distributed.fsdp import fully_shard

    from twinkle_fx.compiler.inner.inductor_options import unpin_fsdp_parameters

    torch._dynamo.reset()
    model = distributed_bench.build_model("qwen2", "tiny", torch.float32, torch.device(device), 0)
    layer = model.model.layers[0]
    if sharded:
        fully_shard(layer)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    layer.compile(backend=backend)
    ids = torch.randint(0, model.config.vocab_size, (1, 8), device=device)
    hidden = model.model.embed_tokens(ids)
    positions = torch.arange(8, device=device)[None]
    layer(hidden, position_embeddings=model.model.rotary_emb(hidden, positions)).sum().backward()
    (gm,) = [g for g in graphs if any(n.op == "call_function" for n in g.graph.nodes)]
    static = [n for n in gm.graph.find_nodes(op="placeholder")
              if "_dynamo_static_input_type" in (n.meta.get("tensor_dict") or {})]
    parameters = len(list(layer.parameters()))
    assert len(static) == parameters
    assert unpin_fsdp_parameters(gm) == (parameters if sharded else 0)
    assert unpin_fsdp_parameters(gm) == 0  # nothing left to unmark
    torch._dynamo.reset()
