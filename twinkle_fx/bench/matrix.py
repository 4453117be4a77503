"""``twinkle-fx bench --matrix``: the training step of several model shapes under the recipes a user
chooses between, in one table.

Each model runs the model benchmark (:mod:`.model_bench`: fresh model per backend, same seed and
batch, first step timed apart, memory freed in between), one model after the other. The first
backend of the list is the reference of each model: its ratios (speed, peak memory, first-step
time) are 1.00, and every other row's first-step loss is checked against its loss with the dtype's
tolerance (``twinkle_fx.core.tolerances``), as the single-model benchmark checks against eager.

The default models are dense shapes from 0.5B to 3B and two MoE slices (full layer shapes, a few
layers); the default backends are torch.compile with CUDA graphs (plain and with Cut
Cross-Entropy's loss), Liger with torch.compile, and twinkle's two CUDA-graph forms. ``--tiny`` runs
the same loop on the tiny configs on the CPU (eager and kernelize), the form CI runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from ..core.tolerances import tolerance
from ..measure.environment import describe_environment
from .model_bench import ModelBenchOptions, run_model_bench
from .results import BenchResult, ModelRow

__all__ = ["MATRIX_MODELS", "MATRIX_BACKENDS", "TINY_MATRIX_BACKENDS", "run_matrix", "format_matrix", "matrix_failed"]

MATRIX_MODELS = ("qwen2", "llama1b", "qwen3_1_7b", "llama3b", "qwen3_moe", "qwen3_moe_8l", "mixtral")
MATRIX_BACKENDS = ("inductor+cudagraphs", "inductor+cudagraphs+cce", "liger+inductor", "twinkle+cudagraphs",
                   "kernelize+cudagraphs")
TINY_MATRIX_BACKENDS = ("eager", "kernelize")

_MEASURED = ("ok", "wrong")


def _check_against_reference(result: BenchResult, rtol: float) -> None:
    """Each row's first-step loss against the first measured row's, and the ratios to it."""
    rows = [r for r in result.rows if r.status in _MEASURED]
    if not rows:
        return
    reference = rows[0]
    for row in rows:
        row.vs_reference = {
            "throughput": row.tokens_per_s / reference.tokens_per_s if reference.tokens_per_s else None,
            "memory": row.peak_gib / reference.peak_gib if row.peak_gib and reference.peak_gib else None,
            "first_step": row.first_step_s / reference.first_step_s if reference.first_step_s else None,
        }
        if any(r.backend == "eager" for r in rows):
            continue  # the model benchmark checked every loss against eager's already
        if row is reference:
            row.loss_check = None  # not "no eager row": the others are checked against this one
            continue
        diff = abs(row.first_loss - reference.first_loss)
        agrees = diff <= rtol * abs(reference.first_loss)  # False for NaN
        row.loss_check = (f"{row.first_loss:.6f} vs {reference.backend} {reference.first_loss:.6f} "
                          f"(|diff| {diff:.2e}, tolerance {rtol:g} relative)")
        if not agrees:
            row.status = "wrong"


def run_matrix(models: tuple[str, ...], options: ModelBenchOptions,
               progress: Callable[[str], None] = print) -> dict[str, Any]:
    """The model benchmark of ``options`` (its ``model`` ignored) for each of ``models``; a dict with
    the environment, the shared options and one result per model."""
    results = []
    for index, model in enumerate(models, 1):
        progress(f"=== [{index}/{len(models)}] {model}")
        # --profile DIR: each model's rows under DIR/<model>/, not over the previous model's
        profile_dir = None if options.profile_dir is None else options.profile_dir / model
        result = run_model_bench(replace(options, model=model, profile_dir=profile_dir), progress=progress)
        _check_against_reference(result, options.loss_rtol or tolerance(options.dtype).loss_rtol)
        results.append(result)
    return {
        "kind": "matrix",
        "environment": describe_environment(options.device),
        "options": {k: str(v) for k, v in asdict(options).items() if k not in ("model", "profile_dir")},
        "results": [r.to_json() for r in results],
    }


def _cell(value: float | None, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def format_matrix(matrix: dict[str, Any]) -> str:
    """One Markdown table: a row per model and backend, ratios to each model's first backend."""
    env = matrix["environment"]
    versions = env.get("versions", {})
    lines = [f"{env.get('device')}; torch {versions.get('torch')}, transformers {versions.get('transformers')}; "
             f"commit {env.get('commit')}",
             "",
             "| model | backend | ms/step | tokens/s | speed | peak GiB | memory | reserved GiB | 1st step s "
             "| 1st step | loss at step 0 | SM MHz |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for result in matrix["results"]:
        workload = result["workload"]
        name = f"{workload['model']} ({workload['shape_of']}), {workload['batch']}×{workload['seq']}"
        for row in (ModelRow(**r) for r in result["rows"]):
            if row.status not in _MEASURED:
                lines.append(f"| {name} | {row.backend} | {row.status}: {(row.error or '').splitlines()[0][:120]} "
                             "| | | | | | | | | |")
                continue
            ratios = row.vs_reference
            check = ("WRONG: " + (row.loss_check or "")) if row.status == "wrong" else (
                "agrees" if row.loss_check else "reference")
            lines.append(
                f"| {name} | {row.backend} | {_cell(row.ms_per_step, '.2f')} | {_cell(row.tokens_per_s, ',.0f')} "
                f"| {_cell(ratios.get('throughput'), '.2f')}× | {_cell(row.peak_gib, '.2f')} "
                f"| {_cell(ratios.get('memory'), '.2f')}× | {_cell(row.peak_reserved_gib, '.2f')} "
                f"| {_cell(row.first_step_s, '.1f')} | {_cell(ratios.get('first_step'), '.2f')}× | {check} "
                f"| {_sm_clock(row.notes)} |")
    lines += ["", "SM MHz: the GPU's mean SM clock during the timed steps (min, when lower by 2% or more): rows "
                  "compare only at like clocks (a GPU at its power or thermal limit slows down). A mean over the step: "
                  "at the power cap its GEMMs run below it; --repeat-first measures the run's spread"]
    return "\n".join(lines) + "\n"


def _sm_clock(notes: dict[str, Any]) -> str:
    state = (notes or {}).get("gpu_state")
    if not state:
        return "–"
    low = f" (min {state['sm_mhz_min']:.0f})" if state["sm_mhz_min"] < 0.98 * state["sm_mhz_mean"] else ""
    return f"{state['sm_mhz_mean']:.0f}{low}"


def matrix_failed(matrix: dict[str, Any]) -> bool:
    """Whether a row of the matrix failed or disagrees with its reference."""
    return any(row["status"] in ("failed", "wrong") for result in matrix["results"] for row in result["rows"])
