"""The inference workload: prefill latency and decode tokens/s of one model under each backend.

``twinkle-fx bench --inference`` (no grad, the model in eval mode, each backend on a fresh model
with the same seed):

- prefill: one forward of ``1 x prefill`` tokens without a cache, logits of the last position only
  (``logits_to_keep=1``, what ``generate`` asks for); reported as ms and tokens/s;
- decode: one step of ``decode_batch`` sequences against a transformers ``StaticCache`` holding
  ``context`` tokens (filled once by an eager prefill), one new token each; the cache has fixed
  shapes, so every step replays the same compiled graph (and CUDA graph). Reported as ms per step
  and generated tokens/s (``decode_batch / step time``). Attention reads the whole static cache at
  every step, so the work per step is constant.

Rows (``torch.compile(..., dynamic=False)`` for the compiled ones; CUDA graphs through
torch.compile's ``mode="reduce-overhead"``):

===================  ==========================================================================
eager                the model as built
kernelize            ``kernelize_model(model, mode="inference")`` with the built-in kernels
kernelize+cudagraphs ``kernelize_model(model, mode="inference", cuda_graphs=True)``, decoder layers bound too:
                     each decoder layer replayed from a CUDA graph; the decode steps too (the same
                     StaticCache object every step, updated in place by the graphs). The notes say
                     how many timed prefill and decode steps replayed, with a WARNING and the
                     reasons when some ran eagerly
inductor             ``torch.compile(model)``
inductor+cudagraphs  ``torch.compile(model, mode="reduce-overhead")``
twinkle              ``torch.compile(model, backend="twinkle")``
twinkle+cudagraphs   ``torch.compile(model, backend="twinkle", mode="reduce-overhead")``
===================  ==========================================================================

Each row's last-position logits (prefill and decode; of the first call and of one call after the
timed ones) are compared with eager's; a relative L2 error above the dtype's tolerance marks the row
WRONG. Rows with CUDA graphs say whether each compiled
graph was captured and, if not, Inductor's reason.
"""

from __future__ import annotations

import contextlib
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from twinkle_triton.transformers_api import CACHE_ARGUMENT

from ..core.tolerances import tolerance
from .backends import BackendUnavailable, Prepared, _builtin_kernels, _compile_notes
from ..measure.environment import describe_environment
from .model_bench import free_device_memory, warm_compiler
from .results import BenchResult, InferenceRow
from ..measure.clock import DeviceClock
from .workloads import build_model, get_workload

__all__ = ["INFERENCE_BACKENDS", "InferenceBenchOptions", "run_inference_bench"]



@dataclass(frozen=True)
class InferenceBenchOptions:
    model: str
    backends: list[str]
    prefill: int  # tokens of the prefill forward (batch 1)
    decode_batch: int
    context: int  # tokens in the static cache when decoding
    dtype: torch.dtype
    steps: int
    warmup: int
    device: torch.device
    tiny: bool = False
    seed: int = 0
    options: dict[str, Any] | None = None  # twinkle backend options for the twinkle rows


def _compiled(backend: str | None, cudagraphs: bool):
    @contextlib.contextmanager
    def prepare(model: torch.nn.Module, family: str, device: torch.device,
                options: dict[str, Any] | None) -> Iterator[Prepared]:
        from twinkle_fx.compiler.inner.inductor_options import collect_cudagraph_status

        mode = "reduce-overhead" if cudagraphs else None
        if backend is None:
            with collect_cudagraph_status() as cudagraphs_report:
                prepared = Prepared(torch.compile(model, mode=mode, dynamic=False))
                yield prepared
            prepared.notes["cudagraphs"] = cudagraphs_report.summary() if cudagraphs else None
            return
        from twinkle_fx.compiler import collect_reports

        kwargs: dict[str, Any] = {"options": {**(options or {}), "cudagraphs": True} if cudagraphs else options}
        if kwargs["options"] is None:
            kwargs = {"mode": mode}
        with _builtin_kernels(family, device) as bound, collect_reports() as report, \
                collect_cudagraph_status() as cudagraphs_report:
            prepared = Prepared(torch.compile(model, backend="twinkle", dynamic=False, **kwargs),
                                {"builtin_kernels": bound})
            try:
                yield prepared
            finally:
                prepared.notes.update(_compile_notes(report))
                prepared.notes["cudagraphs"] = cudagraphs_report.summary() if cudagraphs else None

    return prepare


@contextlib.contextmanager
def _eager(model: torch.nn.Module, family: str, device: torch.device, options) -> Iterator[Prepared]:
    yield Prepared(model)


def _kernelize(cuda_graphs: bool = False):
    @contextlib.contextmanager
    def prepare(model: torch.nn.Module, family: str, device: torch.device, options) -> Iterator[Prepared]:
        from twinkle_fx import kernelize_model, undo_kernelize
        from twinkle_fx.eager.cuda_graphs import graph_status

        # with CUDA graphs the decoder layers are bound too (residual add + norm in one kernel), as in training
        with _builtin_kernels(family, device, decoder_layers=cuda_graphs) as bound:
            kernelize_model(model, mode="inference", device=device, cuda_graphs=cuda_graphs)
            prepared = Prepared(model, {"builtin_kernels": bound})
            try:
                yield prepared
            finally:
                if cuda_graphs:
                    prepared.notes["cuda_graphs"] = str(graph_status(model))
                undo_kernelize(model)

    return prepare


INFERENCE_BACKENDS: dict[str, tuple[str, Callable[..., Any]]] = {
    "eager": ("the model as built", _eager),
    "kernelize": ('kernelize_model(model, mode="inference"), built-in kernels', _kernelize()),
    "kernelize+cudagraphs": ('kernelize_model(model, mode="inference", cuda_graphs=True), built-in kernels and '
                             'decoder layers', _kernelize(cuda_graphs=True)),
    "inductor": ("torch.compile(model)", _compiled(None, False)),
    "inductor+cudagraphs": ('torch.compile(model, mode="reduce-overhead")', _compiled(None, True)),
    "twinkle": ('torch.compile(model, backend="twinkle")', _compiled("twinkle", False)),
    "twinkle+cudagraphs": ('torch.compile(model, backend="twinkle", mode="reduce-overhead")',
                           _compiled("twinkle", True)),
}


def _static_cache(model: torch.nn.Module, max_len: int):
    from transformers import StaticCache

    return StaticCache(config=model.config, max_cache_len=max_len)


@dataclass
class _Timed:
    first: torch.Tensor  # output of the first call
    last: torch.Tensor  # output of one more call after the timed ones (CUDA-graph rows: a replayed one)
    first_s: float  # first call, host clock
    median_ms: float  # of the timed calls
    graph_passes: int | None = None  # timed calls whose decoder layers all replayed CUDA graphs (None: no graphs)
    graph_eager: Counter | None = None  # reasons of the timed calls that ran eagerly


def _graph_counts(model: torch.nn.Module) -> tuple[int, Counter] | None:
    from twinkle_fx.eager.cuda_graphs import graph_status

    status = graph_status(model)
    return None if status is None else (status.replays["forward"], Counter(status.eager))


def _timed(fn: Callable[[], torch.Tensor], clock: DeviceClock, warmup: int, steps: int,
           model: torch.nn.Module) -> _Timed:
    """First call (host clock), ``warmup`` calls, ``steps`` timed calls (median), one more call; with
    ``kernelize_model(cuda_graphs=True)`` also how many timed calls replayed their CUDA graphs."""
    first, first_s = clock.wall(lambda: fn().clone())
    for _ in range(warmup):
        fn()
    before = _graph_counts(model)
    times = sorted(clock.each_ms(fn, steps))
    after = _graph_counts(model)
    timed = _Timed(first, fn().clone(), first_s, times[len(times) // 2])
    if before is not None:
        from twinkle_fx.eager.cuda_graphs.layer_graphs import block_modules

        blocks = len(block_modules(model)[0])
        timed.graph_passes = (after[0] - before[0]) // max(blocks, 1)
        timed.graph_eager = after[1] - before[1]
    return timed


def _graph_note(phase: str, timed: _Timed, steps: int) -> str | None:
    """'decode: 20 of 20 timed steps replayed CUDA graphs', with the reasons when some did not."""
    if timed.graph_passes is None:
        return None
    text = f"{phase}: {timed.graph_passes} of {steps} timed steps replayed CUDA graphs"
    if timed.graph_passes < steps:
        reasons = "; ".join(f"{n} x {reason}" for reason, n in timed.graph_eager.most_common()) or "unknown"
        text = f"WARNING {text} (the others ran eagerly: {reasons})"
    return text


def _rel_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    got, expected = got.float(), expected.float()
    return float((got - expected).norm() / expected.norm().clamp_min(1e-12))


def _run_backend(name: str, options: InferenceBenchOptions, clock: DeviceClock,
                 reference: dict[str, torch.Tensor]) -> InferenceRow:
    workload = get_workload(options.model)
    generator = torch.Generator().manual_seed(options.seed)
    vocab = workload.config_kwargs(tiny=options.tiny)["vocab_size"]
    prompt = torch.randint(0, vocab, (1, options.prefill), generator=generator).to(options.device)
    context = torch.randint(0, vocab, (options.decode_batch, options.context), generator=generator).to(options.device)
    step_ids = torch.randint(0, vocab, (options.decode_batch, 1), generator=generator).to(options.device)
    try:
        model = build_model(workload, tiny=options.tiny, dtype=options.dtype, device=options.device,
                            seed=options.seed).eval()
        with torch.no_grad(), INFERENCE_BACKENDS[name][1](model, workload.family, options.device,
                                                           options.options) as prepared:
            run = prepared.model

            def prefill() -> torch.Tensor:
                return run(input_ids=prompt, use_cache=False, logits_to_keep=1).logits

            prefill_t = _timed(prefill, clock, options.warmup, options.steps, model)
            # transformers advances the cache's own length at every step (StaticLayer.cumulative_length,
            # 5.17 to 5.22): room for every call (first, warm-up, timed, last); attention reads the whole
            # static cache whatever the length, so the work per step is the same
            cache = _static_cache(model, options.context + options.warmup + options.steps + 2)
            # the cache is filled by the model as built (eager, or kernelized): only decode is compiled;
            # kernelize+cudagraphs runs this prefill eagerly (it allocates the cache's tensors), then
            # its decode steps replay graphs recorded on this cache object (the same one every step)
            model(input_ids=context, use_cache=True, logits_to_keep=1, **{CACHE_ARGUMENT: cache})
            position = torch.tensor([options.context], device=options.device)

            def decode() -> torch.Tensor:
                return run(input_ids=step_ids, cache_position=position, use_cache=True, logits_to_keep=1,
                           **{CACHE_ARGUMENT: cache}).logits

            decode_t = _timed(decode, clock, options.warmup, options.steps, model)
        notes = prepared.notes
        graph_notes = [n for n in (_graph_note("prefill", prefill_t, options.steps),
                                   _graph_note("decode", decode_t, options.steps)) if n]
        if graph_notes:
            notes["cuda_graphs_timed"] = graph_notes
    except BackendUnavailable as e:
        return InferenceRow(name, status="unavailable", error=str(e))
    except Exception as e:  # noqa: BLE001 - a failing backend is a result, the run goes on
        return InferenceRow(name, status="failed", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
    row = InferenceRow(
        name, prefill_ms=prefill_t.median_ms, prefill_tokens_per_s=options.prefill / (prefill_t.median_ms / 1e3),
        prefill_first_s=prefill_t.first_s, decode_ms=decode_t.median_ms,
        decode_tokens_per_s=options.decode_batch / (decode_t.median_ms / 1e3), decode_first_s=decode_t.first_s,
        notes=notes,
    )
    if name == "eager":
        reference.update(prefill=prefill_t.first, prefill_last=prefill_t.last, decode=decode_t.first,
                         decode_last=decode_t.last)
    elif reference:
        # the first call and the one after the timed calls (CUDA-graph rows: the first runs eagerly, the
        # last replays); every row makes the same decode calls, so the cache holds the same tokens
        row.prefill_rel_error = max(_rel_error(prefill_t.first, reference["prefill"]),
                                    _rel_error(prefill_t.last, reference["prefill_last"]))
        row.decode_rel_error = max(_rel_error(decode_t.first, reference["decode"]),
                                   _rel_error(decode_t.last, reference["decode_last"]))
        # relative L2 error of the last-position logits against eager's
        if max(row.prefill_rel_error, row.decode_rel_error) > tolerance(options.dtype).logits_rtol:
            row.status = "wrong"
    return row


def run_inference_bench(options: InferenceBenchOptions, progress: Callable[[str], None] = print) -> BenchResult:
    """Benchmark ``options.backends`` on prefill and decode of ``options.model`` (see the module
    docstring); ratios against Inductor and Inductor + CUDA graphs of the same run.

    Examples:
        >>> options = InferenceBenchOptions(model="qwen2", backends=["eager", "kernelize"], prefill=32,
        ...                                 decode_batch=2, context=16, dtype=torch.float32, steps=2,
        ...                                 warmup=1, device=torch.device("cpu"), tiny=True)
        >>> # not run by the doctest test: benchmarks take tens of seconds even tiny (tests/bench runs them)
        >>> result = run_inference_bench(options)                                # doctest: +SKIP
    """
    workload = get_workload(options.model)
    clock = DeviceClock(options.device)
    reference: dict[str, torch.Tensor] = {}
    names = list(options.backends)
    if "eager" in names:  # the reference runs first
        names.remove("eager")
        names.insert(0, "eager")
    rows = []
    warm_compiler(options.device, names, progress)
    for index, name in enumerate(names, 1):
        progress(f"[{index}/{len(names)}] {name}: {INFERENCE_BACKENDS[name][0]} ...")
        row = _run_backend(name, options, clock, reference)
        free_device_memory(options.device)
        rows.append(row)
        progress(f"[{index}/{len(names)}] {row}")
    by_name = {r.backend: r for r in rows if r.status in ("ok", "wrong")}
    for row in rows:
        for base in ("inductor", "inductor+cudagraphs"):
            ref = by_name.get(base)
            if ref is None or row.status not in ("ok", "wrong"):
                continue
            row.vs[base] = {"prefill": ref.prefill_ms / row.prefill_ms, "decode": ref.decode_ms / row.decode_ms,
                            "first_call": row.prefill_first_s / ref.prefill_first_s}
    return BenchResult(
        kind="inference",
        environment=describe_environment(options.device),
        workload={
            **workload.describe(tiny=options.tiny),
            "prefill": f"1 x {options.prefill} tokens, no cache, logits of the last position",
            "decode": f"{options.decode_batch} sequences x 1 token, static KV cache of {options.context} tokens",
            "dtype": str(options.dtype).removeprefix("torch."),
            "steps": options.steps, "warmup": options.warmup, "seed": options.seed, "tiny": options.tiny,
            "twinkle_options": options.options,
        },
        rows=rows,
    )
