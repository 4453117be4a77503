"""torchrun target of test_tied_embedding.py: tied_embedding_ddp against plain DDP on 2 gloo processes.

Every case builds the same model twice (same seed), wraps one copy in DistributedDataParallel and the
other in tied_embedding_ddp, runs the same per-rank inputs through both and records, per case, the
largest gradient difference over all parameters (and over the tied weight alone), the reduction's
counters and any error. Rank 0 writes ``{case: {...}}`` to the JSON path given.

Usage: python -m torch.distributed.run --nproc_per_node 2 tied_runs.py OUT.json [cuda]
(``cuda``: NCCL, one GPU per rank, the asynchronous all-reduce on NCCL's stream; default gloo on CPU)
"""

import contextlib
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dist_launch import run_cases  # noqa: E402  (this folder is the script's: first on sys.path)
from twinkle_fx.distributed import tied_embedding_ddp  # noqa: E402

VOCAB = 61
DEVICE = torch.device("cpu")  # main() sets this rank's GPU with ``cuda``


def qwen2(seed: int) -> nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
                         max_position_embeddings=64, attn_implementation="sdpa", use_cache=False)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).to(DEVICE).train()


class PaddedLM(nn.Module):
    """Not a Hugging Face model: an embedding with a padding row, tied to a bias-free projection."""

    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(VOCAB, 12, padding_idx=0)
        self.mix = nn.Linear(12, 12)
        self.out = nn.Linear(12, VOCAB, bias=False)
        self.out.weight = self.embed.weight
        self.to(DEVICE)

    def forward(self, input_ids, labels):
        logits = self.out(torch.tanh(self.mix(self.embed(input_ids))))
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def loss_of(model_out) -> torch.Tensor:
    return model_out if torch.is_tensor(model_out) else model_out.loss


def inputs(rank: int, micro: int, with_padding: bool = False) -> dict:
    """Different shapes on the two ranks (2 × 7 and 1 × 5 tokens), so the exchanged row counts differ and
    rank 1's rows are padded (token 0, zero rows) to rank 0's. Without the padding row, token 0 is a real
    token of rank 0 (its gradient must survive beside the padding); with it, every sequence starts with it."""
    generator = torch.Generator().manual_seed(100 * rank + micro)
    rows, seq = (2, 7) if rank == 0 else (1, 5)
    ids = torch.randint(1 if not with_padding else 0, VOCAB, (rows, seq), generator=generator)
    if with_padding:
        ids[:, 0] = 0
    elif rank == 0:
        ids[1, 2] = 0
    return {"input_ids": ids.to(DEVICE), "labels": ids.to(DEVICE)}


def step(wrapped, rank: int, micros: int, with_padding: bool, forwards: int = 1) -> None:
    for micro in range(micros):
        sync = micro == micros - 1
        with contextlib.nullcontext() if sync else wrapped.no_sync():
            loss = sum(loss_of(wrapped(**inputs(rank, micro * forwards + f, with_padding))) for f in range(forwards))
            loss.backward()


def compare(build, rank: int, micros: int = 1, with_padding: bool = False, forwards: int = 1,
            preset_grads: bool = False, compile_root: str | None = None) -> dict:
    plain_model, tied_model = build(0), build(0)
    plain = DistributedDataParallel(plain_model)
    tied = tied_embedding_ddp(tied_model)
    reduction = tied.tied_embedding_reduction
    if compile_root:
        tied = torch.compile(tied, backend=compile_root)
    if preset_grads:  # as with CUDA graphs: persistent .grad buffers, zeroed in place
        for p in [*plain_model.parameters(), *tied_model.parameters()]:
            p.grad = torch.zeros_like(p)
    step(plain, rank, micros, with_padding, forwards)
    step(tied, rank, micros, with_padding, forwards)
    named = dict(tied_model.named_parameters())
    diffs = {n: (p.grad - named[n].grad).abs().max().item() for n, p in plain_model.named_parameters()}
    tied_name = next(n for n, p in tied_model.named_parameters() if p is reduction.weight)
    # the ranks agree on the tied gradient (DDP's contract)
    agree = reduction.weight.grad.clone()
    dist.broadcast(agree, 0)
    return {"max_diff": max(diffs.values()), "tied_diff": diffs[tied_name],
            "ranks_differ": (agree - reduction.weight.grad).abs().max().item(),
            "grad_norm": reduction.weight.grad.norm().item(), "stats": dict(reduction.stats)}


def stray(rank: int) -> dict:
    model = qwen2(0)
    tied = tied_embedding_ddp(model)
    embeds = model.get_input_embeddings()(inputs(rank, 0)["input_ids"])  # outside the model's forward
    try:
        tied(inputs_embeds=embeds, labels=inputs(rank, 0)["labels"]).loss.backward()
    except RuntimeError as error:
        return {"error": str(error)}
    return {"error": None}


def untied(rank: int) -> dict:
    model = PaddedLM(0)
    model.out.weight = nn.Parameter(model.embed.weight.detach().clone())
    wrapped = tied_embedding_ddp(model)
    return {"plain_ddp": type(wrapped) is DistributedDataParallel,
            "has_reduction": hasattr(wrapped, "tied_embedding_reduction")}


def refused(rank: int) -> dict:
    """An embedding whose gradient is not the rows of its lookups (max_norm): refused before DDP is
    told to leave the weight out, so a plain DDP built next still reduces it."""
    model = PaddedLM(0)
    model.embed.max_norm = 1.0
    try:
        tied_embedding_ddp(model)
    except ValueError as error:
        message = str(error)
    else:
        message = None
    return {"error": message, "ignored": getattr(model, "_ddp_params_and_buffers_to_ignore", None)}


def no_grad_eval(rank: int) -> dict:
    model = qwen2(0)
    tied = tied_embedding_ddp(model)
    with torch.no_grad():
        logits = tied(input_ids=inputs(rank, 0)["input_ids"]).logits
    reference = model.lm_head.weight
    return {"finite": bool(torch.isfinite(logits).all()),
            "weights_restored": model.model.embed_tokens.weight is reference
            and isinstance(reference, nn.Parameter)}


def removed(rank: int) -> dict:
    """After remove(): no hooks (a direct use of the embedding is no longer refused), and a new DDP
    built on the model reduces the weight itself again."""
    model = qwen2(0)
    tied_embedding_ddp(model).tied_embedding_reduction.remove()
    model.get_input_embeddings()(inputs(rank, 0)["input_ids"]).sum().backward()
    ignored = getattr(model, "_ddp_params_and_buffers_to_ignore", None)
    reduced_by_ddp = DistributedDataParallel(model)._module_parameters  # what its buckets hold
    return {"ignored": ignored, "local_grad": model.get_input_embeddings().weight.grad is not None,
            "plain_ddp_covers_it": any(p is model.lm_head.weight for p in reduced_by_ddp)}


def compiled_root(rank: int) -> dict:
    """torch.compile of the whole DDP module, 3 accumulation windows of 2 micro-steps: gradients and
    how often Dynamo compiled (a fresh head-weight tensor every step must not recompile)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    result = compare(qwen2, rank, micros=2, compile_root="aot_eager")
    result["frames"] = dict(counters["frames"])
    result["recompiles"] = sum(counters["recompiles"].values()) if "recompiles" in counters else 0
    torch._dynamo.reset()
    return result


def main() -> None:
    global DEVICE
    out, *device = sys.argv[1:]
    if device == ["cuda"]:
        DEVICE = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(DEVICE)
        dist.init_process_group("nccl", device_id=DEVICE)
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    cases = {
        "sync": lambda: compare(qwen2, rank),
        "accumulation": lambda: compare(qwen2, rank, micros=3),
        "preset_grads_accumulation": lambda: compare(qwen2, rank, micros=2, preset_grads=True),
        "two_forwards": lambda: compare(qwen2, rank, forwards=2),
        "padding_not_hf": lambda: compare(PaddedLM, rank, micros=2, with_padding=True),
        "stray": lambda: stray(rank),
        "untied": lambda: untied(rank),
        "refused": lambda: refused(rank),
        "no_grad_eval": lambda: no_grad_eval(rank),
        "removed": lambda: removed(rank),
        "compiled_root": lambda: compiled_root(rank),
    }
    run_cases(out, rank, cases)


if __name__ == "__main__":
    main()
