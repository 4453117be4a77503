"""Judging and showing results: loss agreement and ratios, the terminal table, the JSON file and the
PNG bar chart."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch

from ..core.tolerances import tolerance
from ..measure.gpu_state import GpuState
from .results import BenchResult, MicroRow, ModelRow

__all__ = ["annotate_model_rows", "annotate_micro_rows", "format_table", "write_outputs",
           "plot"]

_MEASURED = ("ok", "wrong")


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0 or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def _reference(rows: Sequence, key) -> object | None:
    for row in rows:
        if key(row) and row.status in _MEASURED:
            return row
    return None


def annotate_model_rows(rows: Sequence[ModelRow], *, dtype: torch.dtype, rtol: float | None = None) -> None:
    """Check every measured row's first-step loss against eager's and its last step's loss against
    its first (weights and batch do not change between steps; a CUDA graph replaying the wrong memory
    would change it), marking disagreement "wrong", and fill in the ratios to eager and to Inductor;
    rows without the reference get none."""
    # the dtype's loss_rtol: kernels that accumulate in another order (Inductor's fused reductions,
    # a fused cross-entropy) move a ~12.0 random-init loss by a few 1e-3 at most in bf16, ~1e-6 in
    # fp32; a real bug (wrong ignore_index, a dropped residual) moves it far more
    rtol = tolerance(dtype).loss_rtol if rtol is None else rtol
    eager = _reference(rows, lambda r: r.backend == "eager")
    inductor = _reference(rows, lambda r: r.backend == "inductor")
    for row in rows:
        if row.status not in _MEASURED:
            continue
        if eager is None:
            row.loss_check = "not checked: no eager row in this run"
        elif row is not eager:
            diff = abs(row.first_loss - eager.first_loss)
            agrees = diff <= rtol * abs(eager.first_loss)  # False for NaN
            row.loss_check = (f"{row.first_loss:.6f} vs eager {eager.first_loss:.6f} "
                              f"(|diff| {diff:.2e}, tolerance {rtol:g} relative)")
            row.status = "ok" if agrees else "wrong"
        if row.last_loss is not None:
            diff = abs(row.last_loss - row.first_loss)
            if not diff <= rtol * abs(row.first_loss):  # NaN too
                row.status = "wrong"
                row.loss_check = ((row.loss_check + "; ") if row.loss_check else "") + (
                    f"a later step's loss {row.last_loss:.6f} differs from the first step's {row.first_loss:.6f} "
                    f"(|diff| {diff:.2e}) with the same weights and batch")
        for reference, ratios in ((eager, row.vs_eager), (inductor, row.vs_inductor)):
            if reference is None:
                continue
            ratios.clear()
            ratios["throughput"] = _ratio(row.tokens_per_s, reference.tokens_per_s)
            ratios["memory"] = _ratio(row.peak_gib, reference.peak_gib)
            if reference is inductor:
                ratios["first_step"] = _ratio(row.first_step_s, reference.first_step_s)


def annotate_micro_rows(rows: Sequence[MicroRow]) -> None:
    """Speed-ups of every measured row over eager and Inductor of the same op and phase."""
    for row in rows:
        if row.status not in _MEASURED or row.op == "copy":
            continue
        for impl, attr in (("eager", "vs_eager"), ("inductor", "vs_inductor")):
            ref = _reference(rows, lambda r: (r.op, r.phase, r.impl) == (row.op, row.phase, impl))
            setattr(row, attr, None if ref is None else _ratio(ref.ms, row.ms))
            if impl == "inductor" and ref is not None and ref.kernel_ms is not None and row.kernel_ms is not None:
                row.kernel_vs_inductor = _ratio(ref.kernel_ms, row.kernel_ms)


# ---------------------------------------------------------------- terminal table


def _fmt(value, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def _table(header: list[str], body: list[list[str]], right: set[int]) -> str:
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, body)])


def _model_table(result: BenchResult) -> str:
    memory_na = "n/a" if result.environment.get("device_type") != "cuda" else "-"
    header = ["backend", "tok/s", "ms/step", "host ms", "peak GiB", "reserved GiB", "1st step s", "1st loss",
              "speed/eager", "speed/ind", "mem/eager", "mem/ind", "1st/ind", "status"]
    body = []
    for r in result.rows:
        e, i = r.vs_eager, r.vs_inductor
        body.append([
            r.backend, _fmt(r.tokens_per_s, ",.0f"), _fmt(r.ms_per_step, ".1f"), _fmt(r.host_ms, ".1f"),
            _fmt(r.peak_gib, ".2f", memory_na), _fmt(r.peak_reserved_gib, ".2f", memory_na),
            _fmt(r.first_step_s, ".2f"), _fmt(r.first_loss, ".5f"),
            _fmt(e.get("throughput"), ".2f"),
            _fmt(i.get("throughput"), ".2f"), _fmt(e.get("memory"), ".2f"), _fmt(i.get("memory"), ".2f"),
            _fmt(i.get("first_step"), ".2f"), "WRONG" if r.status == "wrong" else r.status,
        ])
    notes = [f"  {r.backend}: {r.status}: {r.error}" for r in result.rows if r.status in ("failed", "unavailable")]
    notes += [f"  {r.backend}: WRONG: {r.loss_check}" for r in result.rows if r.status == "wrong"]
    notes += [f"  {r.backend}: {_swap_summary(r.notes)}" for r in result.rows if r.notes.get("swapped_layers") is not None]
    notes += [f"  {r.backend}: {_compile_summary(r.notes)}" for r in result.rows if r.notes.get("graphs") is not None]
    notes += [f"  {r.backend}: {r.notes['cuda_graphs']}" for r in result.rows if r.notes.get("cuda_graphs")]
    # compiled rows with mode="reduce-overhead": was each graph captured, and if not why (backends.py)
    notes += [f"  {r.backend}: {r.notes['cudagraphs']}; {r.notes.get('cudagraph_tree', '')}".rstrip("; ")
              for r in result.rows if r.notes.get("cudagraphs")]
    notes += [_profile_note(r) for r in result.rows if (r.notes or {}).get("profile")]
    notes += [f"  {r.backend}: GPU during the timed steps: {GpuState.from_json(r.notes['gpu_state']).describe()}"
              for r in result.rows if (r.notes or {}).get("gpu_state")]
    w = result.workload
    title = (f"{w['model']} ({w['shape_of']}), batch {w['batch']} x {w['seq']}, {w['dtype']}, "
             f"{w['step']}; {w['steps']} timed steps after {w['warmup']} warm-up")
    text = "\n".join([title, _environment_line(result), "", _table(header, body, set(range(1, 13))),
                      "  host ms: host time of a step with the device running behind it; near ms/step = host-bound",
                      "  peak GiB: allocated at the peak of the warm-up and timed steps (CUDA graphs are recorded in "
                      "a warm-up step: their replays allocate nothing); reserved GiB: held by the allocator then "
                      "(cached blocks and CUDA-graph pools included)",
                      "  1st step s: wall time of the first step, compilation included; the process's one-time start-up "
                      "(compile workers, CUDA, Triton) is paid by a small compile before the first row (on a GPU)"])
    return text + ("\n\n" + "\n".join(notes) if notes else "")


def _profile_note(row) -> str:
    from .profile import host_us_per_kernel

    profile = row.notes["profile"]
    text = f"  {row.backend}: profiled: {profile['host_ms_per_step']:.1f} ms wall"
    if profile.get("device_ms_per_step") is not None:
        text += f", {profile['device_ms_per_step']:.1f} ms device, {profile['launches_per_step']:.0f} launches"
        if profile.get("kernels_per_step") is not None:  # older saved results lack it
            text += f" and {profile['kernels_per_step']:.0f} device operations"
        text += " per step"
    per_kernel = host_us_per_kernel(row.host_ms, profile)
    if per_kernel is not None:
        text += f"; host us per kernel call {per_kernel:.1f} (host ms / device operations)"
    return text


def _swap_summary(notes: dict) -> str:
    layers = notes.get("swapped_layers") or {}
    functions = notes.get("patched_functions") or []
    by_name: dict[str, int] = {}
    for qualified in functions:
        by_name[qualified.rsplit(".", 1)[-1]] = by_name.get(qualified.rsplit(".", 1)[-1], 0) + 1
    parts = [f"{count} x {what}" for what, count in layers.items()]
    parts += [f"{name} patched in {count} module(s)" for name, count in by_name.items()]
    return "kernelized: " + (", ".join(parts) if parts else "nothing swapped (no built-in kernel for this device/mode)")


def _compile_summary(notes: dict) -> str:
    swapped = ", ".join(f"{count} x {what}" for what, count in notes.get("swapped_regions", {}).items())
    kept = "; ".join(f"{count} x {what}" for what, count in notes.get("kept_regions", {}).items())
    text = (f"compiled {notes['graphs']} graph(s), {notes['graph_breaks']} graph break(s); "
            f"swapped: {swapped or 'nothing'}")
    return text + (f"; kept: {kept}" if kept else "")


def _micro_table(result: BenchResult) -> str:
    header = ["op", "phase", "impl", "ms", "GB/s", "of copy", "TFLOP/s", "extra GiB", "vs eager", "vs ind",
              "kernel ms", "kern/ind", "host us", "rel err", "status"]
    body, shapes = [], {}
    for r in result.rows:
        shapes.setdefault(r.op, r.shape)
        body.append([
            r.op, r.phase, r.impl, _fmt(r.ms, ".3f"), _fmt(r.gbps, ",.0f"),
            _fmt(None if r.copy_fraction is None else 100 * r.copy_fraction, ".0f") + ("%" if r.copy_fraction is not None else ""),
            _fmt(r.tflops, ".1f"), _fmt(r.extra_gib, ".3f", "n/a" if r.ms is not None else "-"),
            _fmt(r.vs_eager, ".2f"), _fmt(r.vs_inductor, ".2f"), _fmt(r.kernel_ms, ".3f"),
            _fmt(r.kernel_vs_inductor, ".2f"), _host_cell(r), _fmt(r.max_rel_error, ".1e"),
            "WRONG" if r.status == "wrong" else r.status,
        ])
    problems: dict[tuple[str, str, str], list[str]] = {}  # one line per (impl, status, error)
    for r in result.rows:
        if r.status in ("failed", "unavailable"):
            problems.setdefault((r.impl, r.status, r.error or ""), []).append(f"{r.op} {r.phase}")
    notes = [f"  {impl} ({', '.join(where)}): {status}: {error}" for (impl, status, error), where in problems.items()]
    shape_lines = [f"  {op}: {shape}" for op, shape in shapes.items()]
    w = result.workload
    title = f"kernel microbenchmarks, {w['dtype']}; median of {w['reps']} after {w['warmup']} warm-up calls"
    text = "\n".join([title, _environment_line(result), "", _table(header, body, set(range(3, 14))),
                      "  kernel ms (GPU): the call's kernels alone, from the profiler, cold L2: what a CUDA-graphed step "
                      "pays; ms also holds any wait for the host to launch them",
                      "  host us: host time per call, device unsynchronised; fwd: no grad; fwd+bwd: forward "
                      "recording autograd + backward (per node of one autograd.grad over several calls)",
                      "", "shapes:", *shape_lines])
    return text + ("\n\n" + "\n".join(notes) if notes else "")


def _host_cell(r: MicroRow) -> str:
    if r.host_us is None:
        return "-"
    if r.host_bwd_us is None:
        return f"{r.host_us:.1f}"
    return f"{r.host_us - r.host_bwd_us:.1f}+{r.host_bwd_us:.1f}"


def _environment_line(result: BenchResult) -> str:
    env = result.environment
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v and k in ("torch", "triton",
                                                                                         "transformers", "liger-kernel"))
    interp = " (Triton interpreter)" if env.get("triton_interpret") else ""
    commit = env.get("commit") or "?"
    if env.get("commit_dirty"):
        commit += " + uncommitted changes"
    return f"{env['device']}{interp}; {versions}; {env['date']}; commit {commit}"


def _inference_table(result: BenchResult) -> str:
    """The inference result as a plain-text table."""
    header = ["backend", "prefill ms", "prefill tok/s", "decode ms", "decode tok/s", "1st prefill s", "1st decode s",
              "prefill/ind+CG", "decode/ind+CG", "status"]
    body = []
    for r in result.rows:
        cg = r.vs.get("inductor+cudagraphs", {})
        body.append([r.backend, _fmt(r.prefill_ms, ".3f"), _fmt(r.prefill_tokens_per_s, ",.0f"),
                     _fmt(r.decode_ms, ".3f"), _fmt(r.decode_tokens_per_s, ",.0f"), _fmt(r.prefill_first_s, ".1f"),
                     _fmt(r.decode_first_s, ".1f"), _fmt(cg.get("prefill"), ".2f"), _fmt(cg.get("decode"), ".2f"),
                     "WRONG" if r.status == "wrong" else r.status])
    notes = [f"  {r.backend}: {r.status}: {r.error}" for r in result.rows if r.status in ("failed", "unavailable")]
    notes += [f"  {r.backend}: WRONG: logits rel. error prefill {r.prefill_rel_error:.2e}, decode "
              f"{r.decode_rel_error:.2e}" for r in result.rows if r.status == "wrong"]
    notes += [f"  {r.backend}: {r.notes['cudagraphs']}" for r in result.rows if r.notes.get("cudagraphs")]
    notes += [f"  {r.backend}: {r.notes['cuda_graphs']}" for r in result.rows if r.notes.get("cuda_graphs")]
    notes += [f"  {r.backend}: {line}" for r in result.rows for line in r.notes.get("cuda_graphs_timed", ())]
    notes += [f"  {r.backend}: {_compile_summary(r.notes)}" for r in result.rows if r.notes.get("graphs") is not None]
    w = result.workload
    title = f"{w['model']} ({w['shape_of']}), {w['dtype']}, no grad; prefill {w['prefill']}; decode {w['decode']}"
    text = "\n".join([title, _environment_line(result), "", _table(header, body, set(range(1, 9)))])
    return text + ("\n\n" + "\n".join(notes) if notes else "")


def format_table(result: BenchResult) -> str:
    """The result as a plain-text table for the terminal (and for pasting into the README)."""
    if result.kind == "inference":  # the inference workload
        return _inference_table(result)
    return _model_table(result) if result.kind == "model" else _micro_table(result)


# ---------------------------------------------------------------- files


def write_outputs(result: BenchResult, out_dir: Path, stem: str) -> list[Path]:
    """``<stem>.json`` and ``<stem>.png`` in ``out_dir``; returns the files written (no PNG without
    matplotlib, which the reply says)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{stem}.json"
    result.save(json_path)
    written = [json_path]
    png_path = out_dir / f"{stem}.png"
    if plot(result, png_path):
        written.append(png_path)
    return written


def _pyplot():
    try:
        import matplotlib
    except ModuleNotFoundError:
        return None
    matplotlib.use("Agg")  # files only; never a window
    import matplotlib.pyplot as plt

    return plt


_COLORS = {"eager": "#8c8c8c", "inductor": "#4c72b0", "twinkle": "#dd8452", "kernelize+twinkle": "#c44e52",
           "kernelize": "#55a868",
           "liger": "#8172b3", "liger+inductor": "#937860"}


def plot(result: BenchResult, path: Path) -> bool:
    """Write the bar chart of ``result`` to ``path``; False when matplotlib is not installed."""
    plt = _pyplot()
    if plt is None or result.kind == "inference":  # no chart for the inference table yet
        return False
    fig = _plot_model(plt, result) if result.kind == "model" else _plot_micro(plt, result)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return True


def _headroom(ax, values: list[float | None], lines: int) -> None:
    """Leave room above the tallest bar for its value label (``lines`` lines of 8-pt text), so labels
    never reach the axes title."""
    top = max((v for v in values if v is not None), default=0.0) or 1.0
    ax.set_ylim(0, top * (1.12 + 0.09 * lines))


def _bars(ax, labels: list[str], values: list[float | None], colors: list[str], fmt: str, wrong: list[bool],
          extra: list[str] | None = None) -> None:
    heights = [0.0 if v is None else v for v in values]
    bars = ax.bar(range(len(labels)), heights, color=colors, edgecolor=["red" if w else "none" for w in wrong],
                  linewidth=2)
    lines = 1
    for i, (bar, value, is_wrong) in enumerate(zip(bars, values, wrong)):
        text = "n/a" if value is None else format(value, fmt) + (" WRONG" if is_wrong else "")
        if extra and extra[i]:
            text += "\n" + extra[i]
        lines = max(lines, text.count("\n") + 1)
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), xytext=(0, 2),
                    textcoords="offset points", ha="center", va="bottom", fontsize=8)
    _headroom(ax, values, lines)
    # rotated and anchored at their right end, long backend names ("kernelize+twinkle") never overlap
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", rotation_mode="anchor", fontsize=9)


def _ratio_labels(rows: Sequence[ModelRow], key: str) -> list[str]:
    labels = []
    for r in rows:
        parts = [f"{ratios[key]:.2f}x {name}" for name, ratios in (("eager", r.vs_eager), ("ind.", r.vs_inductor))
                 if ratios.get(key) is not None and r.backend not in (name, "inductor" if name == "ind." else "")]
        labels.append("\n".join(parts))
    return labels


def _measured_on(result: BenchResult) -> str:
    """The title's device part; an interpreter run says so, since its times measure the interpreter."""
    env = result.environment
    where = f"{env['device']}, torch {env['versions'].get('torch')}, {env['date']}"
    if env.get("commit"):
        where += f", commit {env['commit']}"
    if env.get("triton_interpret"):
        where = "TRITON INTERPRETER (CPU): times measure the interpreter, not the kernels - " + where
    return where


def _plot_model(plt, result: BenchResult):
    rows = result.rows
    labels = [r.backend if r.status in _MEASURED else f"{r.backend} ({r.status})" for r in rows]
    colors = [_COLORS.get(r.backend, "#c44e52") for r in rows]
    wrong = [r.status == "wrong" for r in rows]
    has_memory = any(r.peak_gib is not None for r in rows)  # no allocator statistics on the CPU: no panel
    fig, axes = plt.subplots(1, 2 if has_memory else 1, figsize=(13, 5.5) if has_memory else (7.5, 5.5), squeeze=False)
    ax_speed = axes[0][0]
    _bars(ax_speed, labels, [r.tokens_per_s for r in rows], colors, ",.0f", wrong, _ratio_labels(rows, "throughput"))
    ax_speed.set_ylabel("tokens / s (higher is better)")
    ax_speed.set_title("training throughput", pad=8)
    if has_memory:
        ax_mem = axes[0][1]
        _bars(ax_mem, labels, [r.peak_gib for r in rows], colors, ".2f", wrong, _ratio_labels(rows, "memory"))
        ax_mem.set_ylabel("peak allocated GiB (lower is better)")
        ax_mem.set_title("peak memory", pad=8)
    w = result.workload
    fig.suptitle(f"{w['model']} ({w['shape_of']}), batch {w['batch']} x {w['seq']} tokens, {w['dtype']}, "
                 f"forward + backward\n{_measured_on(result)}", fontsize=10)
    fig.tight_layout()
    return fig


def _plot_micro(plt, result: BenchResult):
    measured = [r for r in result.rows if r.status in _MEASURED and r.op != "copy"]
    # against the copy roofline only where the device has one worth the name: the interpreter's
    # "bandwidth" is Python's, and CPU rows reached 151% of a CPU copy; there, speed-up over eager
    roofline = result.environment.get("device_type") == "cuda" and not result.environment.get("triton_interpret")
    if roofline:
        def value(r):
            return None if r.copy_fraction is None else 100 * r.copy_fraction
    else:
        def value(r):
            return r.vs_eager
    groups = list(dict.fromkeys((r.op, r.phase) for r in measured if r.gbps is not None))
    impls = list(dict.fromkeys(r.impl for r in measured))
    flce = [r for r in measured if r.tflops is not None and r.phase == "fwd+bwd"]
    show_memory = any(r.extra_gib is not None for r in flce)
    side = (1 + show_memory) if flce else 0
    width_in = max(9.0, 1.0 * len(groups)) + 3.2 * side
    fig, axes = plt.subplots(1, 1 + side, figsize=(width_in, 7.5), squeeze=False,
                             gridspec_kw={"width_ratios": [4] + [1] * side} if side else None)
    ax = axes[0][0]
    width = 0.8 / max(len(impls), 1)
    tallest = 0.0
    for k, impl in enumerate(impls):
        xs, ys, edges = [], [], []
        for g, group in enumerate(groups):
            row = next((r for r in measured if (r.op, r.phase) == group and r.impl == impl), None)
            if row is not None and value(row) is not None:
                xs.append(g + k * width)
                ys.append(value(row))
                edges.append("red" if row.status == "wrong" else "none")
        tallest = max([tallest, *ys])
        ax.bar(xs, ys, width, label=impl, color=_COLORS.get(impl, "#c44e52"), edgecolor=edges, linewidth=2)
    ax.axhline(100 if roofline else 1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_ylim(0, max(tallest, 100 if roofline else 1.0) * 1.12)
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))], [f"{op} {phase}" for op, phase in groups],
                  fontsize=8, rotation=35, ha="right", rotation_mode="anchor")
    # the shapes, one line per op, under the chart (in the tick labels they made them overlap)
    shapes = dict.fromkeys(op for op, _ in groups)
    ax.text(0.0, -0.42, "\n".join(f"{op}: {next(r.shape for r in measured if r.op == op)}" for op in shapes),
            transform=ax.transAxes, fontsize=7, va="top", ha="left", family="monospace")
    if roofline:
        ax.set_ylabel("% of device-to-device copy GB/s (dashed: the copy)")
        ax.set_title("memory-bound kernels: achieved bandwidth (higher is better)", pad=8)
    else:
        ax.set_ylabel("speed-up over eager (x; dashed: eager)")
        ax.set_title("memory-bound kernels: speed-up over eager (no copy roofline off the GPU)", pad=8)
    # outside the axes, so it never covers a bar
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), title="implementation", title_fontsize=8)
    if flce:
        labels = [r.impl for r in flce]
        colors = [_COLORS.get(r.impl, "#c44e52") for r in flce]
        wrong = [r.status == "wrong" for r in flce]
        _bars(axes[0][1], labels, [r.ms for r in flce], colors, ".2f", wrong)
        axes[0][1].set_title(f"{flce[0].op}\n{flce[0].shape}\nfwd+bwd ms (lower is better)", fontsize=8, pad=8)
        if show_memory:
            _bars(axes[0][2], labels, [r.extra_gib for r in flce], colors, ".2f", wrong)
            axes[0][2].set_title("extra GiB (lower is better)", fontsize=8, pad=8)
    fig.suptitle(f"twinkle_triton kernels, {result.workload['dtype']}\n{_measured_on(result)}", fontsize=10)
    fig.tight_layout()
    return fig
