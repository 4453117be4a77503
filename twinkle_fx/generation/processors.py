"""transformers' logits processors and stopping criteria in the form a captured decode step runs.

A CUDA graph replays fixed kernels on fixed memory: a processor may not read the host (a Python
``if`` on a tensor, ``.item()``), and what changes from step to step must live in device tensors the
step updates in place. transformers' processors see ``input_ids`` growing by one column a step and
branch on its length; the decode loop instead keeps a :class:`StepState` — every token in a
``(batch, max_length)`` buffer (columns not yet generated hold ``vocab_size``, an id no processor
counts), the current length and the prompt length as device scalars — and each supported processor
has a form that reads those:

* pure functions of the scores (temperature, top-k, top-p, min-p, typical, epsilon, eta, token
  suppression, inf/nan removal, log-softmax normalisation): the processor itself;
* the repetition penalty: transformers' arithmetic over the token buffer (ids are clamped to the
  vocabulary and that column dropped, so unfilled columns count for nothing), the prompt columns it
  ignores (padding) read from a per-sequence device buffer filled each call;
* the length rules (min-length, min-new-tokens, forced EOS at max length): the same ``where`` on
  the device length.

Stopping criteria: the maximum length is the loop's step count, EOS is a device ``isin`` in the step,
a time limit is checked on the host between rounds of steps. Anything else has no graph-safe form:
:func:`plan_processors` / :func:`plan_stopping` name it and ``generate`` runs transformers' own loop.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["StepState", "ProcessorPlan", "StoppingPlan", "penalty_skip", "plan_processors", "plan_stopping"]


@dataclass
class StepState:
    """What a decode step reads besides the logits, all on the device and updated in place."""

    ids: torch.Tensor  # (batch, max_length) int64: prompt and generated tokens, ``vocab_size`` where not yet generated
    cur_len: torch.Tensor  # () int64: the length transformers' ``input_ids`` has when the step's scores are processed
    prompt_len: torch.Tensor  # () int64
    penalty_skip: torch.Tensor  # (batch,) int64: leading columns the repetition penalty ignores


Form = Callable[[StepState, torch.Tensor], torch.Tensor]


def _repetition_penalty(penalty: float, state: StepState, scores: torch.Tensor) -> torch.Tensor:
    """transformers' ``RepetitionPenaltyLogitsProcessor`` over the token buffer."""
    vocab = scores.shape[-1]
    columns = torch.arange(state.ids.shape[1], device=scores.device)
    ids = state.ids.masked_fill(columns[None, :] < state.penalty_skip[:, None], vocab).clamp(max=vocab)
    scores = torch.nn.functional.pad(scores, (0, 1))
    score = torch.gather(scores, 1, ids)
    score = torch.where(score < 0, score * penalty, score / penalty)
    return scores.scatter(1, ids, score)[..., :vocab]


def penalty_skip(processors: Any, batch: int) -> torch.Tensor | int:
    """The leading columns each sequence's repetition penalty ignores this call (0 without one)."""
    for processor in processors or ():
        if type(processor).__name__ == "RepetitionPenaltyLogitsProcessor":
            skip = processor.prompt_ignore_length
            return 0 if skip is None else skip
    return 0

# processors whose __call__ reads only the scores and runs no host sync: called as they are
_PURE = ("TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper",
         "TypicalLogitsWarper", "EpsilonLogitsWarper", "EtaLogitsWarper", "SuppressTokensLogitsProcessor",
         "InfNanRemoveLogitsProcessor", "LogitNormalization")


def _eos_mask(eos: torch.Tensor, vocab: int, device: torch.device) -> torch.Tensor:
    return torch.isin(torch.arange(vocab, device=device), eos.to(device))


def _form(processor: Any, vocab: int, device: torch.device, prompt_len: int) -> Form | str:
    """The graph-safe form of one processor, or why it has none."""
    from transformers.generation import logits_process as lp

    kind = type(processor)
    name = kind.__name__
    if getattr(lp, name, None) is not kind:  # a user's class, or a subclass that may override __call__
        return f"{kind.__module__}.{kind.__qualname__} (not one of transformers' processors with a graph-safe form)"
    if name in _PURE:
        return lambda state, scores: processor(state.ids, scores)
    if name == "RepetitionPenaltyLogitsProcessor":
        if getattr(processor, "logits_indices", None) is not None:
            return f"{name} over packed sequences"
        return functools.partial(_repetition_penalty, processor.penalty)
    if name in ("MinLengthLogitsProcessor", "MinNewTokensLengthLogitsProcessor", "ForcedEOSTokenLogitsProcessor"):
        eos = _eos_mask(torch.as_tensor(processor.eos_token_id).reshape(-1), vocab, device)
        if name == "MinLengthLogitsProcessor":
            minimum = processor.min_length
            return lambda state, scores: torch.where(eos & (state.cur_len < minimum), -math.inf, scores)
        if name == "MinNewTokensLengthLogitsProcessor":
            if processor.prompt_length_to_skip != prompt_len:
                return f"{name} counting from {processor.prompt_length_to_skip}, not the prompt's length"
            minimum = processor.min_new_tokens
            return lambda state, scores: torch.where(eos & (state.cur_len - state.prompt_len < minimum),
                                                     -math.inf, scores)
        last = processor.max_length - 1
        forced = torch.where(eos, 0.0, -math.inf)
        return lambda state, scores: torch.where(state.cur_len == last, forced.to(scores.dtype), scores)
    return f"{name} (it reads the host or the growing token list)"


@dataclass(frozen=True)
class ProcessorPlan:
    """The processors of one ``generate`` call in graph-safe form, applied in transformers' order."""

    forms: tuple[Form, ...]
    key: tuple  # what a captured step bakes in: the processors' classes and settings

    def __call__(self, state: StepState, scores: torch.Tensor) -> torch.Tensor:
        for form in self.forms:
            scores = form(state, scores)
        return scores


def _settings(processor: Any) -> tuple:
    """A hashable image of a processor's settings (tensors by value): equal settings replay one graph."""
    if type(processor).__name__ == "RepetitionPenaltyLogitsProcessor":  # its prompt lengths are per call
        return (type(processor).__name__, processor.penalty)
    items = []
    for name, value in sorted(vars(processor).items()):
        if isinstance(value, torch.Tensor):
            value = (str(value.dtype), tuple(value.shape), tuple(value.flatten().tolist()))
        elif isinstance(value, list):
            value = tuple(value)
        items.append((name, value))
    return (type(processor).__name__, tuple(items))


def plan_processors(processors: Any, vocab: int, device: torch.device,
                    prompt_len: int) -> ProcessorPlan | str:
    """The graph-safe plan of ``processors`` (a ``LogitsProcessorList``), or the first one without a form."""
    forms = []
    for processor in processors or ():
        form = _form(processor, vocab, device, prompt_len)
        if isinstance(form, str):
            return form
        forms.append(form)
    return ProcessorPlan(tuple(forms), tuple(_settings(p) for p in processors or ()))


@dataclass(frozen=True)
class StoppingPlan:
    """The stopping criteria of one call: a step limit, EOS ids checked in the step, time limits checked
    between rounds."""

    max_length: int | None
    eos: torch.Tensor | None  # on the device
    timers: tuple[Any, ...]  # MaxTimeCriteria objects

    def out_of_time(self, batch: int) -> bool:
        dummy = torch.empty(batch, 0)  # a time limit reads only the batch size
        return any(bool(timer(dummy, None).any()) for timer in self.timers)


def plan_stopping(criteria: Any, device: torch.device) -> StoppingPlan | str:
    """The plan of ``criteria`` (a ``StoppingCriteriaList``), or the first criterion without a form."""
    from transformers.generation import stopping_criteria as sc

    max_length = None
    eos: list[torch.Tensor] = []
    timers = []
    for criterion in criteria or ():
        kind = type(criterion)
        if kind is sc.MaxLengthCriteria:
            max_length = criterion.max_length if max_length is None else min(max_length, criterion.max_length)
        elif kind is sc.EosTokenCriteria:
            eos.append(torch.as_tensor(criterion.eos_token_id).reshape(-1))
        elif kind is sc.MaxTimeCriteria:
            timers.append(criterion)
        else:
            return f"{kind.__module__}.{kind.__qualname__} (a stopping criterion without a graph-safe form)"
    eos_ids = torch.cat(eos).to(device) if eos else None
    return StoppingPlan(max_length, eos_ids, tuple(timers))
