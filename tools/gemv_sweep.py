"""The decode GEMV kernels against cuBLAS at the projections of three model shapes, one and a few rows.

Each row times ``twinkle_triton.gemv`` (q/k/v in one launch, o and down with the residual add,
the LM head) or ``gemv_swiglu`` (gate and up with the SwiGLU product) against what the graph runs
without them: ``F.linear`` per weight (cuBLAS) on pre-concatenated q/k/v weights, or on the gate and
up weights with ``silu(g) * u`` after; the ``norm + ...`` rows take the RMSNorm in the kernel's prologue
(``norm_weight=``) against ``twinkle_triton.rms_norm``'s kernel before the same GEMV. Times are CUDA-graph replays (``triton.testing.do_bench_cudagraph``:
no launch gaps, as inside the decode loop's graph); GB/s is the weights' bytes over that time. The
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
    def w(n, k):
        return torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5

    x, xi = torch.randn(rows, hidden, device="cuda", dtype=dtype), torch.randn(rows, inter, device="cuda", dtype=dtype)
    wq, wk, wv, wo, wg, wu, wd, wl = w(q, hidden), w(kv, hidden), w(kv, hidden), w(hidden, q), w(inter, hidden), \
        w(inter, hidden), w(hidden, inter), w(vocab, hidden)
    qkv = torch.cat([wq, wk, wv])
    res = torch.randn(rows, hidden, device="cuda", dtype=dtype)
    g, eps = torch.rand(hidden, device="cuda", dtype=dtype) + 0.5, 1e-6
    return {
        # the norm in the GEMV's prologue against the norm's own kernel before the GEMV (what the graph ran)
        "norm + qkv": (lambda: tt.gemv(x, [wq, wk, wv], norm_weight=g, eps=eps),
                       lambda: tt.gemv(tt.rms_norm(x, g, eps), [wq, wk, wv]), qkv.numel()),
        "norm + gate/up": (lambda: tt.gemv_swiglu(x, wg, wu, norm_weight=g, eps=eps),
                           lambda: tt.gemv_swiglu(tt.rms_norm(x, g, eps), wg, wu), 2 * wg.numel()),
        "qkv": (lambda: tt.gemv(x, [wq, wk, wv]), lambda: F.linear(x, qkv), qkv.numel()),
        "o + residual": (lambda: tt.gemv(x, [wo], residual=res), lambda: res + F.linear(x, wo), wo.numel()),
        "gate/up swiglu": (lambda: tt.gemv_swiglu(x, wg, wu), lambda: F.silu(F.linear(x, wg)) * F.linear(x, wu),
                           2 * wg.numel()),
        "down + residual": (lambda: tt.gemv(xi, [wd], residual=res), lambda: res + F.linear(xi, wd), wd.numel()),
        "lm_head": (lambda: tt.gemv(x, [wl]), lambda: F.linear(x, wl), wl.numel()),
    }


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
    args = parser.parse_args()
    unknown = sorted(set(args.shapes.split(",")) - set(SHAPES))
    if unknown:
        parser.error(f"--shapes: unknown {', '.join(unknown)}; known: {', '.join(SHAPES)}")
    dtype, results = torch.bfloat16, []
    default_tiles = gemv_module._TILE, gemv_module._TILE_WIDE_K
    tiles = [0] if args.tiles == "heuristic" else [int(t) for t in args.tiles.split(",")]  # 0: the heuristic
    heuristics = [(int(b), t, int(w)) for b in args.block_n.split(",") for t in tiles for w in args.warps.split(",")]
    print(f"{'shape':14s} {'projection':16s} rows  N  tile  w baseline us  GB/s | gemv us  GB/s | speedup")
    for name in args.shapes.split(","):
        dims = SHAPES[name]
        for rows in (int(r) for r in args.rows.split(",")):
            for what, (ours, theirs, numel) in _cases(*dims, rows, dtype).items():
                t_theirs = do_bench_cudagraph(theirs) * 1e3
                nbytes = numel * torch.finfo(dtype).bits // 8
                for block_n, tile, warps in heuristics:
                    gemv_module._BLOCK_N, gemv_module._WARPS = block_n, warps
                    gemv_module._TILE, gemv_module._TILE_WIDE_K = (tile, tile) if tile else default_tiles
                    torch.testing.assert_close(ours(), theirs(), rtol=2e-2, atol=2e-2)
                    t_ours = do_bench_cudagraph(ours) * 1e3
                    results.append({"shape": name, "projection": what, "rows": rows, "block_n": block_n, "tile": tile,
                                    "warps": warps, "cublas_us": t_theirs, "gemv_us": t_ours,
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
        json.dump({"environment": describe_environment(torch.device("cuda")), "dtype": "bf16", "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
