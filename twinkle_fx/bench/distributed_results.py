"""What a run of :mod:`twinkle_fx.bench.distributed` reports: the swaps of every rank, the run's steps,
and the markdown table rank 0 prints (with the comparison against single-device baselines)."""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = ["COMPILED", "RankSwaps", "RunResult", "communication_row", "describe", "describe_args", "from_json",
           "kernel_swaps_compiled", "load_baseline", "merge", "scaling_table", "table"]
# the --backend values that compile
COMPILED = ("inductor", "twinkle", "kernelize+twinkle")


@dataclass
class RankSwaps:
    """What twinkle_fx swapped on one rank: compile-report regions and eagerly swapped modules/functions."""

    rank: int
    graphs: int = 0
    graph_breaks: int = 0
    swapped: dict[str, int] = field(default_factory=dict)  # "layer Qwen2RMSNorm -> RMSNorm": count
    kept: dict[str, int] = field(default_factory=dict)  # "<target>: <reason>": count
    graphs_with_swaps: int = 0

    @property
    def total(self) -> int:
        return sum(self.swapped.values())

    def short(self) -> str:
        """``97 (26 graphs)``: swaps, and the compiled graphs when there are any."""
        return f"{self.total}" + (f" ({self.graphs} graph(s), {self.graphs_with_swaps} with swaps)" if self.graphs else "")

    def __str__(self) -> str:
        head = f"rank {self.rank}: {self.total} swap(s)"
        if self.graphs:
            head += (f"; {self.graphs} compiled graph(s), {self.graphs_with_swaps} with backend swaps,"
                     f" {self.graph_breaks} ended at a graph break")
        lines = [head, *(f"  {n} x {what}" for what, n in sorted(self.swapped.items()))]
        lines += [f"  kept {n} x {what}" for what, n in sorted(self.kept.items())]
        return "\n".join(lines)


@dataclass
class RunResult:
    """What rank 0 reports (``--out`` writes it)."""

    args: dict[str, Any]
    world_size: int
    device: str
    losses: list[float]
    tokens_per_s: list[float]
    swaps: list[RankSwaps]
    step_ms: list[float] = field(default_factory=list)
    peak_gib: list[float | None] = field(default_factory=list)  # per rank: torch.cuda.max_memory_allocated
    cudagraphs: list[str] = field(default_factory=list)  # per rank, --cudagraphs: cudagraph_tree_summary()
    sharding: str = ""  # FSDP2: a decoder layer parameter's placements and mesh, as fully_shard made them
    # per rank, --profile on GPUs: twinkle_fx.measure.overlap.CommunicationOverlap.to_json() of the profiled steps
    communication: list[dict[str, Any] | None] = field(default_factory=list)

    @property
    def _steady(self) -> list[float]:
        return self.step_ms[2:] or self.step_ms  # after compilation and CUDA-graph recording

    @property
    def steady_ms(self) -> float:
        """Median step time after the first two steps (or over all when fewer). The median, not the mean:
        one step that stalls on the host (a 655 ms step among 50 ms ones, seen on a GPU run) would
        otherwise move the figure, and every ratio taken from it, by half."""
        return statistics.median(self._steady)

    @property
    def spread_ms(self) -> tuple[float, float]:
        """The fastest and slowest step of those :attr:`steady_ms` is the median of."""
        return min(self._steady), max(self._steady)

    @property
    def steady_tokens_per_s(self) -> float:
        """Global tokens per second at the median step time (:attr:`steady_ms`)."""
        a = self.args
        return a["batch"] * self.world_size * a["seq"] * a["accum"] / (self.steady_ms / 1e3)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "steady_ms": self.steady_ms, "steady_tokens_per_s": self.steady_tokens_per_s}


def kernel_swaps_compiled(rank: int, report) -> RankSwaps:
    return RankSwaps(
        rank, graphs=report.graph_count, graph_breaks=report.graph_breaks,
        swapped=dict(Counter(f"{r.kind} {r.target}" for r in report.swapped)),
        kept=dict(Counter(f"{r.kind} {r.target}: {r.reason}" for r in report.not_swapped)),
        graphs_with_swaps=sum(any(r.swapped for r in g.regions) for g in report.graphs),
    )



def describe(result: RunResult) -> str:
    """One line naming the run: ``ddp x 2 · twinkle (inductor), regional · bf16 · 4 x 1024 per rank``."""
    return _describe(result.args, result.world_size, result.device)


def describe_args(args: argparse.Namespace, world: int, device: Any) -> str:
    return _describe(vars(args), world, str(device))


def _describe(a: dict[str, Any], world: int, device: str) -> str:
    where = "1 device, no wrapper" if a["parallel"] == "none" else f"{a['parallel']} x {world}"
    replicas = a.get("replicate", 1)
    where += f" (HSDP: {replicas} replicas x {world // replicas} shards)" if replicas > 1 else ""
    where = f"{a.get('model', 'qwen2')} {a['size']} · {where}"
    backend = a["backend"] + (f" ({a['compiler']})" if a["backend"].endswith("twinkle") else "")
    backend += f", swap_policy {a['swap_policy']}" if a.get("swap_policy") else ""
    backend += ", regional" if a["regional"] else ""
    backend += ", CUDA graphs" if a.get("cudagraphs") else ""
    backend += "" if a["fused_loss"] else ", no fused-loss head"
    precision = "mixed bf16/fp32" if a["mixed_precision"] else (a["dtype"] or ("bf16" if "cuda" in device else "fp32"))
    parts = [where, backend, precision, f"{a['batch']} x {a['seq']} per rank"]
    parts += [f"accum {a['accum']}"] if a["accum"] > 1 else []
    parts += ["activation checkpointing"] if a["checkpoint"] else []
    reshard = a.get("reshard_after_forward", True)
    parts += ["no reshard after forward"] if reshard is False else []
    parts += ["reshard after forward but the last unit"] if reshard == "inner" else []
    parts += [f"reshard after forward to {reshard} ranks"] if isinstance(reshard, int) and not isinstance(reshard, bool) else []
    parts += [f"{a['layers_per_unit']} layers per FSDP unit"] if a.get("layers_per_unit", 1) > 1 else []
    parts += [f"reduce in {a['reduce_dtype']}"] if a.get("reduce_dtype") else []
    unit = "layer(s)" if a.get("layers_per_unit", 1) == 1 else "unit(s)"
    parts += [f"prefetch {a['prefetch']} {unit}"] if a.get("prefetch") else []
    parts += ["copy-engine collectives"] if a.get("collectives", "nccl") == "copy-engine" else []
    parts += [f"NCCL on {a['nccl_ctas']} CTAs"] if a.get("nccl_ctas") else []
    parts += [f"GEMMs leave {a['sm_carveout']} SMs"] if a.get("sm_carveout") else []
    parts += ["fused AdamW"] if a.get("fused_adamw") else []
    parts += ["tied embedding reduced early"] if a.get("tied_embedding_ddp") else []
    parts += ["all-reduce comm hook"] if a.get("ddp_comm_hook", "none") != "none" else []
    parts += ["no buffer broadcast"] if not a.get("broadcast_buffers", True) else []
    parts += ["static graph"] if a.get("ddp_static_graph") else []
    parts += ["grads as bucket views"] if a.get("grad_as_bucket_view") else []
    parts += ["persistent grads"] if a.get("persistent_grads") else []
    if a["parallel"] == "ddp" and a["backend"] in COMPILED:
        parts.append(f"optimize_ddp {a['optimize_ddp']}")
    parts += ["compiled autograd"] if a["compiled_autograd"] else []
    return " · ".join(parts)


def communication_row(comm: dict[str, Any]) -> str:
    """``41.2 with a collective, 12.3 exposed (AllGather 5.1, ReduceScatter 7.2); compute under it 1.18x``."""
    kinds = ", ".join(f"{name} {row['exposed_ms']:.1f}" for name, row in comm["collectives"].items())
    text = f"{comm['communication_ms']:.1f} with a collective, {comm['exposed_ms']:.1f} exposed ({kinds})"
    text += f"; GPU idle {comm['idle_ms']:.1f}" if comm.get("idle_ms") else ""
    if comm.get("slowdown") is not None:
        text += f"; compute under it {comm['slowdown']:.2f}x (+{comm['slowdown_extra_ms']:.1f})"
    return text


def _short(what: str) -> str:
    """``layer Qwen2RMSNorm -> RMSNorm`` -> ``RMSNorm``; ``function ...apply_rotary_pos_emb`` -> ``apply_rotary_pos_emb``."""
    return what.split(" -> ")[-1].rsplit(".", 1)[-1]


def table(result: RunResult, baseline: list[RunResult] = ()) -> str:
    """The run's table (markdown); with ``baseline`` (single-device runs), the speed-up over the one
    with this run's per-rank batch and the loss difference from the one with its global batch."""
    a = result.args
    peak = ", ".join("-" if p is None else f"{p:.2f}" for p in result.peak_gib)
    rows = [
        ("tokens/s (global, median step of 3+)", f"{result.steady_tokens_per_s:,.0f}"),
        ("ms/step (median; fastest-slowest)", f"{result.steady_ms:.1f} ({result.spread_ms[0]:.1f}-{result.spread_ms[1]:.1f})"),
        ("first step s (compile)", f"{result.step_ms[0] / 1e3:.1f}"),
        ("peak GiB per GPU (rank 0, 1, ...)", peak),
        ("loss per step", ", ".join(f"{x:.4f}" for x in result.losses)),
        ("swaps per rank", "; ".join(f"r{s.rank}: {s.short()}" for s in result.swaps)),
    ]
    if result.cudagraphs:
        rows.append(("CUDA graphs (rank 0)", result.cudagraphs[0]))
    if result.sharding:
        rows.append(("FSDP2 sharding (a layer's parameter)", result.sharding))
    for rank, comm in enumerate(result.communication):
        if comm:
            rows.append((f"communication ms/step, rank {rank} (profiled)", communication_row(comm)))
    first = result.swaps[0]
    if first.swapped:
        rows.append(("swapped (rank 0)", ", ".join(f"{n} x {_short(w)}" for w, n in sorted(first.swapped.items()))))
    if first.kept:
        rows.append(("kept (rank 0)", "; ".join(f"{n} x {w}" for w, n in sorted(first.kept.items()))))
    same = {"seq": None, "accum": None, "steps": None, "seed": None, "size": None, "lr": None, "model": "qwen2"}
    for ref in baseline:
        r = ref.args
        if ref.world_size != 1 or any(r.get(k, d) != a.get(k, d) for k, d in same.items()) or ref is result:
            continue
        if r["batch"] == a["batch"]:
            how = (r["backend"] + (", regional" if r["regional"] else "")
                   + (", CUDA graphs" if r.get("cudagraphs") else ""))
            peaks = [p for p in result.peak_gib if p is not None]
            memory = (f"; peak {max(peaks) / ref.peak_gib[0]:.2f}x ({ref.peak_gib[0]:.2f} GiB)"
                      if peaks and ref.peak_gib and ref.peak_gib[0] else "")
            rows.append((f"vs 1 device, {r['batch']} x {r['seq']} ({how})",
                         f"{result.steady_tokens_per_s / ref.steady_tokens_per_s:.2f}x "
                         f"({ref.steady_tokens_per_s:,.0f} tokens/s){memory}"))
        if r["batch"] == a["batch"] * result.world_size and len(ref.losses) == len(result.losses):
            diff = max(abs(x - y) for x, y in zip(result.losses, ref.losses))
            rel = max(abs(x - y) / abs(y) for x, y in zip(result.losses, ref.losses))
            rows.append((f"losses vs 1 device, global batch {r['batch']} x {r['seq']}",
                         f"max |diff| {diff:.2e} (relative {rel:.1e})"))
    width = max(len(k) for k, _ in rows)
    lines = [f"| {describe(result)} | |", "|---|---|", *(f"| {k.ljust(width)} | {v} |" for k, v in rows)]
    return "\n".join(lines)


def load_baseline(path: str) -> list[RunResult]:
    with open(path) as f:
        return [from_json(run) for run in json.load(f)["runs"]]


def from_json(run: dict[str, Any]) -> RunResult:
    """A run as :meth:`RunResult.to_json` wrote it (fields a newer version added take their defaults)."""
    keep = {f.name for f in fields(RunResult)}
    return RunResult(**{**{k: v for k, v in run.items() if k in keep}, "swaps": [RankSwaps(**s) for s in run["swaps"]]})


def _how(a: dict[str, Any]) -> str:
    """``twinkle regional + CUDA graphs``: the backend as the scaling table names it."""
    name = "torch.compile" if a["backend"] == "inductor" else a["backend"]
    return name + (" regional" if a["regional"] else "") + (" + CUDA graphs" if a.get("cudagraphs") else "")


def _label(a: dict[str, Any]) -> str:
    """A parallel run's row: the backend, and the collectives where they are not the process group's own."""
    return _how(a) + (", copy-engine collectives" if a.get("collectives", "nccl") == "copy-engine" else "")


def scaling_table(runs: list[RunResult]) -> str:
    """Each multi-device run against its 1-device twin (same backend and per-device batch): tokens/s, scaling, peak
    memory and the losses against the 1-device run of its global batch; then each backend against torch.compile
    under the same parallelism."""
    same = ("model", "size", "seq", "steps", "seed", "lr", "accum")
    singles = [r for r in runs if r.world_size == 1]
    lines = ["| backend | 1 device tokens/s | parallel tokens/s | scaling | ms/step (1 device; parallel) "
             "| peak GiB per device (1 device; parallel) | losses vs 1 device, global batch |", "|---|---|---|---|---|---|---|"]
    parallel = [r for r in runs if r.world_size > 1]
    for run in parallel:
        a = run.args

        def matches(ref: RunResult, batch: int) -> bool:
            return ref.args["batch"] == batch and all(ref.args.get(k) == a.get(k) for k in same)

        twin = next((s for s in singles if matches(s, a["batch"]) and _how(s.args) == _how(a)), None)
        whole = [s for s in singles if matches(s, a["batch"] * run.world_size) and len(s.losses) == len(run.losses)]
        peak = ", ".join("-" if p is None else f"{p:.2f}" for p in run.peak_gib)
        losses = "-"
        if whole:
            ref = next((s for s in whole if _how(s.args) == _how(a)), whole[0])
            rel = max(abs(x - y) / abs(y) for x, y in zip(run.losses, ref.losses))
            losses = f"max relative {rel:.1e} ({_how(ref.args)})"
        if twin is None:
            lines.append(f"| {_label(a)} | - | {run.steady_tokens_per_s:,.0f} | - | -; {run.steady_ms:.1f} | -; {peak} "
                         f"| {losses} |")
            continue
        twin_peak = "-" if not twin.peak_gib or twin.peak_gib[0] is None else f"{twin.peak_gib[0]:.2f}"
        lines.append(f"| {_label(a)} | {twin.steady_tokens_per_s:,.0f} | {run.steady_tokens_per_s:,.0f} "
                     f"| {run.steady_tokens_per_s / twin.steady_tokens_per_s:.2f}x | {twin.steady_ms:.1f}; "
                     f"{run.steady_ms:.1f} | {twin_peak}; {peak} | {losses} |")
    def collectives(r: RunResult) -> str:
        return r.args.get("collectives", "nccl")

    for run in parallel:
        # against torch.compile with the same collectives (the same knobs for both), then against the same backend
        # with the process group's own collectives
        base = next((r for r in parallel if r.args["backend"] == "inductor" and collectives(r) == collectives(run)
                     and r.args["parallel"] == run.args["parallel"]), None)
        if base is not None and run is not base:
            lines.append(f"\n{_label(run.args)} / {_label(base.args)} under {run.args['parallel']} x "
                         f"{run.world_size}: {run.steady_tokens_per_s / base.steady_tokens_per_s:.2f}x")
        own = next((r for r in parallel if collectives(r) == "nccl" and _how(r.args) == _how(run.args)
                    and r.args["parallel"] == run.args["parallel"]), None)
        if own is not None and collectives(run) != "nccl":
            lines.append(f"\n{_label(run.args)} / {_label(own.args)} under {run.args['parallel']} x "
                         f"{run.world_size}: {run.steady_tokens_per_s / own.steady_tokens_per_s:.2f}x")
    return "\n".join(lines)


def merge(named: dict[str, str]) -> dict[str, Any]:
    """The ``--out`` files of several runs as one record: the environment of the first multi-device run (else the
    first), every run under its name, every table, and :func:`scaling_table` over them all."""
    documents = {name: json.loads(open(path).read()) for name, path in named.items()}
    runs: dict[str, Any] = {}
    for name, document in documents.items():
        for index, run in enumerate(document["runs"]):
            runs[name if len(document["runs"]) == 1 else f"{name}#{index}"] = run
    results = [from_json(run) for run in runs.values()]
    first = next((d for d in documents.values() if any(r["world_size"] > 1 for r in d["runs"])),
                 next(iter(documents.values())))
    return {"environment": first.get("environment", {}), "runs": runs,
            "tables": [t for d in documents.values() for t in d.get("tables", [])], "scaling": scaling_table(results)}


def main(argv: list[str] | None = None) -> int:
    """``python -m twinkle_fx.bench.distributed_results --out ALL.json NAME=RUN.json ...``: one record of several
    runs; prints the scaling table. A run file that is missing (its run failed or ran out of time) is named and
    left out."""
    parser = argparse.ArgumentParser(prog="python -m twinkle_fx.bench.distributed_results", description=main.__doc__)
    parser.add_argument("--out", required=True, help="the merged JSON")
    parser.add_argument("runs", nargs="+", metavar="NAME=FILE", help="a run's --out file under a name")
    args = parser.parse_args(argv)
    named = {}
    for item in args.runs:
        name, sep, path = item.partition("=")
        if not sep:
            parser.error(f"{item}: give NAME=FILE (the name the run goes under in the merged JSON)")
        try:
            open(path).close()
        except OSError:
            print(f"{name}: no {path} (the run failed or ran out of time): left out")
            continue
        named[name] = path
    if not named:
        parser.error("none of the run files exists")
    merged = merge(named)
    with open(args.out, "w") as f:
        json.dump(merged, f, indent=1)
    print(merged["scaling"])
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
