"""Train a Hugging Face causal LM on several GPUs with DDP or FSDP2 and the twinkle_fx kernels.

    torchrun --nproc_per_node 2 examples/train_distributed.py --model Qwen/Qwen2.5-3B --parallel fsdp2
    torchrun --nproc_per_node 2 examples/train_distributed.py --tiny      # CPU processes (gloo), a tiny Llama
    # HSDP on 2 hosts of 8 GPUs: run on each host (HEAD: the first host's address)
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HEAD:29500 --rdzv-id run1 \
        examples/train_distributed.py --model Qwen/Qwen2.5-3B --parallel fsdp2 --replicate 2

The built-in kernels of the model's family (norms, MLP, rotary embedding, fused LM-head loss) are bound, then
every decoder layer is compiled with ``backend="twinkle"`` (``compile_layers``: one graph the layers share)
before DDP or ``fully_shard`` wraps the model. FSDP2 shards two decoder layers per unit (half the per-unit host work
FSDP2 does in every step) and, on GPUs, moves its all-gathers and reduce-scatters with the copy engines
(``use_copy_engine_collectives``: no SM taken from the GEMMs; ``--nccl-collectives`` keeps NCCL's). ``--replicate N`` runs FSDP2 on a 2-D device mesh (HSDP): N replicas of
world/N ranks each, the parameters sharded within a replica and replicated across replicas; with N the number of
hosts, the all-gathers and reduce-scatters stay on each host's fast links and only one all-reduce of the gradient
shards crosses hosts. The steps train on random tokens; put your data loader there.
The benchmark behind the measured numbers is ``python -m twinkle_fx.bench.distributed`` (docs/distributed.md).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist

if not torch.cuda.is_available():
    # no GPU: the Triton kernels run through the interpreter (set before triton.jit runs)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402

from twinkle_fx.builtin import BUILTIN_MODELS, use_builtin_kernels  # noqa: E402
from twinkle_fx.compiler import compile_layers, repeated_layers  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Qwen/Qwen2.5-0.5B", help="a Hugging Face causal-LM name or path")
    parser.add_argument("--tiny", action="store_true", help="a tiny random Llama instead of --model (no download)")
    parser.add_argument("--parallel", choices=("ddp", "fsdp2"), default="fsdp2")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=None, help="sequences per GPU (default 4; 2 with --tiny)")
    parser.add_argument("--seq", type=int, default=None, help="tokens per sequence (default 1024; 16 with --tiny)")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--replicate", type=int, default=1, metavar="N",
                        help="FSDP2 only: HSDP with N replicas (the number of hosts), each sharding over world/N ranks")
    parser.add_argument("--nccl-collectives", action="store_true",
                        help="FSDP2 on GPUs: keep NCCL's all-gathers and reduce-scatters instead of the copy engines'")
    return parser.parse_args()


def load_model(args: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if not args.tiny:
        return AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(device)
    config = LlamaConfig(hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=256, tie_word_embeddings=True)
    torch.manual_seed(0)  # every rank starts from the same weights
    return AutoModelForCausalLM.from_config(config, dtype=dtype).to(device)


def main() -> None:
    args = parse_args()
    batch, seq = args.batch or (2 if args.tiny else 4), args.seq or (16 if args.tiny else 1024)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.replicate != 1 and (args.parallel != "fsdp2" or args.replicate < 1 or world % args.replicate):
        raise SystemExit(f"--replicate {args.replicate}: HSDP needs --parallel fsdp2 and a divisor of the {world} "
                         "processes (the number of hosts, each running the same --nproc-per-node)")

    model = load_model(args, device).train()
    # the built-in kernels of the model's family (a family is found by its config's model_type: gemma3 -> gemma3_text)
    family = next((name for name, f in BUILTIN_MODELS.items() if f.model_type == model.config.model_type), None)
    if family is not None:
        use_builtin_kernels(devices=(device.type,), models=(family,))
    elif rank == 0:
        print(f"no built-in kernels for model_type {model.config.model_type!r}: the layers are compiled as they are")
    layers = repeated_layers(model)
    # Inductor on a GPU; on the CPU aot_eager (Inductor's C++ build takes minutes on a few cores)
    compile_layers(model, layers=layers, options={"compiler": "inductor" if cuda else "aot_eager"})
    if args.parallel == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        # (replicate, shard): ranks fill the mesh row by row and torchrun numbers them host by host, so each
        # shard group is one host's processes; without replicas, a 1-D mesh (no all-reduce across replicas)
        if args.replicate > 1:
            mesh = init_device_mesh(device.type, (args.replicate, world // args.replicate),
                                    mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("shard",))
        for first in range(0, len(layers), 2):  # one all-gather / reduce-scatter per two decoder layers
            fully_shard(layers[first:first + 2], mesh=mesh)
        wrapped = fully_shard(model, mesh=mesh)  # the rest (embedding, final norm, head) on the root
        if cuda and not args.nccl_collectives:
            from twinkle_fx.distributed import use_copy_engine_collectives

            use_copy_engine_collectives(wrapped)  # the shard groups are one host's GPUs (HSDP: replicas across)
    else:
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    # fused: one kernel set for the whole update (FSDP2: on each rank's shards)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=cuda)

    generator = torch.Generator().manual_seed(1000 + rank)  # each rank its own data
    for step in range(args.steps):
        input_ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=generator).to(device)
        start = time.perf_counter()
        loss = wrapped(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mean = loss.detach().float()
        dist.all_reduce(mean)  # a sum: gloo has no average
        mean = mean.item() / world  # waits for the step to finish
        elapsed = time.perf_counter() - start
        if rank == 0:
            print(f"step {step}  loss {mean:.4f}  {batch * seq * world / elapsed:,.0f} tokens/s", flush=True)
    dist.barrier()  # no rank tears its connections down while another still uses them
    # DDP's reducer holds the process group and frees it holding the GIL: if it drops the last reference, gloo's
    # destructor waits for a worker thread that needs the GIL to release a tensor (a hang at exit). Freed first,
    # the group's last reference goes in destroy_process_group, which releases the GIL.
    del wrapped
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
