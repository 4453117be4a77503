"""CUDA graphs for the decoder layers of an eager model: ``kernelize_model(model, cuda_graphs=True)``.

An eager training step of a small model is bound by the host: every kernel launch and every
autograd node costs Python and driver time, and a Qwen2-0.5B step at 4 x 1024 keeps the GPU busy
for about 29 ms of an 80-90 ms step (README, Performance). A CUDA graph replays a recorded
sequence of launches with one call, so the host time of a decoder layer becomes a few dozen
microseconds whatever it launches.

What is graphed: each module of the model's repeated block (the classes ``model._no_split_modules``
names, e.g. ``Qwen2DecoderLayer``), forward and (when training) backward, per input signature
(shapes, strides, dtypes, ``requires_grad`` of the tensor arguments, the values of the others).

How (the same construction as ``torch.cuda.make_graphed_callables``, recorded during a real step so
that the capture order is the order of execution):

1. the first pass (a pass starts when the first block is called) of a new signature runs eagerly:
   it compiles the Triton kernels and initialises cuBLAS outside any capture;
2. the second pass records: each block's forward is captured (on static input tensors) and
   replayed; when the backward reaches a block, its backward (``torch.autograd.grad`` of the
   captured forward) is captured and replayed. All graphs of a model share one memory pool, and
   forward activations are freed to the pool when their backward is captured, so later captures
   reuse that memory exactly as an eager step would (peak memory close to eager's);
3. later passes replay: a block copies its inputs into the static ones (nothing is copied when the
   input already is the static tensor, as the previous block's output is), replays the forward
   graph and returns the static outputs; the backward copies the incoming gradient and replays.

Because the graphs share memory, they are replayed only in the order they were captured. Anything
else runs the block's ordinary forward, which is always correct, with the reason counted in
:func:`~.status.graph_status` and logged once:

- a call whose signature or module differs from the recorded sequence (dynamic shapes, a new batch
  size: a new sequence is recorded for up to ``MAX_SEQUENCES`` signatures);
- a pass that starts while the backward of the previous training pass is still outstanding (a
  second forward before ``backward``), or a backward in another order (that block's backward then
  recomputes its forward from the static inputs, like activation checkpointing);
- the CPU, ``torch.compile`` tracing, another CUDA-graph capture in progress, autocast, gradient
  checkpointing, hooks on a block's submodules (a graph would not call them), dropout with p > 0
  while training, arguments that are not tensors, plain values or a static KV cache (below);
- a capture that fails (the error is logged; the signature is not tried again; the ambient stream
  and the CUDA random generator are left as they were before it, see :func:`~twinkle_fx.eager.cuda_graphs.capture.capture`).

Decoding with a KV cache: a transformers ``StaticCache`` (full-attention layers) is accepted as an
argument, by identity: the cache object is part of the signature, and its ``StaticLayer`` tensors
(keys, values and the ``cumulative_length`` counter, allocated at the cache's first update) are read
and written in place by the graphs, like the parameters. ``StaticLayer.update`` only does device
work on those tensors (``index_copy_`` at ``arange(n) + cumulative_length``, then
``cumulative_length.add_(n)``; transformers 5.17 to 5.22), so each replay appends the step's keys and
values where the eager update would. Once per pass (at the first block that gets the cache) the
cache is checked: same object as recorded, layers initialised, data pointers unchanged; ``reset()``
keeps the graphs valid, ``reorder_cache`` (beam search), offloading or ``.to()`` make it re-record.
A pass with a cache not initialised yet (its first update allocates the tensors: the prefill) runs
eagerly, so a decode loop records on its second step with that cache and replays from the third.
A decode step through the model's own forward (as ``generate`` calls it) is one graph of the whole
forward instead (:mod:`twinkle_fx.eager.cuda_graphs.model_graphs`); these per-layer graphs serve it when that
capture fails, and calls of the decoder stack itself. ``generate`` makes a new StaticCache per call
(graphs of caches that no longer exist are dropped), and it compiles the decode forward with
``torch.compile`` on CUDA by default, which runs the model without these graphs: pass
``disable_compile=True``.
Declined, with the reason in :func:`~.status.graph_status`: a ``DynamicCache`` (its update grows the keys
and values with ``torch.cat``: new tensors of a new shape every step, never graphable), quantized
and offloaded caches, a StaticCache with sliding-window or chunked-attention layers (their update
branches on a host-side Python counter a replay would not advance), and a cache while training.
See :func:`static_cache_state`.

What a caller must know: the outputs of a graphed block are its static tensors, overwritten when the
block runs again (the next step), as with ``torch.compile(mode="reduce-overhead")``; a block with
forward hooks (``output_hidden_states``) gets clones instead. Gradients of the block's parameters
are handed to autograd without a copy: ``param.grad`` may be the graph's gradient buffer, valid
until the next forward of the model; when that forward starts, a ``.grad`` still pointing to such a
buffer is moved to its own memory (gradient accumulation stays exact; ``zero_grad(set_to_none=True)``,
the optimizers' default, makes that free). A reference to ``param.grad`` kept elsewhere across
steps would see the buffer change.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ...core.torch_internals import capture_cuda_graph, has_forward_hooks
from .capture import (Decline, block_modules, data_ptr, dropout_reason, fixed_ptrs, flatten_call, global_hooks,
                      hooked, rebuild, rebuild_call, spec_of, static_cache_state, tensor_meta)
from .replay import Pass, Replay, Sequence, Step, Token, copy_inputs
from .status import GraphStatus

logger = logging.getLogger(__name__)

__all__ = ["GraphSet", "block_modules", "static_cache_state", "MAX_SEQUENCES"]

# Distinct call sequences (signatures) recorded per model; all share one memory pool, so the cost of
# another one is its static inputs and outputs, not another copy of the activations.
MAX_SEQUENCES = 8
# Eager passes of a signature before it is recorded (Triton compiles and cuBLAS initialises there).
WARMUP_PASSES = 1


class GraphSet:
    """The CUDA graphs of one model's blocks: one memory pool, the recorded sequences, the current pass."""

    def __init__(self, blocks: list[torch.nn.Module], device: torch.device) -> None:
        self.first = weakref.ref(blocks[0])
        self.block_params = list({id(q): q for b in blocks for q in b.parameters()}.values())
        self.grad_buffers: set[int] = set()  # data pointers of the parameters' gradient buffers of all graphs
        self.device = device
        self._anchor: torch.cuda.CUDAGraph | None = None
        self.pool = None
        self.inside_model_graph = False  # a whole-forward graph is warming up or capturing: blocks run as they are
        self.sequences: dict[tuple, Sequence] = {}
        self.attempts: Counter = Counter()
        self.cache_keys: dict[tuple, tuple[weakref.ref, ...]] = {}  # sequence keys naming KV caches -> the caches
        self.active: Pass | None = None
        self.last_training: Pass | None = None
        self.status = GraphStatus()
        self._logged: set[str] = set()
        # parameters per block, read at its first call and again when it is recorded
        self._params: "weakref.WeakKeyDictionary[torch.nn.Module, list]" = weakref.WeakKeyDictionary()

    # -- bookkeeping -----------------------------------------------------------------------------
    def memory_pool(self) -> Any:
        """The pool every graph of the model captures into."""
        if self.pool is None:
            # The allocator counts a pool's users, and a graph_pool_handle()'s users are only its graphs. When
            # every graph of the pool is dropped (the graphs of a finished generate() call, whose StaticCache
            # died) while a tensor allocated in it lives on, the pool stays with a count of 0 and the next
            # capture into it fails an internal assert ("it->second->use_count > 0",
            # CUDACachingAllocator.cpp, torch 2.11). A one-kernel anchor graph held as long as the pool is
            # keeps one count. (A torch.cuda.MemPool object would too, but its destructor, run by the garbage
            # collector after a failed capture into it, crashed the process.)
            pool = torch.cuda.graph_pool_handle()
            anchor = torch.cuda.CUDAGraph()
            with capture_cuda_graph(anchor, pool):
                torch.zeros(1, device=self.device)
            self._anchor, self.pool = anchor, pool
        return self.pool

    @contextlib.contextmanager
    def capturing(self, graph: torch.cuda.CUDAGraph) -> Iterator[None]:
        """Capture ``graph`` into the pool. A failed capture leaves its pool refusing every later
        capture ("beginAllocateToPool: already recording to mempool_id", torch 2.11, also after the
        allocator's end call); the next capture then takes a new pool (the graphs recorded so far
        keep theirs)."""
        try:
            with capture_cuda_graph(graph, self.memory_pool()):
                yield
        except BaseException:
            self._anchor = self.pool = None
            raise

    @contextlib.contextmanager
    def model_graph_scope(self) -> Iterator[None]:
        """The blocks run as they are (no recording, no replay, nothing counted) inside it."""
        self.inside_model_graph = True
        try:
            yield
        finally:
            self.inside_model_graph = False

    def _eager(self, reason: str) -> None:
        self.status.eager[reason] += 1
        if reason not in self._logged:
            self._logged.add(reason)
            logger.info("CUDA graphs: a block runs without its graph: %s", reason)

    def _begin(self) -> Pass:
        previous = self.active
        if previous is not None and previous.seq is not None and previous.seq.recording:
            seq = previous.seq
            if not seq.steps:
                self._fail(seq, "no block of the pass could be recorded")
            elif not seq.training:
                self._seal(seq)
        new = Pass(self)
        last = self.last_training
        if last is not None and last.pending():
            new.eager = True
            self._eager("a forward started before the backward of the previous training forward ran")
        elif last is not None:
            seq = last.seq
            if seq is not None and seq.recording and seq.failed is None:
                self._fail(seq, "the backward did not reach every recorded block in reverse order")
            self.last_training = None
        if self.grad_buffers:
            self._own_grads()
        self.active = new
        return new

    def _own_grads(self) -> None:
        """A parameter's .grad that still is a graph's gradient buffer (autograd kept it without a
        copy) gets its own memory before any replay: the pool reuses that buffer's memory for other
        graphs' work (forward temporaries, another signature), which would overwrite an
        accumulating gradient."""
        for param in self.block_params:
            grad = param.grad
            if grad is not None and data_ptr(grad) in self.grad_buffers:
                param.grad = grad.clone()

    def _seal(self, seq: Sequence) -> None:
        seq.recording = False
        self.status.sequences += 1
        self.status.steps += len(seq.steps)
        logger.info("CUDA graphs: recorded %d %s block call(s)", len(seq.steps),
                    "training (forward + backward)" if seq.training else "inference")

    def _fail(self, seq: Sequence, reason: str) -> None:
        if seq.failed is None:
            seq.failed = reason
            seq.recording = False
            seq.steps.clear()
            seq.statics.clear()
            seq.sources.clear()
            logger.warning("CUDA graphs: recording failed (%s); retried at most once, else the blocks of "
                           "this signature stay eager", reason)
        for key, value in list(self.sequences.items()):
            if value is seq:
                del self.sequences[key]

    # -- the forward -----------------------------------------------------------------------------
    def call(self, fn: Callable[..., Any], module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
        if self.inside_model_graph:
            return fn(module, *args, **kwargs)
        p = self._begin() if module is self.first() else self.active
        if p is None or p.eager:
            return fn(module, *args, **kwargs)
        try:
            reason = self._static_reason(module)
            if reason is not None:
                raise Decline(reason)
            caches: dict[int, Any] = {}
            tensors, in_spec = flatten_call(args, kwargs, caches)
            params = self._params.get(module)
            if params is None:
                params = self._params[module] = list(module.parameters())
            training = torch.is_grad_enabled() and (any(t.requires_grad for t in tensors)
                                                    or any(q.requires_grad for q in params))
            if caches:
                self._inspect_caches(p, caches, training)
            signature = (training, in_spec, tuple(map(tensor_meta, tensors)))
            step, recording = self._next_step(p, fn, module, signature, in_spec, training, caches)
            if recording:
                try:
                    self._capture_forward(p.seq, step, tensors, caches)
                except Exception as e:  # noqa: BLE001 - logged with the error; the block runs eagerly
                    self._fail(p.seq, f"capturing the forward of {type(module).__name__} raised {e!r}")
                    raise Decline("the capture failed (see the warning)") from e
            else:
                self._check_inputs(p, step, tensors)
        except Decline as e:
            p.eager = True
            self._eager(str(e))
            return fn(module, *args, **kwargs)
        index = p.cursor
        p.cursor += 1
        self.status.replays["forward"] += 1
        if step.training:
            token = Token()
            p.stack.append((index, weakref.ref(token)))
            self.last_training = p
            outs = Replay.apply(self, p, step, token, len(tensors), *tensors, *step.grad_params)
        else:  # nothing requires grad: the copies record no autograd history
            copy_inputs(p, step, tensors)
            step.fwd.replay()
            outs = step.static_out
        if has_forward_hooks(module):  # a forward hook may keep the output (output_hidden_states): give it its own memory
            outs = [o.clone() for o in outs]
        return rebuild(step.out_spec, iter(outs), caches)

    @staticmethod
    def _inspect_caches(p: Pass, caches: dict[int, Any], training: bool) -> None:
        """Each KV cache of the pass, at its first block: graphable (:func:`static_cache_state`) and
        the data pointers of its tensors (compared with the recorded ones in :meth:`_next_step`).
        Once per pass, not per block: 14 us for a 24-layer StaticCache (Qwen2-0.5B, this CPU host,
        torch 2.13), against milliseconds per decode step; later blocks only look the id up."""
        for key, cache in caches.items():
            if key in p.caches:
                continue
            if training:
                raise Decline("a KV cache in a forward that records gradients (graphs with a cache are for "
                               "inference under torch.no_grad)")
            ptrs, reason = static_cache_state(cache)
            if reason is not None:
                raise Decline(reason)
            p.caches[key] = (weakref.ref(cache), ptrs)

    def _purge_dead_caches(self) -> None:
        """Forget the sequences (and warm-up counts) of KV caches that no longer exist (``generate``
        makes a new StaticCache per call): their graphs write into freed memory and can never serve."""
        for key, refs in list(self.cache_keys.items()):
            if any(ref() is None for ref in refs):
                del self.cache_keys[key]
                self.attempts.pop(key, None)
                seq = self.sequences.pop(key, None)
                if seq is not None:
                    seq.recording = False
                    seq.failed = "its KV cache is gone"
                    seq.steps.clear()
                    seq.statics.clear()
                    seq.sources.clear()

    @staticmethod
    def _static_reason(module: torch.nn.Module) -> str | None:
        if torch.cuda.is_current_stream_capturing():
            return "another CUDA graph capture is in progress"
        if torch.is_autocast_enabled("cuda"):
            return "autocast is enabled (its cast cache is not graph-safe)"
        if torch.is_inference_mode_enabled():
            return "torch.inference_mode (use torch.no_grad)"
        if module.training and getattr(module, "gradient_checkpointing", False):
            return "gradient checkpointing recomputes the block in the backward"
        if global_hooks():
            return "global module hooks are registered"
        return None

    def _next_step(self, p: Pass, fn, module, signature, in_spec, training,
                   caches: dict[int, Any]) -> tuple[Step, bool]:
        if p.seq is None:
            key = (id(module), signature)  # a cache is in the signature by id: a new cache, a new sequence
            seq = self.sequences.get(key)
            if seq is not None and seq.caches and seq.cache_gone():  # the id now names another object
                self._purge_dead_caches()
                seq = None
            if seq is None:
                if key not in self.attempts:
                    self._purge_dead_caches()
                    if caches:
                        self.cache_keys[key] = tuple(p.caches[k][0] for k in caches)
                self.attempts[key] += 1
                if self.attempts[key] <= WARMUP_PASSES:
                    raise Decline("warm-up pass of a new input signature")
                if self.attempts[key] > WARMUP_PASSES + 2:
                    raise Decline("this input signature could not be recorded (see the warning)")
                if len(self.sequences) >= MAX_SEQUENCES:
                    raise Decline(f"more than {MAX_SEQUENCES} input signatures (dynamic shapes?)")
                seq = self.sequences[key] = Sequence(training)
            elif seq.recording:
                raise Decline("the recording of this signature did not finish")
            p.seq = seq
        seq = p.seq
        if seq.recording:
            if any(s.module is module for s in seq.steps):
                raise Decline("a block ran twice in one pass")
            if hooked([m for m in module.modules() if m is not module]):
                raise Decline("hooks on a submodule of the block (a graph would not call them)")
            if module.training and training:
                dropout = dropout_reason(module)
                if dropout:
                    raise Decline(dropout)
            self._params[module] = list(module.parameters())
            step = Step(fn, module, signature, in_spec, training)
            seq.steps.append(step)
            for key in caches:
                seq.caches[key] = p.caches[key]
            return step, True
        if p.cursor >= len(seq.steps):
            raise Decline("more block calls than the recorded pass had")
        step = seq.steps[p.cursor]
        if step.module is not module or step.fn is not fn or step.signature != signature:
            raise Decline("the block calls differ from the recorded pass (shapes, arguments or order)")
        if hooked(step.submodules):
            raise Decline("hooks on a submodule of the block (a graph would not call them)")
        if fixed_ptrs(step.all_modules) != step.fixed_ptrs:
            reason = "a parameter or buffer of a block moved to other memory"
            self._fail(seq, reason)
            raise Decline(reason)
        for key in caches:  # once per cache and pass: the signature matched its id, now the object and memory
            if key in p.verified:
                continue
            recorded, now = seq.caches.get(key), p.caches[key]
            if recorded is None or recorded[0]() is not now[0]():
                raise Decline("a KV cache other than the one the graphs were recorded with")
            if recorded[1] != now[1]:
                reason = ("the StaticCache's tensors moved to other memory since the recording (reorder_cache, "
                          "offloading or .to())")
                self._fail(seq, reason)
                raise Decline(reason)
            p.verified.add(key)
        return step, False

    @staticmethod
    def _check_inputs(p: Pass, step: Step, tensors: list[torch.Tensor]) -> None:
        """A static input another step owns is read only: its source must be what that step copied."""
        for t, s, owned in zip(tensors, step.static_in, step.owned_in):
            if owned or data_ptr(t) == data_ptr(s):
                continue
            copied = p.copied.get(id(s))
            if copied is None or copied[0]() is not t or copied[1] != t._version:
                raise Decline("an input shared with an earlier block changed between the blocks")

    # -- captures --------------------------------------------------------------------------------
    def _capture_forward(self, seq: Sequence, step: Step, tensors: list[torch.Tensor],
                         caches: dict[int, Any]) -> None:
        for t in tensors:
            shared = seq.statics.get(data_ptr(t))
            if shared is None:
                source = seq.sources.get(id(t))
                if source is not None and source[0]() is t:
                    shared = source[1]
            if shared is not None and tensor_meta(shared)[:3] == tensor_meta(t)[:3]:
                step.static_in.append(shared)
                step.owned_in.append(False)
            else:
                # t's strides when they are dense, else contiguous: an expanded input (a stride 0, e.g. the
                # attention mask a decode step broadcasts over the batch) cannot be copied into a tensor with
                # its own strides ("more than one element of the written-to tensor refers to a single
                # memory location", H100 decode capture). Such a copy's strides differ from t's, so the
                # strict check above makes every later block copy that input again (left so: unmeasured)
                static = torch.empty_like(t, memory_format=torch.preserve_format)
                with torch.no_grad():
                    static.copy_(t)
                step.static_in.append(static)
                step.owned_in.append(True)
                seq.sources[id(t)] = (weakref.ref(t), static)
            step.grad_mask.append(step.training and t.requires_grad)
        step.first_sources = [(weakref.ref(t), t._version) for t in tensors]
        step.capture_in = [s.detach().requires_grad_(True) if rg else s
                           for s, rg in zip(step.static_in, step.grad_mask)]
        args, kwargs = rebuild_call(step.in_spec, step.capture_in, caches)
        # The parameters' AccumulateGrad nodes are NOT made ahead of the capture on the ambient stream:
        # a node's stream is where the engine syncs the incoming gradient, and a sync with a stream
        # outside the capture invalidates the backward capture (cudaErrorStreamCaptureInvalidated,
        # H100, torch 2.11). Made inside, they belong to the capture stream (the engine warns once
        # about the stream mismatch when an eager backward reaches them; the sync it adds is correct).
        graph = torch.cuda.CUDAGraph()
        with torch.set_grad_enabled(step.training), self.capturing(graph):
            out = step.fn(step.module, *args, **kwargs)
        step.fwd = graph
        outs: list[torch.Tensor] = []
        out_caches: dict[int, Any] = {}
        step.out_spec = spec_of(out, outs, out_caches)
        if not out_caches.keys() <= caches.keys():
            raise ValueError("the block returned a KV cache it was not given")
        step.static_out = [o.detach() for o in outs]
        if step.training:
            step.capture_out = outs
        for o in step.static_out:  # the next block's input is this output: read in place
            seq.statics[data_ptr(o)] = o

    def _capture_backward(self, seq: Sequence, step: Step, grads: tuple) -> None:
        static_grad_out: list[torch.Tensor | None] = []
        for o, g in zip(step.capture_out, grads):
            if not o.requires_grad:
                static_grad_out.append(None)
                continue
            shared = seq.statics.get(data_ptr(g))
            if shared is not None and tensor_meta(shared)[:3] == tensor_meta(g)[:3]:
                static_grad_out.append(shared)
            else:
                static = torch.empty_like(g, memory_format=torch.preserve_format)  # as the inputs' above
                static.copy_(g)
                static_grad_out.append(static)
        outs = [o for o in step.capture_out if o.requires_grad]
        grad_outs = [g for g in static_grad_out if g is not None]
        targets = [c for c, rg in zip(step.capture_in, step.grad_mask) if rg] + step.grad_params
        graph = torch.cuda.CUDAGraph()
        with self.capturing(graph):
            grads_in = torch.autograd.grad(outs, targets, grad_outputs=grad_outs, allow_unused=True)
        step.static_grad_out = static_grad_out
        step.static_grads = tuple(None if g is None else g.detach() for g in grads_in)
        step.bwd = graph
        self.grad_buffers.update(data_ptr(g) for g in step.static_grads[sum(step.grad_mask):] if g is not None)
        for g in step.static_grads[:sum(step.grad_mask)]:  # the previous block's incoming gradient: read in place
            if g is not None:
                seq.statics[data_ptr(g)] = g
        step.capture_in, step.capture_out = [], []  # frees the captured autograd graph (its memory to the pool)

