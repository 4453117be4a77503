"""The end-to-end benchmark: a training step (forward + backward with labels) of one workload under
each backend, each on a fresh model with the same seed, with memory freed in between (the inference
workload, prefill and a static-cache decode step, is in :mod:`.inference`)."""

from __future__ import annotations

import gc
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .backends import BackendUnavailable, backend
from ..measure.environment import describe_environment
from .report import annotate_model_rows
from .results import BenchResult, ModelRow
from ..measure.clock import DeviceClock
from .timing import GIB, time_training_steps
from .workloads import build_model, get_workload, make_batch

__all__ = ["ModelBenchOptions", "run_model_bench"]

StepProgressFactory = Callable[[int, str], Any]  # (total steps, label) -> object with tick() and close()


@dataclass(frozen=True)
class ModelBenchOptions:
    model: str
    backends: list[str]
    batch: int
    seq: int
    dtype: torch.dtype
    steps: int
    warmup: int
    device: torch.device
    tiny: bool = False
    seed: int = 0
    loss_rtol: float | None = None  # None: by dtype (twinkle_fx.core.tolerances, loss_rtol)
    profile_dir: Path | None = None  # --profile: a trace and a report per backend under it (see .profile)
    # --repeat-first: the first backend runs once more after the others, as "<name> again": the two rows of the
    # same code differ only by what changed on the machine in between (clocks, heat, memory)
    repeat_first: bool = False


def _training_step(model: torch.nn.Module, input_ids: torch.Tensor, labels: torch.Tensor) -> Callable[[], torch.Tensor]:
    def step() -> torch.Tensor:
        # gradients of the previous step are freed first, as an optimizer's zero_grad would
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        return loss.detach()

    return step



def _gib(n: int | None) -> float | None:
    return None if n is None else n / GIB


def _run_backend(name: str, options: ModelBenchOptions, batch: tuple[torch.Tensor, torch.Tensor],
                 clock: DeviceClock, progress: Callable[[str], None], step_progress: StepProgressFactory | None,
                 profile_name: str) -> ModelRow:
    """One backend, start to finish; every error becomes a row; its profile (--profile) goes under
    ``profile_name``. Everything it allocated is unreachable when it returns, so the caller's cleanup can free it."""
    workload = get_workload(options.model)
    try:
        model = build_model(workload, tiny=options.tiny, dtype=options.dtype, device=options.device, seed=options.seed)
        bar = None

        def first_step(t) -> None:
            nonlocal bar
            progress(f"    first step {t.first_step_s:.2f} s, loss {t.first_loss:.5f}; timing ...")
            if step_progress is not None:
                bar = step_progress(options.warmup + options.steps, f"    {name}")

        with backend(name).prepare(model, workload.family, options.device) as prepared:
            try:
                timing = time_training_steps(
                    _training_step(prepared.model, *batch), clock, warmup=options.warmup, steps=options.steps,
                    on_first_step=first_step, on_step=lambda: bar.tick() if bar is not None else None,
                )
            finally:
                if bar is not None:
                    bar.close()
            profiled = None
            if options.profile_dir is not None:
                from .profile import profile_steps, summary_notes

                profiled = summary_notes(profile_steps(
                    _training_step(prepared.model, *batch), clock, options.profile_dir / profile_name,
                    steps=min(options.steps, 3), title=f"{name} ({options.model}, batch {options.batch} x {options.seq})"))
                progress(f"    profile: {profiled['report']}")
        notes = prepared.notes  # complete only once the backend has exited (e.g. compile reports)
        if profiled is not None:
            notes = {**notes, "profile": profiled}
        if timing.gpu_state is not None:
            notes = {**notes, "gpu_state": timing.gpu_state.to_json()}
            progress(f"    GPU during the timed steps: {timing.gpu_state.describe()}")
    except BackendUnavailable as e:
        return ModelRow(name, status="unavailable", error=str(e))
    except Exception as e:  # noqa: BLE001 - a failing backend is a result, the run goes on
        return ModelRow(name, status="failed", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
    tokens = options.batch * options.seq
    return ModelRow(
        name,
        tokens_per_s=tokens / (timing.mean_ms / 1e3),
        ms_per_step=timing.mean_ms,
        median_ms=timing.median_ms,
        step_ms=timing.step_ms,
        host_ms=statistics.median(timing.host_ms) if timing.host_ms else None,
        peak_gib=_gib(timing.peak_bytes),
        peak_reserved_gib=_gib(timing.peak_reserved_bytes),
        first_step_peak_gib=_gib(timing.first_step_peak_bytes),
        resident_gib=_gib(timing.resident_bytes),
        first_step_s=timing.first_step_s,
        first_loss=timing.first_loss,
        last_loss=timing.last_loss,
        notes=notes,
    )


def free_device_memory(device: torch.device) -> None:
    """Drop compiled graphs and cached blocks so the next backend starts from an empty device."""
    gc.collect()
    torch.compiler.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def warm_compiler(device: torch.device, backends: list[str], progress: Callable[[str], None] = print) -> float | None:
    """On a GPU, compile and run a small forward and backward with Inductor once, before the first
    backend, when any of ``backends`` compiles; returns the seconds it took (None: not done).

    What a process pays once, on its first Inductor compile (the pool of compile workers, CUDA and
    cuBLAS initialisation, Triton's driver and its C helper), would otherwise be charged to the
    first backend's first step: the "1st step s" column compares what each backend compiles."""
    if device.type != "cuda" or not any("inductor" in name or "twinkle" in name for name in backends):
        return None  # CPU runs are smoke tests (--tiny): their first-step column compares nothing
    start = time.perf_counter()
    try:
        layer = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64)).to(device)
        x = torch.randn(8, 64, device=device, requires_grad=True)
        torch.compile(layer)(x).sum().backward()
        torch.cuda.synchronize(device)
    except Exception as e:  # noqa: BLE001 - the compiled rows will fail with the reason; the run goes on
        progress(f"compiler warm-up failed ({type(e).__name__}: {e}); first steps include the start-up")
        return None
    finally:
        torch.compiler.reset()
    elapsed = time.perf_counter() - start
    progress(f"compiler warmed up in {elapsed:.1f} s (a small Inductor compile: worker pool, CUDA, Triton; "
             "not counted in any first step)")
    return elapsed


def run_model_bench(options: ModelBenchOptions, progress: Callable[[str], None] = print,
                    step_progress: StepProgressFactory | None = None) -> BenchResult:
    """Benchmark ``options.backends`` on ``options.model``; rows come back in the order asked, each
    compared with eager (loss) and with eager and Inductor (ratios).

    ``progress`` gets one line per backend and event; ``step_progress(total, label)``, when given,
    makes an object whose ``tick()`` runs after each warm-up and timed step and ``close()`` at the end
    (the command line passes a tqdm bar).

    Examples:
        >>> options = ModelBenchOptions(model="qwen2", backends=["eager", "kernelize"], batch=2, seq=32,
        ...                             dtype=torch.float32, steps=2, warmup=1, device=torch.device("cpu"),
        ...                             tiny=True)
        >>> # not run by the doctest test: benchmarks take tens of seconds even tiny (tests/bench runs them)
        >>> result = run_model_bench(options)                                   # doctest: +SKIP
    """
    workload = get_workload(options.model)
    batch = make_batch(workload, tiny=options.tiny, batch=options.batch, seq=options.seq,
                       device=options.device, seed=options.seed)
    clock = DeviceClock(options.device)
    rows: list[ModelRow] = []
    runs = list(options.backends) + (list(options.backends[:1]) if options.repeat_first else [])
    total = len(runs)
    warm_compiler(options.device, options.backends, progress)
    for index, name in enumerate(runs, 1):
        again = index > len(options.backends)
        progress(f"[{index}/{total}] {name}{' again' if again else ''}: {backend(name).description}; fresh model, "
                 f"first step, {options.warmup} warm-up + {options.steps} timed steps ...")
        # the repeated backend's profile beside the first one's, not over it
        row = _run_backend(name, options, batch, clock, progress, step_progress, f"{name}-again" if again else name)
        if again:
            row.backend = f"{name} again"
        free_device_memory(options.device)
        rows.append(row)
        progress(f"[{index}/{total}] {row}")
    annotate_model_rows(rows, dtype=options.dtype, rtol=options.loss_rtol)
    return BenchResult(
        kind="model",
        environment=describe_environment(options.device),
        workload={
            **workload.describe(tiny=options.tiny),
            "batch": options.batch,
            "seq": options.seq,
            "tokens_per_step": options.batch * options.seq,
            "dtype": str(options.dtype).removeprefix("torch."),
            "step": "forward + backward with labels",
            "steps": options.steps,
            "warmup": options.warmup,
            "seed": options.seed,
            "tiny": options.tiny,
        },
        rows=rows,
    )
