"""``model.generate()`` as users call it: prefill latency and decode tokens/s under each recipe.

``python -m twinkle_fx.bench.generate`` (one process; every row starts from a fresh model with the
same seed; greedy decoding, EOS disabled so every call generates exactly the asked-for tokens):

==========================  ======================================================================
eager                       ``generate(..., disable_compile=True)``, transformers' dynamic cache
hf-static                   ``cache_implementation="static"``: transformers compiles the decode step
                            itself (Inductor, ``mode="reduce-overhead"``: CUDA graphs), its recipe
twinkle                     the same with ``compile_config=CompileConfig(backend="twinkle")`` and the
                            built-in kernels registered
kernelize+cudagraphs        ``kernelize_model(mode="inference", cuda_graphs=True)`` (decoder layers
                            bound too), a static cache, ``disable_compile=True``
hf-static+decode            transformers' recipe with ``custom_generate=twinkle_fx.decode``: the
                            Inductor-compiled forward inside the loop's graphed decode step
twinkle+decode              the ``twinkle`` row with ``custom_generate=twinkle_fx.decode``
kernelize+decode            ``kernelize_model(mode="inference")`` and ``custom_generate=twinkle_fx.decode``:
                            no compiler, the eager kernels inside the graphed decode step
==========================  ======================================================================

Per row and batch size: two warm-up calls (the first one's wall time is reported: it compiles),
then ``repeats`` calls generating 1 token and ``repeats`` generating ``new_tokens``; the medians give
the prefill latency (``t_1``) and the decode rate ``B * (N - 1) / (t_N - t_1)``. ``of limit`` is the
time one decode step would take reading every weight once at the device's measured copy bandwidth,
over the measured step time. ``tokens`` compares, in fp32 (random-init bf16 logits are too flat for
argmax to agree), the tokens a short generate produces with eager's. At the first batch size, a
profile of a ``new_tokens`` generate against a 1-token one gives the kernels and the device time per
decode step (``kernels/step``, ``GPU ms/step``: the time in which some kernel runs, overlapping kernels counted
once): their gap to ``ms/step`` is the host's share.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ..measure.environment import describe_environment
from ..measure.clock import DeviceClock
from ..measure.kernel_classes import KernelClasses, kernel_classes
from ..measure.overlap import Kernel
from .timing import copy_ms
from .workloads import WORKLOADS, build_model, get_workload

__all__ = ["GENERATE_ROWS", "GenerateOptions", "GenerateRow", "run_generate_bench", "format_generate_table", "main"]


@dataclass(frozen=True)
class GenerateOptions:
    model: str = "qwen2"
    rows: tuple[str, ...] = ("eager", "hf-static", "twinkle", "kernelize+cudagraphs", "hf-static+decode",
                             "twinkle+decode", "kernelize+decode")
    batches: tuple[int, ...] = (1, 8, 32)
    prompt: int = 512
    new_tokens: int = 128
    repeats: int = 3
    dtype: torch.dtype = torch.bfloat16
    device: torch.device = field(default_factory=lambda: torch.device("cuda"))
    tiny: bool = False
    seed: int = 0
    check_tokens: bool = True
    top_kernels: int = 0  # the profile also names this many kernels with the most device time a step


@dataclass
class GenerateRow:
    row: str
    batch: int
    first_call_s: float | None = None  # the first generate (compiles, records graphs)
    prefill_ms: float | None = None
    step_ms: float | None = None  # per decode step
    decode_tok_s: float | None = None
    of_limit: float | None = None  # weight-read time per step at copy bandwidth / measured step time
    kernels_per_step: float | None = None  # device kernels a decode step launches (profiled, first batch)
    gpu_ms_per_step: float | None = None  # the time some kernel of the step runs
    tokens_equal: bool | None = None  # fp32 tokens equal eager's
    notes: list[str] = field(default_factory=list)
    error: str | None = None


@contextlib.contextmanager
def _plain(model: torch.nn.Module, family: str, device: torch.device) -> Iterator[dict[str, Any]]:
    yield {"disable_compile": True}


@contextlib.contextmanager
def _hf_static(model: torch.nn.Module, family: str, device: torch.device) -> Iterator[dict[str, Any]]:
    yield {"cache_implementation": "static"}


@contextlib.contextmanager
def _twinkle(model: torch.nn.Module, family: str, device: torch.device) -> Iterator[dict[str, Any]]:
    from transformers import CompileConfig

    from .backends import _builtin_kernels

    with _builtin_kernels(family, device):
        yield {"cache_implementation": "static", "compile_config": CompileConfig(backend="twinkle")}


@contextlib.contextmanager
def _kernelize_cudagraphs(model: torch.nn.Module, family: str, device: torch.device) -> Iterator[dict[str, Any]]:
    from twinkle_fx import kernelize_model, undo_kernelize

    from .backends import _builtin_kernels

    with _builtin_kernels(family, device, decoder_layers=True):
        kernelize_model(model, mode="inference", device=device, cuda_graphs=True)
        try:
            yield {"cache_implementation": "static", "disable_compile": True}
        finally:
            undo_kernelize(model)


@contextlib.contextmanager
def _decode(row: Callable[..., Any], model: torch.nn.Module, family: str, device: torch.device) -> Iterator[dict[str, Any]]:
    from twinkle_fx import decode, release_decode_state

    with row(model, family, device) as kwargs:
        try:
            yield {**kwargs, "custom_generate": decode}
        finally:
            release_decode_state(model)


@contextlib.contextmanager
def _kernelize(model: torch.nn.Module, family: str, device: torch.device) -> Iterator[dict[str, Any]]:
    from twinkle_fx import kernelize_model, undo_kernelize

    from .backends import _builtin_kernels

    with _builtin_kernels(family, device):
        kernelize_model(model, mode="inference", device=device)
        try:
            yield {}
        finally:
            undo_kernelize(model)


GENERATE_ROWS: dict[str, Callable[..., Any]] = {
    "eager": _plain,
    "hf-static": _hf_static,
    "twinkle": _twinkle,
    "kernelize+cudagraphs": _kernelize_cudagraphs,
    "hf-static+decode": functools.partial(_decode, _hf_static),
    "twinkle+decode": functools.partial(_decode, _twinkle),
    "kernelize+decode": functools.partial(_decode, _kernelize),
}


def _copy_bandwidth(device: torch.device, n_bytes: int = 1 << 30) -> float:
    """Bytes per second a device-to-device copy moves (read plus write); NaN off CUDA (no limit shown)."""
    if device.type != "cuda":
        return float("nan")
    return 2 * n_bytes / (copy_ms(DeviceClock(device), n_bytes, warmup=2, reps=10) * 1e-3)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the distinct parameters (a tied embedding counted once)."""
    seen: dict[int, int] = {}
    for p in model.parameters():
        seen[p.data_ptr()] = p.numel() * p.element_size()
    return sum(seen.values())


def _generate(model: torch.nn.Module, ids: torch.Tensor, new_tokens: int, kwargs: dict[str, Any]) -> torch.Tensor:
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                          eos_token_id=None, pad_token_id=0, **kwargs)


def _median_s(clock: DeviceClock, fn: Callable[[], Any], repeats: int) -> float:
    """The median host-clock seconds of ``repeats`` calls, device work included."""
    return statistics.median(clock.wall(fn)[1] for _ in range(repeats))


def _fresh_model(options: GenerateOptions, dtype: torch.dtype) -> torch.nn.Module:
    model = build_model(get_workload(options.model), tiny=options.tiny, dtype=dtype, device=options.device,
                        seed=options.seed).eval()
    # the workloads are configured for training (no KV cache): generate with one, as users do
    model.config.use_cache = model.generation_config.use_cache = True
    model.generation_config.eos_token_id = None
    return model


def _tokens(options: GenerateOptions, row: str) -> torch.Tensor:
    """The tokens of a short fp32 generate under ``row`` (batch 2, 32-token prompt, 8 new)."""
    model = _fresh_model(options, torch.float32)
    workload = get_workload(options.model)
    vocab = workload.config_kwargs(tiny=options.tiny)["vocab_size"]
    ids = torch.randint(0, vocab, (2, 32), generator=torch.Generator().manual_seed(options.seed + 1)).to(options.device)
    with torch.no_grad(), GENERATE_ROWS[row](model, workload.family, options.device) as kwargs:
        return _generate(model, ids, 8, kwargs).cpu()


@dataclass
class _DeviceKernels:
    """A profile's device kernels (no memcpy / memset): their split by kernel class with the span and its idle part
    (:func:`~twinkle_fx.measure.kernel_classes.kernel_classes`), and launches and microseconds by name. The
    device time is the span less its idle part, the time in which some kernel runs: a kernel launched as a
    programmatic dependent starts, and waits, while the one before still runs, so durations summed count that
    overlap twice."""

    classes: KernelClasses
    named_count: Counter
    named_us: Counter

    @classmethod
    def of(cls, events) -> _DeviceKernels:
        """From ``torch.profiler``'s events (``device_type``, ``name``, ``device_time`` and ``time_range``)."""
        kernels = [e for e in events if e.device_type.name == "CUDA" and not e.name.startswith(("Memset", "Memcpy"))]
        named_count, named_us = Counter(), Counter()
        for e in kernels:
            named_count[e.name] += 1
            named_us[e.name] += e.device_time
        classes = kernel_classes(Kernel(0, e.name, e.time_range.start, e.time_range.end) for e in kernels)
        return cls(classes, named_count, named_us)

    @property
    def busy_ms(self) -> float:
        return self.classes.span_ms - self.classes.idle_ms


def _per_step(one: _DeviceKernels, many: _DeviceKernels, steps: int, top: int = 0) -> tuple[float, float, str, str]:
    """(kernels a step, device ms a step (busy time), the split by kernel class (durations summed), the ``top``
    kernels with the most device time a step) from profiles of one token and of ``steps`` more."""
    a, b = one.classes, many.classes
    split = ", ".join(f"{kind} {(b.calls[kind] - a.calls.get(kind, 0)) / steps:.0f} x "
                      f"{(b.ms[kind] - a.ms.get(kind, 0.0)) / steps:.3f} ms"
                      for kind in sorted(b.ms, key=lambda k: -(b.ms[k] - a.ms.get(k, 0.0))))
    named = sorted(many.named_us, key=lambda k: -(many.named_us[k] - one.named_us[k]))[:top]
    names = "; ".join(f"{name[:90]} {(many.named_count[name] - one.named_count[name]) / steps:.1f} x "
                      f"{(many.named_us[name] - one.named_us[name]) / steps:.1f} us" for name in named)
    kernels = (sum(b.calls.values()) - sum(a.calls.values())) / steps
    return kernels, (many.busy_ms - one.busy_ms) / steps, split, names


def _profile_step(model: torch.nn.Module, ids: torch.Tensor, new_tokens: int, kwargs: dict[str, Any],
                  top: int = 0) -> tuple[float, float, str, str]:
    """Kernels and device milliseconds per decode step (the time some kernel runs), their split by kernel class,
    and the ``top`` kernels with the most device time a step (name, launches and microseconds a step): a profile
    of ``new_tokens`` against one token."""
    from torch.profiler import ProfilerActivity, profile

    def kernels(tokens: int) -> _DeviceKernels:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            _generate(model, ids, tokens, kwargs)
            torch.cuda.synchronize()
        return _DeviceKernels.of(prof.events())

    return _per_step(kernels(1), kernels(new_tokens), new_tokens - 1, top)


def _run_row(row: str, options: GenerateOptions, bandwidth: float, reference: torch.Tensor | None) -> list[GenerateRow]:
    workload = get_workload(options.model)
    vocab = workload.config_kwargs(tiny=options.tiny)["vocab_size"]
    results = []
    clock = DeviceClock(options.device)
    model = _fresh_model(options, options.dtype)
    limit_s = weight_bytes(model) / bandwidth
    with torch.no_grad(), GENERATE_ROWS[row](model, workload.family, options.device) as kwargs:
        for batch in options.batches:
            result = GenerateRow(row, batch)
            results.append(result)
            generator = torch.Generator().manual_seed(options.seed + batch)
            ids = torch.randint(0, vocab, (batch, options.prompt), generator=generator).to(options.device)
            try:
                result.first_call_s = clock.wall(lambda: _generate(model, ids, options.new_tokens, kwargs))[1]
                _generate(model, ids, options.new_tokens, kwargs)
                t1 = _median_s(clock, lambda: _generate(model, ids, 1, kwargs), options.repeats)
                tn = _median_s(clock, lambda: _generate(model, ids, options.new_tokens, kwargs), options.repeats)
            except Exception as error:  # noqa: BLE001  a row that fails is reported, the others still run
                result.error = f"{type(error).__name__}: {error}"[:300]
                continue
            result.prefill_ms = t1 * 1e3
            step_s = (tn - t1) / (options.new_tokens - 1)
            if step_s <= 0:  # timing noise larger than the decode time: say so rather than print a rate
                result.notes.append(f"batch {batch}: {options.new_tokens} tokens took no longer than 1")
                continue
            result.step_ms = step_s * 1e3
            result.decode_tok_s = batch / step_s
            result.of_limit = limit_s / step_s if limit_s == limit_s else None  # NaN off CUDA
            if batch == options.batches[0] and options.device.type == "cuda":
                try:
                    result.kernels_per_step, result.gpu_ms_per_step, split, names = _profile_step(
                        model, ids, options.new_tokens, kwargs, options.top_kernels)
                    result.notes.append(f"batch {batch}, one decode step on the device: {split}")
                    if names:
                        result.notes.append(f"batch {batch}, the kernels with the most device time a step: {names}")
                except Exception as error:  # noqa: BLE001  the timings stand without the profile
                    result.notes.append(f"batch {batch}: the profile failed: {type(error).__name__}: {error}"[:300])
        if row == "kernelize+cudagraphs":
            from twinkle_fx.eager.cuda_graphs import graph_status

            status = graph_status(model)  # recorded and replayed graphs, and why passes ran eagerly
            if status is not None:
                results[-1].notes.append(str(status))
    if options.check_tokens and reference is not None:
        try:
            equal = bool(torch.equal(_tokens(options, row), reference))
        except Exception as error:  # noqa: BLE001
            equal = None
            results[-1].notes.append(f"fp32 token check failed: {type(error).__name__}: {error}"[:300])
        for result in results:
            result.tokens_equal = equal
    del model
    if options.device.type == "cuda":
        torch.cuda.empty_cache()
    return results


def run_generate_bench(options: GenerateOptions, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Every row of ``options`` at every batch size; a dict with the environment and the rows."""
    for row in options.rows:
        if row not in GENERATE_ROWS:
            raise ValueError(f"Unknown generate row {row!r}; choose from: {', '.join(GENERATE_ROWS)}.")
    bandwidth = _copy_bandwidth(options.device)
    reference = None
    if options.check_tokens:
        progress("fp32 reference tokens (eager)")
        reference = _tokens(options, "eager")
    rows: list[GenerateRow] = []
    for row in options.rows:
        progress(f"{row}: batches {', '.join(map(str, options.batches))}")
        done = _run_row(row, options, bandwidth, reference)
        rows.extend(done)
        for r in done:  # each row as it finishes: a run cut short by a time limit still tells
            progress(f"  {row} B{r.batch}: {_cell(r.decode_tok_s, ',.0f')} tok/s, {_cell(r.step_ms, '.3f')} ms/step, "
                     f"first call {_cell(r.first_call_s, '.1f')} s, {_cell(r.kernels_per_step, '.0f')} kernels/step, "
                     f"GPU {_cell(r.gpu_ms_per_step, '.3f')} ms/step{', ' + r.error if r.error else ''}")
    return {"environment": describe_environment(options.device), "copy_bandwidth_gb_s": bandwidth / 1e9,
            "options": {k: str(v) for k, v in asdict(options).items()}, "rows": [asdict(r) for r in rows]}


def _cell(value: float | None, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def format_generate_table(result: dict[str, Any]) -> str:
    """The rows as a Markdown table, with the speed-up of each row over ``hf-static`` at its batch size."""
    rows = result["rows"]
    base = {r["batch"]: r["decode_tok_s"] for r in rows if r["row"] == "hf-static" and r["decode_tok_s"]}
    env = result["environment"]
    versions = env.get("versions", {})
    lines = [f"{env.get('device')}; torch {versions.get('torch')}, transformers {versions.get('transformers')}; "
             f"copy bandwidth {result['copy_bandwidth_gb_s']:.0f} GB/s",
             "",
             "| row | batch | first call s | prefill ms | decode tok/s | ms/step | vs hf-static | of limit | kernels/step "
             "| GPU ms/step | fp32 tokens |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["error"]:
            lines.append(f"| {r['row']} | {r['batch']} | failed: {r['error']} | | | | | | | | |")
            continue
        ratio = r["decode_tok_s"] / base[r["batch"]] if r["decode_tok_s"] and base.get(r["batch"]) else None
        equal = {True: "equal", False: "DIFFER", None: "–"}[r["tokens_equal"]]
        lines.append(f"| {r['row']} | {r['batch']} | {_cell(r['first_call_s'], '.1f')} | {_cell(r['prefill_ms'], '.2f')} "
                     f"| {_cell(r['decode_tok_s'], ',.0f')} | {_cell(r['step_ms'], '.3f')} | {_cell(ratio, '.2f')} "
                     f"| {_cell(r['of_limit'], '.0%')} | {_cell(r.get('kernels_per_step'), '.0f')} "
                     f"| {_cell(r.get('gpu_ms_per_step'), '.3f')} | {equal} |")
    notes = [f"- {r['row']}: {note}" for r in rows for note in r["notes"]]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m twinkle_fx.bench.generate", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen2", choices=sorted(WORKLOADS))
    parser.add_argument("--rows", default=",".join(GenerateOptions.rows),
                        help=f"comma-separated, from: {', '.join(GENERATE_ROWS)}")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="the tiny config on the CPU (a smoke run, no timing value)")
    parser.add_argument("--no-token-check", action="store_true")
    parser.add_argument("--top-kernels", type=int, default=0, metavar="N",
                        help="the profile of a decode step also names the N kernels with the most device time")
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args(argv)
    rows = tuple(r for r in args.rows.split(",") if r)
    if not rows:
        parser.error(f"--rows is empty; give a comma-separated list from: {', '.join(GENERATE_ROWS)}")
    unknown = [r for r in rows if r not in GENERATE_ROWS]
    if unknown:
        parser.error(f"unknown row(s) {', '.join(unknown)}; choose from: {', '.join(GENERATE_ROWS)}")
    try:
        batches = tuple(int(b) for b in args.batches.split(","))
    except ValueError:
        parser.error(f"--batches takes comma-separated positive integers, got {args.batches!r}")
    for name, value in (("--prompt", args.prompt), ("--new-tokens", args.new_tokens), ("--repeats", args.repeats),
                        *(("--batches", b) for b in batches)):
        if value < 1 or (name == "--new-tokens" and value < 2):
            parser.error(f"{name} must be at least {2 if name == '--new-tokens' else 1}, got {value}")
    if args.top_kernels < 0:
        parser.error(f"--top-kernels must be at least 0, got {args.top_kernels}")
    from ..core.outputs import check_output_path

    try:
        check_output_path("--out", args.out, file_name="generate.json")
    except ValueError as e:
        parser.error(str(e))
    if not args.tiny and not torch.cuda.is_available():
        parser.error("timing generate() needs a CUDA device; --tiny runs the tiny config on the CPU")
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    if device.type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are first imported
    options = GenerateOptions(args.model, rows, batches, args.prompt, args.new_tokens, args.repeats,
                              torch.bfloat16 if device.type == "cuda" else torch.float32, device, args.tiny,
                              check_tokens=not args.no_token_check, top_kernels=args.top_kernels)
    result = run_generate_bench(options)
    print(format_generate_table(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
