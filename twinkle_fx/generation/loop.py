"""``model.generate(..., custom_generate=twinkle_fx.decode)``: transformers prepares, the loop decodes.

transformers' ``generate`` accepts a callable as ``custom_generate``: it validates the generation
config, builds the logits processors and stopping criteria, and calls the callable where it would
call its own ``_sample``. :func:`decode` is such a callable. It keeps, per model, a StaticCache and a
:class:`~twinkle_fx.generation.step.DecodeStep` per batch size, cache length, processor settings and
sampling; runs the prefill as transformers does; then enqueues ``steps_per_sync`` graph replays of
the whole decode step (forward, processors, token choice, EOS bookkeeping) per round and reads the
finished flags of a round while the next one runs. The host waits on the device once per round, not
once per token, and launches one graph per token instead of a few hundred kernels.

The result is what transformers' loop returns: the same greedy tokens, EOS and padding per sequence
at the same step, ``max_new_tokens``, the scores and logits of ``return_dict_in_generate``. A call the
loop has no graph-safe form for (a beam search, a custom logits processor or stopping criterion, an
encoder-decoder model, attentions or hidden states asked for, a cache passed in, a sliding-window
cache layer) runs transformers' own loop, with one INFO line naming the reason.

The forward: when transformers would compile the decode step (``cache_implementation="static"``
without ``disable_compile``), the loop compiles ``model.__call__`` with ``generation_config.compile_config``
(``backend="twinkle"`` for the kernels) minus its CUDA graphs, since the loop graphs the whole step;
otherwise it runs the model as it is, with whatever ``kernelize_model`` swapped in.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

import torch

from .processors import penalty_skip, plan_processors, plan_stopping
from .step import DecodeStep

logger = logging.getLogger(__name__)

__all__ = ["decode", "use_decode_loop", "release_decode_state"]

# model inputs a decode step knows how to advance; generate's other inputs make the call fall back
_STEP_INPUTS = {"attention_mask", "position_ids", "cache", "past_key_values", "use_cache", "logits_to_keep",
                "cache_position"}
_CACHE_KEYS = ("cache", "past_key_values")
MAX_STEPS_KEPT = 4  # decode-step signatures kept per model (each holds a KV cache)
CACHE_ROUNDING = 128  # cache lengths are rounded up to this: nearby max_new_tokens share one graph


class _ModelState:
    """The caches, decode steps and compiled forwards of one model, kept on the model itself (it and
    they refer to each other, so they are freed together). ``generate`` calls on one model are
    serialised: a step's buffers serve one call at a time. A copy or a pickle of the model carries an
    empty state: graphs and caches belong to the memory they were recorded on."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.caches: dict[tuple, Any] = {}
        self.steps: dict[tuple, DecodeStep] = {}
        self.compiled: dict[str, Any] = {}

    def __deepcopy__(self, memo: dict) -> _ModelState:
        return _ModelState()

    def __reduce__(self) -> tuple:
        return (_ModelState, ())


_STATE_ATTRIBUTE = "_twinkle_decode_state"
_CREATE_LOCK = threading.Lock()


def _state(model: torch.nn.Module) -> _ModelState:
    with _CREATE_LOCK:
        state = model.__dict__.get(_STATE_ATTRIBUTE)
        if state is None:
            state = model.__dict__[_STATE_ATTRIBUTE] = _ModelState()
        return state


def release_decode_state(model: torch.nn.Module) -> None:
    """Free the KV caches and graphs the decode loop keeps for ``model`` (the next call records anew)."""
    model.__dict__.pop(_STATE_ATTRIBUTE, None)


def _fallback(model, input_ids, reason: str, logits_processor, stopping_criteria, generation_config,
              synced_gpus, streamer, model_kwargs):
    from transformers.generation.utils import GENERATION_MODES_MAPPING

    method = GENERATION_MODES_MAPPING[generation_config.get_generation_mode()]
    if not method.startswith("_"):
        raise ValueError(f"twinkle_fx.decode cannot run the {generation_config.get_generation_mode().name} mode "
                         f"(transformers loads it from the Hub repo {method}); call generate without custom_generate.")
    logger.info("decode loop: %s; transformers' own loop runs this call", reason)
    kwargs = {"streamer": streamer} if streamer is not None else {}
    return getattr(type(model), method)(model, input_ids, logits_processor=logits_processor,
                                        stopping_criteria=stopping_criteria, generation_config=generation_config,
                                        synced_gpus=synced_gpus, **kwargs, **model_kwargs)


def _unsupported(model, input_ids, generation_config, synced_gpus, model_kwargs) -> str | None:
    from transformers.generation.configuration_utils import GenerationMode

    if model.config.is_encoder_decoder:
        return "an encoder-decoder model"
    if synced_gpus:
        return "synced_gpus (every rank must step together)"
    mode = generation_config.get_generation_mode()
    if mode not in (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE):
        return f"generation mode {mode.name}"
    if getattr(generation_config, "is_assistant", False):
        return "an assistant model's generation"
    if generation_config.return_dict_in_generate and (generation_config.output_attentions
                                                      or generation_config.output_hidden_states):
        return "attentions or hidden states asked for"
    if not model_kwargs.get("use_cache", True):
        return "use_cache=False"
    extra = sorted(k for k, v in model_kwargs.items() if k not in _STEP_INPUTS and v is not None)
    if extra:
        return f"model input(s) {', '.join(extra)}"
    cache = next((model_kwargs[k] for k in _CACHE_KEYS if model_kwargs.get(k) is not None), None)
    if cache is not None and getattr(cache, "_is_user_defined", False):
        return "a cache passed to generate (the loop decodes into its own StaticCache)"
    if model.device.type == "cuda" and input_ids.device != model.device:
        return "input_ids on another device than the model"
    return None


def _cache_key() -> str:
    """The name transformers gives the cache argument (``cache`` from 5.24, ``past_key_values`` before)."""
    import inspect

    from transformers.generation.utils import GenerationMixin

    params = inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters
    return "cache" if "cache" in params else "past_key_values"


def _static_cache(model: torch.nn.Module, length: int) -> Any | str:
    from transformers.cache_utils import StaticCache, StaticLayer

    try:
        cache = StaticCache(config=model.config.get_text_config(decoder=True), max_cache_len=length)
    except Exception as error:  # noqa: BLE001 - the model has no static cache: transformers' loop serves it
        return f"no StaticCache for this model ({type(error).__name__}: {error})"
    kinds = {type(layer).__name__ for layer in cache.layers if type(layer) is not StaticLayer}
    if kinds:
        return f"cache layers {', '.join(sorted(kinds))} (only full-attention static layers are graphed)"
    return cache


def _forward(model: torch.nn.Module, state: _ModelState, generation_config, model_kwargs) -> tuple[Any, str]:
    """The model call of the decode step, compiled as transformers would compile it minus CUDA graphs,
    and a name for it that is the same from call to call."""
    if not model._valid_auto_compile_criteria(model_kwargs, generation_config):
        return model.__call__, "eager"
    from transformers.generation.configuration_utils import CompileConfig

    config = (generation_config.compile_config or CompileConfig()).to_dict()
    mode = config.pop("mode", None)
    options = dict(config.pop("options", None) or {})
    options.pop("triton.cudagraphs", None)
    if "cudagraphs" in options:  # the twinkle backend's option
        options["cudagraphs"] = False
    mode = {"reduce-overhead": None, "max-autotune": "max-autotune-no-cudagraphs"}.get(mode, mode)
    if config.get("dynamic") is None:
        # one static graph per batch size, as the step's CUDA graph is: Dynamo would otherwise recompile the
        # second batch size with dynamic shapes, a compile that took longer than the first one
        config["dynamic"] = False
    key = repr((sorted(config.items()), mode, sorted(options.items())))
    compiled = state.compiled.get(key)
    if compiled is None:
        kwargs = {"options": options} if options else {"mode": mode}
        compiled = state.compiled[key] = torch.compile(model.__call__, **config, **kwargs)
    return compiled, key


def _forward_signature(model: torch.nn.Module) -> tuple:
    """What a recorded step baked in of the model: where its parameters are and which forwards run."""
    return (tuple(p.data_ptr() for p in model.parameters()),
            tuple(id(m.__dict__.get("forward")) for m in model.modules()))


def decode(model: torch.nn.Module, input_ids: torch.Tensor, logits_processor: Any = None,
           stopping_criteria: Any = None, generation_config: Any = None, synced_gpus: bool = False,
           streamer: Any = None, steps_per_sync: int = 16, decode_streamer: Any = None,
           decode_graphs: bool = True, **model_kwargs: Any) -> Any:
    """Greedy or sampled decoding with the whole decode step in one CUDA graph, for ``generate``'s
    ``custom_generate``.

    Args:
        steps_per_sync (`int`, defaults to 16): decode steps enqueued per round; the host reads the
            finished flags (and feeds a streamer) once a round, while the next round runs.
        decode_streamer: a streamer, fed a round at a time. transformers does not hand a
            ``custom_generate`` callable its ``streamer``; :func:`use_decode_loop` passes it on.
        decode_graphs (`bool`, defaults to True): record the step in a CUDA graph (on CUDA devices);
            False runs the same step eagerly, for debugging.

    Examples:
        >>> tokens = model.generate(ids, max_new_tokens=64, custom_generate=twinkle_fx.decode)  # doctest: +SKIP
    """
    streamer = streamer if streamer is not None else decode_streamer
    if not isinstance(steps_per_sync, int) or steps_per_sync < 1:
        raise ValueError(f"steps_per_sync must be a positive integer, got {steps_per_sync!r}")
    model_kwargs = dict(model_kwargs)
    plan = stopping = None
    reason = _unsupported(model, input_ids, generation_config, synced_gpus, model_kwargs)
    batch, prompt = input_ids.shape
    vocab = model.config.get_text_config(decoder=True).vocab_size
    if reason is None:
        plan = plan_processors(logits_processor, vocab, model.device, prompt)
        stopping = plan_stopping(stopping_criteria, model.device)
        reason = next((r for r in (plan, stopping) if isinstance(r, str)), None)
        if reason is None and stopping.max_length is None:
            reason = "no maximum length"
    if reason is not None:
        return _fallback(model, input_ids, reason, logits_processor, stopping_criteria, generation_config,
                         synced_gpus, streamer, model_kwargs)
    state = _state(model)
    with state.lock:
        step = _step_for(model, state, input_ids, plan, stopping, generation_config, model_kwargs, decode_graphs)
        if isinstance(step, str):
            return _fallback(model, input_ids, step, logits_processor, stopping_criteria, generation_config,
                             synced_gpus, streamer, model_kwargs)
        step.start(input_ids, model_kwargs.get("attention_mask"), penalty_skip(logits_processor, batch))
        return _run(model, step, input_ids, stopping, generation_config, model_kwargs, streamer, steps_per_sync)


def _step_for(model, state: _ModelState, input_ids, plan, stopping, generation_config, model_kwargs,
              graphs: bool) -> DecodeStep | str:
    """The decode step of this call's signature: the one recorded by an earlier call, or a new one on the
    model's cache of this batch size and length (a new cache if none); why not, if the model has none."""
    batch = input_ids.shape[0]
    length = -(-stopping.max_length // CACHE_ROUNDING) * CACHE_ROUNDING
    cache = state.caches.get((batch, length))
    if cache is None:
        cache = _static_cache(model, length)
        if isinstance(cache, str):
            return cache
    forward, forward_name = _forward(model, state, generation_config, model_kwargs)
    padded = model_kwargs.get("attention_mask") is not None
    positions = "position_ids" in model_kwargs
    extra = {k: v for k, v in model_kwargs.items() if k in ("use_cache", "logits_to_keep")}
    record = (bool(generation_config.return_dict_in_generate and generation_config.output_scores),
              bool(generation_config.return_dict_in_generate and generation_config.output_logits))
    pad = generation_config._pad_token_tensor
    pad = 0 if pad is None else int(pad)
    do_sample = bool(generation_config.do_sample)
    eos = None if stopping.eos is None else tuple(stopping.eos.tolist())
    key = (batch, length, padded, positions, plan.key, eos, pad, do_sample, record, forward_name,
           tuple(sorted(extra.items())), graphs, _forward_signature(model))
    step = state.steps.pop(key, None)
    if step is None:
        while len(state.steps) >= MAX_STEPS_KEPT:
            state.steps.pop(next(iter(state.steps)))
        step = DecodeStep(model, forward, cache, _cache_key(), batch=batch, length=length,
                          vocab=model.config.get_text_config(decoder=True).vocab_size, padded=padded,
                          has_positions=positions, plan=plan, stopping=stopping, do_sample=do_sample, pad_token=pad,
                          record=record, extra_inputs=extra, graphs=graphs)
    state.steps[key] = step  # most recently used last
    state.caches[(batch, length)] = cache
    for stale in [k for k, c in state.caches.items() if all(s.cache is not c for s in state.steps.values())]:
        del state.caches[stale]
    return step


def _run(model, step: DecodeStep, input_ids, stopping, generation_config, model_kwargs, streamer,
         steps_per_sync: int) -> Any:
    batch, prompt = input_ids.shape
    kwargs = {k: v for k, v in model_kwargs.items() if k not in _CACHE_KEYS}
    kwargs[step.cache_key] = step.cache
    outputs = model._prefill(input_ids, generation_config, kwargs, is_first_iteration=True)
    if step.position is not None:
        step.position.copy_(model_kwargs["position_ids"][:, -1:])
    step.select(outputs.logits[:, -1])
    del outputs
    total = stopping.max_length - prompt  # tokens to produce at most, the first one included
    watch = stopping.eos is not None or bool(stopping.timers) or streamer is not None
    rounds = _Rounds(step, prompt, streamer) if watch else None
    done = 1
    while done < total:
        count = min(steps_per_sync, total - done)
        for _ in range(count):
            step.run()
        if rounds is not None:
            if rounds.finished(prompt + done, prompt + done + count):  # the round before ended every sequence
                break
            if stopping.out_of_time(batch):
                step.unfinished.zero_()
        done += count
    produced = int(step.produced)
    sequences = step.state.ids[:, :prompt + produced].clone()
    if rounds is not None:
        rounds.flush(sequences)
    return _output(generation_config, sequences, step, produced)


class _Rounds:
    """The finished flags and new tokens of each round, copied to the host while the next round runs
    (into pinned memory, behind an event: the host waits for the round before, never for the one it
    just enqueued)."""

    def __init__(self, step: DecodeStep, prompt: int, streamer: Any) -> None:
        self.step, self.prompt, self.streamer = step, prompt, streamer
        pinned = step.token.device.type == "cuda"
        self.flags = [torch.zeros(2, dtype=torch.long, pin_memory=pinned) for _ in range(2)]
        self.columns: list[tuple[int, torch.Tensor] | None] = [None, None]  # a round's token columns
        self.events = [torch.cuda.Event() if pinned else None for _ in range(2)]
        self.pending: int | None = None
        self.streamed = 1  # generated columns handed to the streamer: the first comes from the prefill
        self.slot = 0
        if streamer is not None:
            self._stream(step.state.ids[:, prompt:prompt + 1].cpu())

    def finished(self, first: int, end: int) -> bool:
        """Record the round that fills columns ``first:end``; True when the round before it ended every
        sequence (what it generated is streamed first)."""
        step, slot = self.step, self.slot
        self.flags[slot].copy_(torch.stack((step.produced, step.unfinished.amax())), non_blocking=True)
        if self.streamer is not None:
            window = step.state.ids[:, first:end]
            host = torch.empty(window.shape, dtype=window.dtype, pin_memory=self.events[slot] is not None)
            self.columns[slot] = (first, host.copy_(window, non_blocking=True))
        if self.events[slot] is not None:
            self.events[slot].record()
        previous, self.pending, self.slot = self.pending, slot, 1 - slot
        if previous is None:
            return False
        if self.events[previous] is not None:
            self.events[previous].synchronize()
        produced, alive = self.flags[previous].tolist()
        if self.streamer is not None and produced > self.streamed:
            first, columns = self.columns[previous]
            start = self.prompt + self.streamed - first
            self._stream(columns[:, start:start + produced - self.streamed])
            self.streamed = produced
        return alive == 0

    def _stream(self, columns: torch.Tensor) -> None:
        for column in columns.unbind(1):  # one put per token, as transformers' loop does
            self.streamer.put(column)

    def flush(self, sequences: torch.Tensor) -> None:
        if self.streamer is None:
            return
        generated = sequences.shape[1] - self.prompt
        if generated > self.streamed:
            self._stream(sequences[:, self.prompt + self.streamed:].cpu())
        self.streamer.end()


def _output(generation_config, sequences: torch.Tensor, step: DecodeStep, produced: int) -> Any:
    if not generation_config.return_dict_in_generate:
        return sequences
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    fields = GenerateDecoderOnlyOutput.__dataclass_fields__
    cache_field = "cache" if "cache" in fields else "past_key_values"
    recorded = [None if r is None else tuple(r[i].clone() for i in range(produced)) for r in (step.scores, step.logits)]
    return GenerateDecoderOnlyOutput(sequences=sequences, scores=recorded[0], logits=recorded[1],
                                     **{cache_field: step.cache})


def use_decode_loop(model: torch.nn.Module, **options: Any) -> torch.nn.Module:
    """Make every ``model.generate(...)`` decode with :func:`decode` (``options`` are its own keyword
    arguments, e.g. ``steps_per_sync``); ``streamer=`` reaches the loop. Returns ``model``; ``del
    model.generate`` goes back to transformers' loop.

    Examples:
        >>> twinkle_fx.use_decode_loop(model)                                  # doctest: +SKIP
        >>> tokens = model.generate(ids, max_new_tokens=64)                    # doctest: +SKIP
    """
    unknown = set(options) - {"steps_per_sync", "decode_graphs"}
    if unknown:
        raise TypeError(f"use_decode_loop() got unknown option(s) {', '.join(sorted(unknown))}; "
                        "it takes steps_per_sync and decode_graphs")
    generate = type(model).generate

    @functools.wraps(generate)
    def generate_with_decode_loop(*args: Any, **kwargs: Any) -> Any:
        if "custom_generate" not in kwargs:
            kwargs["custom_generate"] = decode
            if kwargs.get("streamer") is not None:
                kwargs["decode_streamer"] = kwargs["streamer"]
            for name, value in options.items():
                kwargs.setdefault(name, value)
        return generate(model, *args, **kwargs)

    model.generate = generate_with_decode_loop
    return model
