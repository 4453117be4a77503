"""One decode step on fixed memory, captured once in a CUDA graph and replayed for every token.

A :class:`DecodeStep` owns everything a step reads and writes: the token being fed and its position,
the 2-D padding mask, the token buffer, the current length, the per-sequence finished flags and the
count of steps that produced a token, and a transformers ``StaticCache`` (whose length counter is a
device tensor, so the cache update is a graph-safe ``index_copy_``). :meth:`DecodeStep.select` is
the tail of a step — processors, greedy or sampled token, EOS padding and bookkeeping — and runs
eagerly after the prefill; :meth:`DecodeStep.run` is a whole step (the forward on the cache, then
``select``), eager on the first call and on devices without CUDA graphs, a graph replay afterwards.
A step never reads the host, so the loop enqueues many and reads the finished flags once a round.

The graph is recorded on the step's own memory and stays valid while its cache, the model's
parameters and its forwards stay where they were: the loop keys steps by batch, cache length,
processors and sampling, and checks the parameters before each call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from ..core.torch_internals import capture_cuda_graph
from .processors import ProcessorPlan, StepState, StoppingPlan

logger = logging.getLogger(__name__)

__all__ = ["DecodeStep"]


class DecodeStep:
    """The buffers, the cache and the graph of one decode-step signature (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, forward: Callable[..., Any], cache: Any, cache_key: str, *,
                 batch: int, length: int, vocab: int, padded: bool, has_positions: bool, plan: ProcessorPlan,
                 stopping: StoppingPlan, do_sample: bool, pad_token: int, record: tuple[bool, bool],
                 extra_inputs: dict[str, Any], graphs: bool) -> None:
        device = model.device
        self.model, self.forward, self.cache, self.cache_key = model, forward, cache, cache_key
        self.plan, self.eos, self.do_sample, self.pad_token = plan, stopping.eos, do_sample, pad_token
        self.extra_inputs = extra_inputs
        self.batch, self.length, self.vocab = batch, length, vocab
        long = dict(dtype=torch.long, device=device)
        self.token = torch.zeros(batch, 1, **long)
        self.position = torch.zeros(batch, 1, **long) if has_positions else None
        self.mask = torch.ones(batch, length, **long) if padded else None
        self.state = StepState(torch.full((batch, length), vocab, **long), torch.zeros((), **long),
                               torch.zeros((), **long), torch.zeros(batch, **long))
        self.unfinished = torch.ones(batch, **long)
        self.produced = torch.zeros((), **long)  # steps that ran while a sequence was unfinished
        steps = length  # at most one step per cache slot
        self.scores = torch.zeros(steps, batch, vocab, device=device) if record[0] else None
        self.logits = torch.zeros(steps, batch, vocab, device=device) if record[1] else None
        self.graphs = graphs and device.type == "cuda"
        self.graph: torch.cuda.CUDAGraph | None = None
        self.warm = False
        self.failed: str | None = None

    # -- per call --------------------------------------------------------------------------------
    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
              penalty_skip: torch.Tensor | int = 0) -> None:
        """Reset the buffers and the cache for a new prompt (the graph stays valid: all in place)."""
        prompt = input_ids.shape[1]
        self.cache.reset()
        self.state.ids.fill_(self.vocab)
        self.state.ids[:, :prompt].copy_(input_ids)
        self.state.cur_len.fill_(prompt)
        self.state.prompt_len.fill_(prompt)
        if isinstance(penalty_skip, torch.Tensor):
            self.state.penalty_skip.copy_(penalty_skip)
        else:
            self.state.penalty_skip.fill_(penalty_skip)
        self.unfinished.fill_(1)
        self.produced.zero_()
        if self.mask is not None:
            self.mask.fill_(1)
            self.mask[:, :prompt].copy_(attention_mask)

    def select(self, logits: torch.Tensor) -> None:
        """Choose each sequence's next token from ``logits`` (batch, vocab) and advance the buffers."""
        state = self.state
        logits = logits.to(torch.float32)
        scores = self.plan(state, logits)
        step = (state.cur_len - state.prompt_len).view(1)
        if self.scores is not None:
            self.scores.index_copy_(0, step, scores[None])
        if self.logits is not None:
            self.logits.index_copy_(0, step, logits[None])
        if self.do_sample:
            # the exponential race: argmax(p / E) with E ~ Exp(1) draws from p, as multinomial does,
            # in plain kernels on the device generator (graph-safe: replays advance its offset)
            probs = torch.softmax(scores, dim=-1)
            race = torch.empty_like(probs).exponential_(1).clamp_min_(torch.finfo(probs.dtype).tiny)
            token = torch.argmax(probs / race, dim=-1)
        else:
            token = torch.argmax(scores, dim=-1)
        if self.eos is not None:
            token = token * self.unfinished + self.pad_token * (1 - self.unfinished)
        self.produced.add_(self.unfinished.amax())
        state.ids.scatter_(1, state.cur_len.expand(self.batch, 1), token[:, None])
        if self.eos is not None:
            self.unfinished.mul_((~torch.isin(token, self.eos)).long())
        self.token.copy_(token[:, None])
        if self.position is not None:
            self.position.add_(1)
        state.cur_len.add_(1)

    def _step(self) -> None:
        inputs = self.model.prepare_inputs_for_generation(
            self.token, next_sequence_length=1, attention_mask=self.mask, position_ids=self.position,
            **{self.cache_key: self.cache}, **self.extra_inputs)
        logits = self.forward(**inputs, return_dict=True).logits[:, -1]
        self.select(logits)

    def run(self) -> None:
        """One decode step: a replay once the graph is recorded, else eagerly (recording it the second time)."""
        if self.graph is not None:
            self.graph.replay()
            return
        if not self.graphs or self.failed is not None or not self.warm:
            # the first step of a signature runs eagerly: Triton and Inductor compile, cuBLAS initialises
            self._step()
            self.warm = True
            return
        self._record()
        if self.graph is not None:
            self.graph.replay()
        else:
            self._step()

    def _record(self) -> None:
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(stream), capture_cuda_graph(graph, stream=stream):
                self._step()
        except Exception as error:  # noqa: BLE001 - the step stays eager, and the user hears why once
            self.failed = f"{type(error).__name__}: {error}"
            logger.warning("decode loop: capturing the decode step of %s raised %s; its steps run eagerly",
                           type(self.model).__name__, self.failed[:300])
            return
        finally:
            torch.cuda.current_stream().wait_stream(stream)
        self.graph = graph
        logger.info("decode loop: recorded the decode step of %s (batch %d, cache %d)", type(self.model).__name__,
                    self.batch, self.length)
