"""Reference-size forward + backward of every built-in family: kernelized and compiled vs the unswapped model.

For each family of ``twinkle_fx.builtin.BUILTIN_MODELS`` and each dtype (bf16, fp32): the family's
``twinkle-fx bench --model`` workload (a published model's hidden size, heads, head dim,
intermediate size, experts and vocabulary: ``twinkle_fx.bench.workloads``) with 2 layers, random
init with a fixed seed, one batch (2 x 512) with labels. The unswapped model gives the reference
loss, every parameter gradient and the logits (an eval forward, since the fused-loss head returns no
logits in training); then each path runs the same step on the same weights:

- ``kernelize``: ``use_builtin_kernels`` + ``kernelize_model(model, mode="train")`` (undone after);
- ``compile``: ``torch.compile(model, backend="twinkle")`` with the inner compiler ``--compiler``
  (``aot_eager`` by default: the backend's swaps and the kernels' autograd, without Inductor's
  minutes of codegen per family).

Errors are relative: the loss ``|loss - ref| / |ref|``, the logits and each gradient
``||x - ref|| / ||ref||``. Thresholds are ``twinkle_fx.core.tolerances``: ``loss_rtol`` for the loss,
``logits_rtol`` for the logits and for every gradient (the relative-L2 bound of a whole model's
output in that dtype). bf16 rows are also measured against an fp32 run of the same (upcast)
weights, the truth: a path passes a check when it is within the tolerance of the unswapped model,
or no further from the truth than the unswapped bf16 model is, plus the tolerance ("no worse than
PyTorch in this dtype", as the kernel tests judge). The swaps each path made are listed (class ->
kernel and patched functions for kernelize; the backend's swapped regions, graphs and kept regions
for compile) with what the mapping binds but the path did not swap.

A MoE router's top-k is discontinuous: in bf16 a one-ulp difference (the kernels round once where
PyTorch rounds per op) can send a token to other experts, a large error on that token, on the
tokens attending to it and on those experts' gradients. A bf16 MoE row whose loss passes and whose
logits fail on at most 5% of the tokens (each token judged by ``logits_rtol``) is marked ``FLIP``,
not ``PASS``, with the share of such tokens; fp32 rows and dense families are judged strictly.

MoE families run transformers' default experts implementation (``grouped_mm``) in bf16 on a GPU,
``eager`` (the loop over the experts hit) in fp32 on a GPU, where ``grouped_mm`` needs bf16 and
``batched_mm`` would gather every token's expert weights (96-896 GiB at these sizes: the first H100
run ran out of memory in every MoE row), and ``batched_mm`` on the CPU (tiny configs; the choice of
``tests/families``); the JSON records the implementation of every row.

One table row per family x dtype x path; JSON (every row, the environment) to ``--out``. A family
that fails or runs past ``--timeout`` seconds gets FAIL rows with the error and the table goes on;
the exit status is 1 when any row failed. ``--tiny``: the workloads' tiny configs on the CPU
through the Triton interpreter (batch 2 x 16), what ``tests/families/test_family_reference.py`` runs.

    python3 tools/family_reference.py --out families.json                    # every family, GPU
    python3 tools/family_reference.py --families gemma,gpt_oss --dtypes bf16
    python3 tools/family_reference.py --tiny --families starcoder2 --out /tmp/f.json   # CPU

Time on an H100 (estimate, not measured: each family and dtype is a model build, four fwd+bwd steps
and four eval forwards at 2 x 512, and two Dynamo + AOT traces of a 2-layer model with aot_eager,
~3-6 s each): about 8-12 s per family and dtype, 19 families x 2 dtypes, ~4-6 min, plus the first
Triton compile of each kernel. Progress lines give the seconds of every family.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib
import json
import math
import os
import signal
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
PATHS = ("kernelize", "compile")
MOE = ("deepseek_v3", "mixtral", "qwen3_moe", "gpt_oss", "ernie4_5_moe")


class FamilyTimeout(Exception):
    """A family ran past ``--timeout`` seconds."""


@contextlib.contextmanager
def _deadline(seconds: float):
    """Raise :class:`FamilyTimeout` in the main thread after ``seconds`` (SIGALRM; Python code only:
    a running CUDA kernel or C call finishes first)."""
    def expire(signum, frame):
        raise FamilyTimeout(f"ran past --timeout {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    from twinkle_fx.core.outputs import output_file  # the checkout's twinkle_fx: __main__ put it on sys.path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default="all", help="comma-separated families of BUILTIN_MODELS (default: all)")
    parser.add_argument("--dtypes", default="bf16,fp32", help="comma-separated: bf16, fp32 (default: both)")
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated: kernelize, compile (default: both)")
    parser.add_argument("--compiler", default="aot_eager", help="inner compiler of backend='twinkle' (default aot_eager)")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    parser.add_argument("--batch", type=int, default=None, help="batch size (default 2)")
    parser.add_argument("--seq", type=int, default=None, help="sequence length (default 512; 16 with --tiny)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per family, all dtypes and paths (default 120)")
    parser.add_argument("--tiny", action="store_true", help="tiny configs on the CPU (Triton interpreter)")
    parser.add_argument("--out", default=None, type=output_file, help="JSON file for every row")
    args = parser.parse_args(argv)
    if not args.families.replace(",", "").strip():
        parser.error("--families is empty; give a comma-separated list of built-in families, or all")
    args.dtypes = _choices(parser, "--dtypes", args.dtypes, DTYPES)
    args.paths = _choices(parser, "--paths", args.paths, PATHS)
    args.batch = args.batch or 2
    args.seq = args.seq or (16 if args.tiny else 512)
    return args


def _choices(parser: argparse.ArgumentParser, flag: str, value: str, known) -> list[str]:
    picked = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in picked if v not in known]
    if unknown or not picked:
        parser.error(f"{flag} {value!r}: choose from {', '.join(known)}")
    return picked


# ----------------------------------------------------------------------------- one step


def _step(model, call, ids):
    """Loss and every parameter gradient of one training step with labels (nothing accumulated in .grad)."""
    import torch

    model.train()
    loss = call(ids, labels=ids).loss
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    return loss.detach().float(), {n: None if g is None else g.detach() for (n, _), g in zip(named, grads)}


def _logits(model, call, ids):
    import torch

    model.eval()
    try:
        with torch.no_grad():
            return call(ids).logits.detach()
    finally:
        model.train()


def _rel(a, b) -> float:
    """``||a - b|| / ||b||`` in fp32 (0 when both are zero)."""
    a, b = a.float(), b.float()
    den = b.norm().item()
    num = (a - b).norm().item()
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


@dataclasses.dataclass
class Result:
    """One run's loss, gradients and logits."""

    loss: Any
    grads: dict[str, Any]
    logits: Any


def _errors(got: Result, ref: Result) -> dict[str, Any]:
    loss = abs(got.loss.item() - ref.loss.item()) / max(abs(ref.loss.item()), 1e-30)
    grads = {}
    for name, want in ref.grads.items():
        have = got.grads.get(name)
        if (want is None) != (have is None):
            grads[name] = math.inf  # a gradient present on one side only
        elif want is not None:
            grads[name] = _rel(have, want)
    # per token: a MoE router's top-k is discontinuous, so a rounding difference can move one token
    # to other experts (a large error on that token alone and on the experts' gradients)
    token = ((got.logits.float() - ref.logits.float()).norm(dim=-1) / ref.logits.float().norm(dim=-1).clamp_min(1e-30))
    return {"loss": loss, "logits": _rel(got.logits, ref.logits), "grads": grads, "tokens": token.flatten()}


def _judge(path: dict, ref_vs_truth: dict | None, path_vs_truth: dict | None, tol) -> tuple[bool, list[str]]:
    """Whether each check passes: within tolerance of the unswapped model, or (bf16) no further from
    the fp32 truth than the unswapped model, plus the tolerance. Returns (passed, what failed)."""
    def ok(kind: str, err: float, allowed: float, name: str | None = None) -> bool:
        if err <= allowed:
            return True
        if ref_vs_truth is None:
            return False
        mine = path_vs_truth[kind] if name is None else path_vs_truth[kind][name]
        theirs = ref_vs_truth[kind] if name is None else ref_vs_truth[kind][name]
        return mine <= allowed + theirs

    failed = []
    if not ok("loss", path["loss"], tol.loss_rtol):
        failed.append(f"loss {path['loss']:.2e} > {tol.loss_rtol:g}")
    if not ok("logits", path["logits"], tol.logits_rtol):
        failed.append(f"logits {path['logits']:.2e} > {tol.logits_rtol:g}")
    bad = [n for n, e in path["grads"].items() if not ok("grads", e, tol.logits_rtol, n)]
    if bad:
        failed.append(f"{len(bad)} gradient(s) beyond {tol.logits_rtol:g}, e.g. {bad[0]} {path['grads'][bad[0]]:.2e}")
    return not failed, failed


# ----------------------------------------------------------------------------- swaps


def _expected(family: str) -> set[str]:
    from twinkle_fx.builtin import BUILTIN_MODELS

    f = BUILTIN_MODELS[family]
    want = {f"{c.rpartition('.')[2]}->{spec[1]}" for spec in (f.norms, f.mlps, f.experts) if spec for c in spec[0]}
    want |= {f"{f.head}->CausalLMFusedLoss"} if f.head else set()
    want |= {"apply_rotary_pos_emb"} if f.rotary else set()
    return want | {name for name, _ in f.functions}


def _functions(family: str) -> dict[str, str]:
    from twinkle_fx.builtin import BUILTIN_MODELS

    f = BUILTIN_MODELS[family]
    return {**({"apply_rotary_pos_emb": f.rotary} if f.rotary else {}), **dict(f.functions)}


def _kernelize_swaps(family: str, model) -> Counter:
    from twinkle_fx.builtin import BUILTIN_MODELS
    from twinkle_fx.core.swaps import swapped_forward

    swaps = Counter(f"{type(m).__name__}->{swapped_forward(m).kernel_name}" for m in model.modules()
                    if swapped_forward(m))
    modeling = importlib.import_module(BUILTIN_MODELS[family].module)
    for name, kernel in _functions(family).items():
        if getattr(getattr(modeling, name), "__name__", "") == kernel:
            swaps[name] += 1  # patched once, in the modeling module
    return swaps


def _compile_swaps(report) -> tuple[Counter, list[str]]:
    swaps = Counter()
    for region in report.swapped:
        target = region.target.replace(" -> ", "->")
        swaps[target.rpartition(".")[2] if region.kind == "function" else target] += 1
    kept = sorted({f"{r.target}: {r.reason}" for r in report.not_swapped})
    return swaps, kept


def _missing(family: str, swaps: Counter, model) -> list[str]:
    """What the mapping binds and this path did not swap: classes present in the model, and functions
    (which a path may also not swap because the model never calls them: DeepSeek-V3's plain rotary
    under compile, where rope_interleave calls apply_rotary_pos_emb_interleave instead)."""
    present = {type(m).__name__ for m in model.modules()}
    return sorted(e for e in _expected(family) - set(swaps) if "->" not in e or e.split("->")[0] in present)


def _show(swaps: Counter) -> str:
    return ", ".join(f"{name} x{n}" for name, n in sorted(swaps.items())) or "nothing"


# ----------------------------------------------------------------------------- one family


def _workload(family: str, layers: int):
    from twinkle_fx.bench.workloads import get_workload

    workload = get_workload(family)
    return dataclasses.replace(workload, config={**workload.config, "num_hidden_layers": layers})


def _set_experts_implementation(model, device, dtype) -> None:
    """The experts implementation a MoE row runs (see the module docstring): transformers' default
    (``grouped_mm``) where it runs, bf16 on a GPU; ``eager`` (a loop over the experts hit) for fp32 on a
    GPU, where ``grouped_mm`` needs bf16 and ``batched_mm`` gathers every token's expert weights (tokens x
    top-k x the experts' weights: 96-896 GiB at these sizes); ``batched_mm`` on the CPU (tiny configs)."""
    import torch

    if device.type == "cpu":
        model.config._experts_implementation = "batched_mm"
    elif dtype == torch.float32:
        model.config._experts_implementation = "eager"


def run_family(family: str, args: argparse.Namespace, device) -> list[dict]:
    """Every (dtype, path) row of one family."""
    import torch

    from twinkle_fx import kernelize_model, scoped_registry, undo_kernelize
    from twinkle_fx.bench.workloads import build_model, make_batch
    from twinkle_fx.builtin import use_builtin_kernels
    from twinkle_fx.compiler import collect_reports
    from twinkle_fx.core.tolerances import tolerance

    rows = []
    workload = _workload(family, args.layers)
    for dtype_name in args.dtypes:
        dtype = getattr(torch, DTYPES[dtype_name])
        with scoped_registry(inherit=False):
            use_builtin_kernels(devices=(device.type,), models=(family,))
            model = build_model(workload, tiny=args.tiny, dtype=dtype, device=device, seed=args.seed)
            if family in MOE:
                _set_experts_implementation(model, device, dtype)
            ids, _ = make_batch(workload, tiny=args.tiny, batch=args.batch, seq=args.seq, device=device, seed=args.seed)
            ref = Result(*_step(model, model, ids), _logits(model, model, ids))
            truth = ref_vs_truth = None
            if dtype != torch.float32:  # the same weights upcast: what the bf16 runs are judged against
                import copy

                exact = copy.deepcopy(model).to(torch.float32)
                if family in MOE:
                    _set_experts_implementation(exact, device, torch.float32)
                truth = Result(*_step(exact, exact, ids), _logits(exact, exact, ids))
                del exact
                ref_vs_truth = _errors(ref, truth)
            implementation = getattr(model.config, "_experts_implementation", None)
            for path in args.paths:
                start = time.perf_counter()
                row = dict(family=family, dtype=dtype_name, path=path, experts_implementation=implementation,
                           ref_loss=ref.loss.item(), shape=f"{args.batch} x {args.seq}")
                if path == "kernelize":
                    kernelize_model(model, mode="train", device=device.type, use_fallback=True)
                    try:
                        swaps = _kernelize_swaps(family, model)
                        got = Result(*_step(model, model, ids), _logits(model, model, ids))
                    finally:
                        undo_kernelize(model)
                    row.update(kept=[])
                else:
                    torch._dynamo.reset()  # every family's *ForCausalLM goes through one decorator frame
                    compiled = torch.compile(model, backend="twinkle", options={"compiler": args.compiler})
                    with collect_reports() as report:  # the training step's graphs (eval recompiles alike)
                        loss, grads = _step(model, compiled, ids)
                    got = Result(loss, grads, _logits(model, compiled, ids))
                    swaps, kept = _compile_swaps(report)
                    row.update(kept=kept, graphs=report.graph_count, graph_breaks=report.graph_breaks)
                    del compiled
                errors = _errors(got, ref)
                tol = tolerance(dtype)
                passed, failed = _judge(errors, ref_vs_truth, None if truth is None else _errors(got, truth), tol)
                worst = max(errors["grads"], key=errors["grads"].get)
                flipped = (errors["tokens"] > tol.logits_rtol).float().mean().item()
                status = "PASS" if passed else "FAIL"
                if not passed and family in MOE and dtype != torch.float32:
                    failed.append(f"routing: {flipped:.1%} of tokens beyond {tol.logits_rtol:g} (the rest within)")
                    if flipped <= 0.05 and not any(f.startswith("loss") for f in failed):
                        status = "FLIP"
                row.update(status=status, failed=failed, tokens_beyond_tolerance=flipped, swaps=dict(swaps),
                           missing=_missing(family, swaps, model), loss_rel_err=errors["loss"],
                           logits_rel_err=errors["logits"], worst_grad_rel_err=errors["grads"][worst], worst_grad=worst,
                           seconds=round(time.perf_counter() - start, 2))
                if ref_vs_truth is not None:
                    row["unswapped_vs_fp32"] = dict(loss=ref_vs_truth["loss"], logits=ref_vs_truth["logits"],
                                                    worst_grad=max(ref_vs_truth["grads"].values()))
                rows.append(row)
                _print_row(row)
                del got
            del model, ref, truth
        _free(device)
    return rows


def _free(device) -> None:
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- table

_HEADER = f"{'family':<13}{'dtype':<6}{'path':<10}{'status':<7}{'loss rel':>10}{'logits rel':>11}{'grad rel':>10}  swaps"


def _print_row(row: dict) -> None:
    if row["status"] == "ERROR":
        print(f"{row['family']:<13}{row['dtype']:<6}{row['path']:<10}FAIL   {row['error']}", flush=True)
        return
    missing = f"  [bound, not swapped here: {', '.join(row['missing'])}]" if row["missing"] else ""
    print(f"{row['family']:<13}{row['dtype']:<6}{row['path']:<10}{row['status']:<7}{row['loss_rel_err']:>10.2e}"
          f"{row['logits_rel_err']:>11.2e}{row['worst_grad_rel_err']:>10.2e}  {_show(Counter(row['swaps']))}{missing}",
          flush=True)
    for line in row["failed"]:
        print(f"{'':<36}{line}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    import torch

    if not torch.cuda.is_available():
        if not args.tiny:
            raise SystemExit("family_reference: no CUDA device; reference sizes need a GPU (use --tiny on the CPU).")
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before twinkle_triton defines its kernels
    import transformers

    from twinkle_fx.builtin import BUILTIN_MODELS

    families = list(BUILTIN_MODELS) if args.families == "all" else [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = [f for f in families if f not in BUILTIN_MODELS]
    if unknown:
        raise SystemExit(f"family_reference: unknown family {unknown[0]!r}; built-in families: {', '.join(BUILTIN_MODELS)}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    environment = dict(torch=torch.__version__, transformers=transformers.__version__,
                       device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu (Triton interpreter)",
                       commit=os.environ.get("TWINKLE_FX_COMMIT"), tiny=args.tiny, layers=args.layers,
                       batch=args.batch, seq=args.seq, compiler=args.compiler, seed=args.seed)
    print(" ".join(f"{k}={v}" for k, v in environment.items()), flush=True)
    print(_HEADER, flush=True)
    rows, begin = [], time.perf_counter()
    for family in families:
        start = time.perf_counter()
        done = len(rows)
        try:
            with _deadline(args.timeout):
                rows.extend(run_family(family, args, device))
        except Exception as e:  # FamilyTimeout too: one family failing must not stop the table; the error is kept
            message = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            reported = {(r["dtype"], r["path"]) for r in rows[done:]}
            for dtype in args.dtypes:
                for path in args.paths:
                    if (dtype, path) not in reported:
                        row = dict(family=family, dtype=dtype, path=path, status="ERROR", error=message,
                                   traceback=traceback.format_exc())
                        rows.append(row)
                        _print_row(row)
            torch._dynamo.reset()
            _free(device)
        print(f"# {family}: {time.perf_counter() - start:.1f} s (total {time.perf_counter() - begin:.1f} s)", flush=True)
    failed = [r for r in rows if r["status"] not in ("PASS", "FLIP")]
    flips = sum(r["status"] == "FLIP" for r in rows)
    print(f"# {len(rows) - len(failed) - flips}/{len(rows)} rows pass, {flips} FLIP (MoE routing in bf16), "
          f"{len(failed)} fail; {time.perf_counter() - begin:.1f} s in all", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(dict(environment=environment, rows=rows), indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path[:0] = [str(ROOT), str(ROOT / "kernels")]
    raise SystemExit(main())
