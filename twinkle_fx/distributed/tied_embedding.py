"""DDP for a model whose LM head shares its weight with the input embedding (``tie_word_embeddings``).

Under plain ``DistributedDataParallel`` the tied weight (vocab × hidden: 272 MB in bf16 for Qwen2-0.5B)
gets its gradient from two places: the head, first thing in the backward, and the embedding lookup,
the very last. Autograd sums both before the weight's gradient is ready, so DDP can all-reduce that
bucket only after the whole backward, with nothing left to overlap it with.

:func:`tied_embedding_ddp` wraps the model in DDP without that weight and reduces its gradient itself,
in two parts whose sum is DDP's result:

- the head's part, dense, is all-reduced asynchronously as soon as the head's backward produces it,
  so it travels while the decoder layers run their backward;
- the embedding's part is non-zero only on the rows of the tokens in the batch: at the end of the
  backward the ranks all-gather those token ids and their gradient rows (tokens × hidden, a few MB),
  and each rank adds the rows up (in fp32, once per distinct token) into the reduced head gradient.

Gradient accumulation works as with DDP: in ``ddp.no_sync()`` both parts stay on the rank (the head's
in a buffer, the embedding's as rows) and the step that synchronises reduces everything.

It composes with the ways twinkle_fx runs a model: kernelized, decoder layers compiled
(``twinkle_fx.compiler.compile_layers``, the recommended recipe under DDP), or compiled
whole, where the hooks below run eagerly between graphs (the embedding and the root's entry and exit
break the graph: three graphs instead of one).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..core.torch_internals import ddp_ignore, ddp_ignored_names, queue_backward_callback, set_ddp_ignored_names

logger = logging.getLogger(__name__)

# torch 2.13 renamed all_gather_into_tensor (which now warns); 2.11 has only the old name
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def tied_embedding_ddp(model: nn.Module, **ddp_kwargs: Any) -> nn.Module:
    """``DistributedDataParallel(model, **ddp_kwargs)`` with the tied embedding / LM-head weight reduced early.

    The weight is left out of DDP's buckets (``DistributedDataParallel._set_params_and_buffers_to_ignore_for_model``);
    rank 0's copy of it is broadcast as DDP does for the others. The handle that does the reduction is
    ``ddp.tied_embedding_reduction`` (``remove()`` takes its hooks off the model). A model without a
    tied pair gets plain DDP, with a warning.

    Example (2 processes under ``torchrun``; the decoder layers compiled, the root eager)::

        model = compile_layers(Qwen2ForCausalLM.from_pretrained(name).cuda())   # twinkle_fx.compiler
        ddp = tied_embedding_ddp(model, device_ids=[rank], bucket_cap_mb=100)
        loss = ddp(input_ids=ids, labels=ids).loss
        loss.backward()          # the head's gradient is on the wire while the layers run backward
    """
    from torch.nn.parallel import DistributedDataParallel

    pair = find_tied_pair(model)
    if pair is None:
        logger.warning("tied_embedding_ddp: %s has no input embedding sharing its weight with an output "
                       "projection; plain DistributedDataParallel", type(model).__name__)
        return DistributedDataParallel(model, **ddp_kwargs)
    embedding, head = pair
    _check_supported(embedding)  # before DDP is told to leave the weight alone: a refusal leaves no trace
    names = [n for n, p in model.named_parameters(remove_duplicate=False) if p is embedding.weight]
    before = ddp_ignored_names(model)
    ddp_ignore(model, sorted(set(before or ()) | set(names)))
    ddp = DistributedDataParallel(model, **ddp_kwargs)
    ddp.tied_embedding_reduction = TiedEmbeddingReduction(model, embedding, head, ddp, ignored_before=before)
    return ddp


def find_tied_pair(model: nn.Module) -> tuple[nn.Embedding, nn.Module] | None:
    """The input embedding and the output projection that share one weight, or ``None``.

    Hugging Face models say which they are (``get_input_embeddings`` / ``get_output_embeddings``);
    otherwise the first ``nn.Embedding`` whose weight another submodule also holds as ``weight``.
    """
    getters = getattr(model, "get_input_embeddings", None), getattr(model, "get_output_embeddings", None)
    if all(callable(g) for g in getters):
        embedding, head = (g() for g in getters)
        tied = head is not None and getattr(head, "weight", None) is getattr(embedding, "weight", False)
        if isinstance(embedding, nn.Embedding) and tied:
            return embedding, head
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    for embedding in embeddings:
        for module in model.modules():
            if module is not embedding and module._parameters.get("weight") is embedding.weight:
                return embedding, module
    return None


def _check_supported(embedding: nn.Embedding) -> None:
    unsupported = [name for name in ("max_norm", "scale_grad_by_freq", "sparse") if getattr(embedding, name)]
    if unsupported:
        raise ValueError(f"tied_embedding_ddp: the embedding {type(embedding).__name__} sets "
                         f"{', '.join(unsupported)}; its gradient is then not the rows of its lookups. "
                         "Use DistributedDataParallel directly")
    if type(embedding.weight).__name__ == "DTensor":
        raise ValueError("tied_embedding_ddp: the tied weight is a DTensor (FSDP2 or tensor parallel); it "
                         "reduces a plain DDP replica's gradient")


@dataclass
class _Window:
    """What one accumulation window (the backward passes up to the one that synchronises) has produced."""

    head_local: Tensor | None = None              # the head's gradient summed over no_sync micro-steps
    in_flight: list[tuple[Tensor, Any]] = field(default_factory=list)  # (tensor, all_reduce work), pre-divided
    ids: list[Tensor] = field(default_factory=list)    # token ids of every embedding lookup
    rows: list[Tensor] = field(default_factory=list)   # their gradient rows (ids.numel() × hidden)
    finalize_queued: bool = False


class TiedEmbeddingReduction:
    """The hooks of :func:`tied_embedding_ddp` on one model (it builds this, after its checks, as
    ``ddp.tied_embedding_reduction``); ``remove()`` takes them off."""

    def __init__(self, model: nn.Module, embedding: nn.Embedding, head: nn.Module, ddp: nn.Module,
                 ignored_before: list[str] | None = None):
        weight = embedding.weight
        self.model, self.embedding, self.head, self.weight = model, embedding, head, weight
        self.ddp, self._ignored_before = ddp, ignored_before
        self.group = getattr(ddp, "process_group", None)
        self.world = dist.get_world_size(self.group)
        self.window = _Window()
        self.active = False  # between the root's pre-hook and its post-hook, while building a graph
        self.sync = True
        self.stats = {"early_reductions": 0, "finalized": 0, "rows_exchanged": 0}
        with torch.no_grad():
            dist.broadcast(weight, src=dist.get_global_rank(self.group, 0) if self.group else 0, group=self.group)
        eager = torch.compiler.disable  # a compiled root calls them as they are (one graph break each)
        self._handles = [
            model.register_forward_pre_hook(eager(self._enter), with_kwargs=True),
            model.register_forward_hook(eager(self._leave), always_call=True),
            embedding.register_forward_hook(eager(self._embedding_output), with_kwargs=True),
            weight.register_hook(self._stray_gradient),
        ]

    def remove(self) -> None:
        """Take the hooks off, and give DDP back the weight for the next wrapper built on this model
        (the one built already keeps it out of its buckets: rebuild it to train on)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        set_ddp_ignored_names(self.model, self._ignored_before)

    # ---- forward: route the two uses of the weight through the functions below
    def _enter(self, module, args, kwargs):
        if not (torch.is_grad_enabled() and self.weight.requires_grad):
            return None
        self.active = True
        self.sync = bool(getattr(self.ddp, "require_backward_grad_sync", True))  # False inside ddp.no_sync()
        # the head reads the weight through _HeadWeight; the lookup reads a detached copy and
        # _EmbeddingRows gives the weight its (sparse) part
        self.head._parameters["weight"] = _HeadWeight.apply(self.weight, self)
        self.embedding._parameters["weight"] = self.weight.detach()
        return None

    def _leave(self, module, args, output):
        if self.active:
            self.head._parameters["weight"] = self.weight
            self.embedding._parameters["weight"] = self.weight
            self.active = False
        return None

    def _embedding_output(self, module, args, kwargs, output):
        if not self.active:
            return None
        ids = args[0] if args else kwargs["input"]
        return _EmbeddingRows.apply(output, ids, self.weight, self)

    # ---- backward
    def _stray_gradient(self, grad: Tensor | None) -> None:
        # the functions below hand the weight no gradient: one that arrives comes from a use of the
        # embedding or the head outside the model's forward, which no rank would reduce
        if grad is not None:  # DDP itself cannot go on after a backward that stopped: no state to clean up
            raise RuntimeError(
                f"tied_embedding_ddp: the tied weight ({type(self.embedding).__name__} / {type(self.head).__name__}) "
                f"received a gradient from a use outside {type(self.model).__name__}.forward (the embedding or "
                "the head called directly);\nDDP does not reduce this weight, so that gradient would differ "
                "between ranks. Call the model (through DDP) instead, or wrap it in DistributedDataParallel")

    def _queue_finalize(self) -> None:
        """At the end of this backward (one that synchronises: the callers check), reduce what is left."""
        if not self.window.finalize_queued:
            self.window.finalize_queued = True
            queue_backward_callback(self._finalize)

    def head_grad(self, grad: Tensor, sync: bool) -> None:
        grad = grad.detach()
        window = self.window
        if window.head_local is not None:
            grad = window.head_local.add_(grad)
            window.head_local = None
        if not sync:
            window.head_local = grad if grad.is_contiguous() else grad.contiguous()
            return
        grad = grad.div(self.world)  # DDP's default: divide by the world size, then sum
        work = dist.all_reduce(grad, group=self.group, async_op=True)
        window.in_flight.append((grad, work))
        self.stats["early_reductions"] += 1
        self._queue_finalize()

    def embedding_rows(self, ids: Tensor, rows: Tensor, sync: bool) -> None:
        padding = self.embedding.padding_idx
        ids = ids.reshape(-1)
        rows = rows.detach().reshape(ids.numel(), -1)
        if padding is not None:
            rows = rows.masked_fill((ids == padding).unsqueeze(1), 0)
        self.window.ids.append(ids)
        self.window.rows.append(rows)
        if sync:
            self._queue_finalize()

    def _finalize(self) -> None:
        """After the backward that synchronises: sum both parts over the ranks into ``weight.grad``."""
        window, self.window = self.window, _Window()
        grad = None
        if window.head_local is not None:  # a head gradient from no_sync steps, none in this one
            grad = window.head_local.div_(self.world)
            dist.all_reduce(grad, group=self.group)
        for tensor, work in window.in_flight:
            work.wait()
            grad = tensor if grad is None else grad.add_(tensor)
        if grad is None:
            grad = torch.zeros_like(self.weight)
        self._add_embedding_rows(grad, window)
        self.stats["finalized"] += 1
        if self.weight.grad is None:
            self.weight.grad = grad
        else:
            self.weight.grad.add_(grad)

    def _add_embedding_rows(self, grad: Tensor, window: _Window) -> None:
        """Every rank takes part (the counts tell all of them whether there is anything to exchange)."""
        device, hidden = self.weight.device, self.weight.shape[1]
        ids = torch.cat(window.ids) if window.ids else torch.empty(0, dtype=torch.long, device=device)
        rows = torch.cat(window.rows) if window.rows else grad.new_zeros(0, hidden)
        ids, rows = ids.to(device=device, dtype=torch.long), rows.to(grad.dtype)
        counts = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(self.world)]
        dist.all_gather(counts, torch.tensor([ids.numel()], device=device), group=self.group)
        counts = [int(c.item()) for c in counts]
        longest = max(counts)
        if longest == 0:  # no lookup on any rank (inputs_embeds): the head's part is all there is
            return
        padded_ids = ids.new_zeros(longest)
        padded_ids[:ids.numel()] = ids
        padded_rows = rows.new_zeros(longest, hidden)
        padded_rows[:rows.shape[0]] = rows
        all_ids = ids.new_empty(self.world * longest)
        all_rows = rows.new_empty(self.world * longest, hidden)
        _all_gather_single(all_ids, padded_ids, group=self.group)
        _all_gather_single(all_rows, padded_rows, group=self.group)
        keep = torch.cat([torch.arange(longest, device=device) < n for n in counts])
        all_ids, all_rows = all_ids[keep], all_rows[keep]
        distinct, inverse = torch.unique(all_ids, return_inverse=True)
        sums = torch.zeros(distinct.numel(), hidden, dtype=torch.float32, device=device)
        sums.index_add_(0, inverse, all_rows.float())
        grad[distinct] = (grad[distinct].float() + sums / self.world).to(grad.dtype)
        self.stats["rows_exchanged"] += int(all_ids.numel())


class _HeadWeight(torch.autograd.Function):
    """The tied weight as the head sees it: identity forward; backward hands the head's gradient to the
    reduction (all-reduced at once when this step synchronises) and gives autograd none."""

    @staticmethod
    def forward(ctx, weight: Tensor, reduction: TiedEmbeddingReduction) -> Tensor:
        ctx.reduction, ctx.sync = reduction, reduction.sync
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad: Tensor):
        ctx.reduction.head_grad(grad, ctx.sync)
        return None, None


class _EmbeddingRows(torch.autograd.Function):
    """The embedding lookup's output (computed from a detached weight): identity forward; backward
    keeps the gradient rows of the looked-up ids for the reduction and passes nothing to the weight."""

    @staticmethod
    def forward(ctx, output: Tensor, ids: Tensor, weight: Tensor, reduction: TiedEmbeddingReduction) -> Tensor:
        ctx.reduction, ctx.sync = reduction, reduction.sync
        ctx.save_for_backward(ids)
        return output.view_as(output)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (ids,) = ctx.saved_tensors
        ctx.reduction.embedding_rows(ids, grad, ctx.sync)
        return None, None, None, None
