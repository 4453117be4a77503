"""The decode GEMV kernels against cuBLAS at the projections of three model shapes, one and a few rows.

Each row times ``twinkle_triton.gemv`` (q/k/v in one launch, o and down with the residual add,
the LM head) or ``gemv_swiglu`` (gate and up with the SwiGLU product) against what the graph runs
without them: ``F.linear`` per weight (cuBLAS) on pre-concatenated q/k/v weights, or on the gate and
up weights with ``silu(g) * u`` after; the ``norm + ...`` rows take the RMSNorm in the kernel's prologue
(``norm_weight=``) against ``twinkle_triton.rms_norm``'s kernel before the same GEMV. Times are CUDA-graph replays
(``triton.testing.do_bench_cudagraph``: no launch gaps, as inside the decode loop's graph) over enough copies of
the weights to fill twice the L2 cache, so each call reads its weights from DRAM as a decode step's layers do
(``--hot``: one set, which an H200's 50 MB L2 holds at the 0.5B shape); GB/s is the weights' bytes over that time. The
rows where the kernels win are what ``twinkle_triton.gemv.DECODE_ROWS`` admits (the graph rewrite and SwiGLUMLP).

``--block-n``, ``--tiles`` and ``--warps`` sweep the kernels' launch heuristic (weight rows a program, register
tile, warps a program; ``twinkle_triton.gemv._BLOCK_N`` / ``_TILE`` and ``_TILE_WIDE_K`` / ``_WARPS``; a tile of 0
in the output is the kernels' own choice); ``--shapes`` picks the model shapes.

    python tools/gemv_sweep.py --out gemv.json
    python tools/gemv_sweep.py --out gemv-tune.json --rows 1 --block-n 2,4,8 --tiles 4096,8192,16384 --warps 4,8
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

# shape name -> (hidden, intermediate, q width, kv width, vocab)
SHAPES = {"qwen2-0.5b": (896, 4864, 896, 128, 151936), "llama-3.2-1b": (2048, 8192, 2048, 512, 128256),
          "llama-3.2-3b": (3072, 8192, 3072, 1024, 128256)}


def _cases(hidden, inter, q, kv, vocab, rows, dtype):
    """projection -> (weights: a fresh set of the projection's weights, ours(weights), theirs(weights), numel)."""
    def w(n, k):
        return torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5

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
    }


def _per_call_us(fn, sets) -> float:
    """Microseconds a call: one CUDA graph calls ``fn`` on each weight set in turn (each set's first read comes
    from DRAM when the sets together outgrow the L2 cache, as a decode step's layers do)."""
    return do_bench_cudagraph(lambda: [fn(ws) for ws in sets]) * 1e3 / len(sets)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=output_file)
    parser.add_argument("--rows", default="1,2,4,8", help="comma-separated row counts (at most 16)")
    parser.add_argument("--block-n", default=str(gemv_module._BLOCK_N), help="comma-separated weight rows a program")
    parser.add_argument("--tiles", default="heuristic",
                        help="comma-separated register tiles (products) for every weight; default: the kernels' own "
                             "choice (_TILE, or _TILE_WIDE_K for a weight at least as wide as the output)")
    parser.add_argument("--warps", default=str(gemv_module._WARPS), help="comma-separated warps a program")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--hot", action="store_true",
                        help="time every call on one weight set, which stays in the L2 cache when it fits; default: "
                             "rotate through enough copies of the weights to fill twice the L2 cache, so every call "
                             "reads its weights from DRAM, as in a decode step")
    args = parser.parse_args()
    unknown = sorted(set(args.shapes.split(",")) - set(SHAPES))
    if unknown:
        parser.error(f"--shapes: unknown {', '.join(unknown)}; known: {', '.join(SHAPES)}")
    dtype, results = torch.bfloat16, []
    cold_bytes = 0 if args.hot else 2 * torch.cuda.get_device_properties(0).L2_cache_size
    default_tiles = gemv_module._TILE, gemv_module._TILE_WIDE_K
    tiles = [0] if args.tiles == "heuristic" else [int(t) for t in args.tiles.split(",")]  # 0: the heuristic
    heuristics = [(int(b), t, int(w)) for b in args.block_n.split(",") for t in tiles for w in args.warps.split(",")]
    print(f"{'shape':14s} {'projection':16s} rows  N  tile  w baseline us  GB/s | gemv us  GB/s | speedup")
    for name in args.shapes.split(","):
        dims = SHAPES[name]
        for rows in (int(r) for r in args.rows.split(",")):
            for what, (weights, ours, theirs, numel) in _cases(*dims, rows, dtype).items():
                nbytes = numel * torch.finfo(dtype).bits // 8
                sets = [weights() for _ in range(max(1, -(-cold_bytes // nbytes)))]
                t_theirs = _per_call_us(theirs, sets)
                for block_n, tile, warps in heuristics:
                    gemv_module._BLOCK_N, gemv_module._WARPS = block_n, warps
                    gemv_module._TILE, gemv_module._TILE_WIDE_K = (tile, tile) if tile else default_tiles
                    torch.testing.assert_close(ours(sets[0]), theirs(sets[0]), rtol=2e-2, atol=2e-2)
                    t_ours = _per_call_us(ours, sets)
                    results.append({"shape": name, "projection": what, "rows": rows, "block_n": block_n, "tile": tile,
                                    "warps": warps, "weight_sets": len(sets), "cublas_us": t_theirs, "gemv_us": t_ours,
                                    "speedup": t_theirs / t_ours})
                    print(f"{name:14s} {what:16s} {rows:4d} {block_n:2d} {tile:5d} {warps:2d} {t_theirs:11.1f} "
                          f"{nbytes / t_theirs / 1e3:5.0f} | {t_ours:7.1f} {nbytes / t_ours / 1e3:5.0f} | "
                          f"{t_theirs / t_ours:5.2f}x", flush=True)
    if len(heuristics) > 1:
        print("\nfastest heuristic per projection (block_n, tile, warps):")
        best = {}
        for r in results:
            key = (r["shape"], r["projection"], r["rows"])
            if key not in best or r["gemv_us"] < best[key]["gemv_us"]:
                best[key] = r
        for (name, what, rows), r in best.items():
            print(f"{name:14s} {what:16s} {rows:4d}  ({r['block_n']}, {r['tile']}, {r['warps']})  "
                  f"{r['gemv_us']:.1f} us, {r['speedup']:.2f}x the baseline")
    with open(args.out, "w") as f:
        json.dump({"environment": describe_environment(torch.device("cuda")), "dtype": "bf16",
                   "weights": "hot (one set)" if args.hot else "cold (sets filling twice the L2 cache)", "rows": results},
                  f, indent=1)


if __name__ == "__main__":
    main()
