"""The decode GEMV kernels against cuBLAS at the projections of three model shapes, one and a few rows.

Each row times ``twinkle_triton.gemv`` (q/k/v in one launch, o and down with the residual add,
the LM head) or ``gemv_swiglu`` (gate and up with the SwiGLU product), and a decoder layer's four in sequence
(``layer``), against what the graph runs without them: ``F.linear`` per weight (cuBLAS) on pre-concatenated q/k/v
weights, or on the gate and up weights with ``silu(g) * u`` after; the ``norm + ...`` rows take the RMSNorm in the
kernel's prologue
(``norm_weight=``) against ``twinkle_triton.rms_norm``'s kernel before the same GEMV. Times are CUDA-graph replays
(``triton.testing.do_bench_cudagraph``: no launch gaps, as inside the decode loop's graph) over enough copies of
the weights to fill twice the L2 cache, so each call reads its weights from DRAM as a decode step's layers do
(``--hot``: one set, which an H200's 50 MB L2 holds at the 0.5B shape); GB/s is the weights' bytes over that time. The
rows where the kernels win are what ``twinkle_triton.gemv.DECODE_ROWS`` admits (the graph rewrite and SwiGLUMLP).

``--block-n``, ``--tiles``, ``--warps`` and ``--pdl`` sweep the kernels' launch heuristic (weight rows a program,
register tile, warps a program, programmatic dependent launch; ``twinkle_triton.gemv._BLOCK_N`` and
``_BLOCK_N_WIDE_K`` / ``_TILE`` / ``_WARPS`` / ``_dependent_launch.ENABLED`` and ``_PREFETCH_WEIGHTS``; a block-n
of 0 in the output is the kernels' own choice); ``--shapes`` and ``--projections`` pick the model shapes and
projections.

    python tools/gemv_sweep.py --out gemv.json
    python tools/gemv_sweep.py --out gemv-tune.json --rows 1 --block-n 2,4 --tiles 2048,4096 --pdl off,wait,prefetch
"""

from __future__ import annotations

import argparse
import importlib
import json

import torch
import torch.nn.functional as F
import twinkle_triton as tt
from triton.testing import do_bench_cudagraph

from twinkle_fx.core.outputs import output_file
from twinkle_fx.measure.environment import describe_environment

gemv_module = importlib.import_module("twinkle_triton.gemv")  # the package exports the function of that name
dependent_launch = importlib.import_module("twinkle_triton._dependent_launch")

# shape name -> (hidden, intermediate, q width, kv width, vocab)
SHAPES = {"qwen2-0.5b": (896, 4864, 896, 128, 151936), "llama-3.2-1b": (2048, 8192, 2048, 512, 128256),
          "llama-3.2-3b": (3072, 8192, 3072, 1024, 128256)}


PROJECTIONS = ("norm + qkv", "norm + gate/up", "qkv", "o + residual", "gate/up swiglu", "down + residual", "lm_head",
               "layer")


def _cases(hidden, inter, q, kv, vocab, rows, dtype):
    """projection -> (weights: a fresh set of the projection's weights, ours(weights), theirs(weights), numel)."""
    def w(n, k):  # a parameter, as a model's weights are (the kernels read those before waiting on the kernel before)
        return torch.nn.Parameter(torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5, requires_grad=False)

    x, xi = torch.randn(rows, hidden, device="cuda", dtype=dtype), torch.randn(rows, inter, device="cuda", dtype=dtype)
    res = torch.randn(rows, hidden, device="cuda", dtype=dtype)
    g, eps = torch.rand(hidden, device="cuda", dtype=dtype) + 0.5, 1e-6

    def qkv():  # the separate weights the kernel reads and the concatenated one cuBLAS gets
        ws = [w(q, hidden), w(kv, hidden), w(kv, hidden)]
        return ws, torch.cat(ws)

    return {
        # the norm in the GEMV's prologue against the norm's own kernel before the GEMV (what the graph ran)
        "norm + qkv": (qkv, lambda ws: tt.gemv(x, ws[0], norm_weight=g, eps=eps),
                       lambda ws: tt.gemv(tt.rms_norm(x, g, eps), ws[0]), (q + 2 * kv) * hidden),
        "norm + gate/up": (lambda: (w(inter, hidden), w(inter, hidden)),
                           lambda ws: tt.gemv_swiglu(x, *ws, norm_weight=g, eps=eps),
                           lambda ws: tt.gemv_swiglu(tt.rms_norm(x, g, eps), *ws), 2 * inter * hidden),
        "qkv": (qkv, lambda ws: tt.gemv(x, ws[0]), lambda ws: F.linear(x, ws[1]), (q + 2 * kv) * hidden),
        "o + residual": (lambda: w(hidden, q), lambda wo: tt.gemv(x, [wo], residual=res),
                         lambda wo: res + F.linear(x, wo), hidden * q),
        "gate/up swiglu": (lambda: (w(inter, hidden), w(inter, hidden)), lambda ws: tt.gemv_swiglu(x, *ws),
                           lambda ws: F.silu(F.linear(x, ws[0])) * F.linear(x, ws[1]), 2 * inter * hidden),
        "down + residual": (lambda: w(hidden, inter), lambda wd: tt.gemv(xi, [wd], residual=res),
                            lambda wd: res + F.linear(xi, wd), hidden * inter),
        "lm_head": (lambda: w(vocab, hidden), lambda wl: tt.gemv(x, [wl]), lambda wl: F.linear(x, wl),
                    vocab * hidden),
        # a decoder layer's four GEMVs in sequence, each reading the one before's output, as in a decode step
        "layer": (lambda: (*qkv(), w(hidden, q), w(inter, hidden), w(inter, hidden), w(hidden, inter)),
                  lambda ws: _layer(x, ws, g, eps, q, fused=True), lambda ws: _layer(x, ws, g, eps, q, fused=False),
                  (q + 2 * kv) * hidden + hidden * q + 3 * inter * hidden),
    }


def _layer(x, weights, g, eps, q, fused):
    """The decoder layer's GEMVs (norm + q/k/v, o + residual, norm + gate/up, down + residual; the attention output
    stood in by q) with the kernels (``fused``) or as the graph runs them without: the norm kernel, then cuBLAS."""
    qkv_weights, qkv_cat, wo, wg, wu, wd = weights
    if fused:
        h = tt.gemv(tt.gemv(x, qkv_weights, norm_weight=g, eps=eps)[:, :q], [wo], residual=x)
        return tt.gemv(tt.gemv_swiglu(h, wg, wu, norm_weight=g, eps=eps), [wd], residual=h)
    h = x + F.linear(F.linear(tt.rms_norm(x, g, eps), qkv_cat)[:, :q], wo)
    xn = tt.rms_norm(h, g, eps)
    return h + F.linear(F.silu(F.linear(xn, wg)) * F.linear(xn, wu), wd)


def _per_call_us(fn, sets) -> float:
    """Microseconds a call: one CUDA graph calls ``fn`` on each weight set in turn (each set's first read comes
    from DRAM when the sets together outgrow the L2 cache, as a decode step's layers do)."""
    return do_bench_cudagraph(lambda: [fn(ws) for ws in sets]) * 1e3 / len(sets)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=output_file)
    parser.add_argument("--rows", default="1,2,4,8", help="comma-separated row counts (at most 16)")
    parser.add_argument("--block-n", default="heuristic",
                        help="comma-separated weight rows a program for every weight; default: the kernels' own choice "
                             "(_BLOCK_N, or _BLOCK_N_WIDE_K for a weight at least as wide as the output)")
    parser.add_argument("--tiles", default=str(gemv_module._TILE), help="comma-separated register tiles (products)")
    parser.add_argument("--warps", default=str(gemv_module._WARPS), help="comma-separated warps a program")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--projections", default=",".join(PROJECTIONS),
                        help=f"comma-separated, of {', '.join(PROJECTIONS)} (spaces optional: norm+qkv)")
    parser.add_argument("--pdl", default="prefetch",
                        help="comma-separated launches to time: off (plain), wait (a programmatic dependent launch "
                             "that waits for the kernel before first), prefetch (the kernels' default on Hopper: the "
                             "first weight tile loaded before that wait)")
    parser.add_argument("--hot", action="store_true",
                        help="time every call on one weight set, which stays in the L2 cache when it fits; default: "
                             "rotate through enough copies of the weights to fill twice the L2 cache, so every call "
                             "reads its weights from DRAM, as in a decode step")
    args = parser.parse_args()
    unknown = sorted(set(args.shapes.split(",")) - set(SHAPES))
    if unknown:
        parser.error(f"--shapes: unknown {', '.join(unknown)}; known: {', '.join(SHAPES)}")
    projections = {p.replace(" ", "") for p in args.projections.split(",")}  # spaces optional
    unknown = sorted(projections - {p.replace(" ", "") for p in PROJECTIONS})
    if unknown:
        parser.error(f"--projections: unknown {', '.join(unknown)}; known: {', '.join(PROJECTIONS)}")
    dtype, results = torch.bfloat16, []
    cold_bytes = 0 if args.hot else 2 * torch.cuda.get_device_properties(0).L2_cache_size
    default_blocks = gemv_module._BLOCK_N, gemv_module._BLOCK_N_WIDE_K
    block_ns = [0] if args.block_n == "heuristic" else [int(b) for b in args.block_n.split(",")]  # 0: the heuristic
    launches = args.pdl.split(",")
    if set(launches) - {"off", "wait", "prefetch"}:
        parser.error(f"--pdl: {args.pdl!r}; pass off, wait and/or prefetch")
    heuristics = [(b, int(t), int(w), pdl) for b in block_ns for t in args.tiles.split(",")
                  for w in args.warps.split(",") for pdl in launches]
    print(f"{'shape':14s} {'projection':16s} rows  N  tile  w pdl      baseline us  GB/s | gemv us  GB/s | speedup")
    for name in args.shapes.split(","):
        dims = SHAPES[name]
        for rows in (int(r) for r in args.rows.split(",")):
            for what, (weights, ours, theirs, numel) in _cases(*dims, rows, dtype).items():
                if what.replace(" ", "") not in projections:
                    continue
                nbytes = numel * torch.finfo(dtype).bits // 8
                sets = [weights() for _ in range(max(1, -(-cold_bytes // nbytes)))]
                t_theirs = _per_call_us(theirs, sets)
                for block_n, tile, warps, pdl in heuristics:
                    gemv_module._TILE, gemv_module._WARPS = tile, warps
                    dependent_launch.ENABLED, gemv_module._PREFETCH_WEIGHTS = pdl != "off", pdl == "prefetch"
                    blocks = (block_n, block_n) if block_n else default_blocks
                    gemv_module._BLOCK_N, gemv_module._BLOCK_N_WIDE_K = blocks
                    tolerance = 5e-2 if what == "layer" else 2e-2  # four roundings in sequence
                    torch.testing.assert_close(ours(sets[0]), theirs(sets[0]), rtol=tolerance, atol=tolerance)
                    t_ours = _per_call_us(ours, sets)
                    results.append({"shape": name, "projection": what, "rows": rows, "block_n": block_n, "tile": tile,
                                    "warps": warps, "pdl": pdl, "weight_sets": len(sets), "cublas_us": t_theirs,
                                    "gemv_us": t_ours, "speedup": t_theirs / t_ours})
                    print(f"{name:14s} {what:16s} {rows:4d} {block_n:2d} {tile:5d} {warps:2d} {pdl:8s} "
                          f"{t_theirs:11.1f} {nbytes / t_theirs / 1e3:5.0f} | {t_ours:7.1f} "
                          f"{nbytes / t_ours / 1e3:5.0f} | {t_theirs / t_ours:5.2f}x", flush=True)
    if len(heuristics) > 1:
        print("\nfastest heuristic per projection (block_n, tile, warps, pdl):")
        best = {}
        for r in results:
            key = (r["shape"], r["projection"], r["rows"])
            if key not in best or r["gemv_us"] < best[key]["gemv_us"]:
                best[key] = r
        for (name, what, rows), r in best.items():
            print(f"{name:14s} {what:16s} {rows:4d}  ({r['block_n']}, {r['tile']}, {r['warps']}, {r['pdl']})  "
                  f"{r['gemv_us']:.1f} us, {r['speedup']:.2f}x the baseline")
    with open(args.out, "w") as f:
        json.dump({"environment": describe_environment(torch.device("cuda")), "dtype": "bf16",
                   "weights": "hot (one set)" if args.hot else "cold (sets filling twice the L2 cache)", "rows": results},
                  f, indent=1)


if __name__ == "__main__":
    main()
