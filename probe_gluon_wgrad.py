"""Probe (deleted after use): the weight gradients' Gluon kernel variants against the Triton WS kernel."""
import importlib, json, os
import torch
import triton
from triton.testing import do_bench
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

mg = importlib.import_module("twinkle_triton.moe_gemm")
from twinkle_triton._moe_gemm_gluon import _padded_weight_grad_gluon_kernel as gk
from twinkle_triton._launch import run_with_scratch

SHAPES = {"qwen3": (128, 8, 2048, 768), "ernie": (64, 6, 2560, 1536)}


def gluon(a, b, offsets, padded, padded_a, bk, stages, bm=256, bn=128, warps=8, per_sm=1):
    E = offsets.shape[0] - 1
    m, n = a.shape[1], b.shape[1]
    out = a.new_empty((E, m, n))
    d = lambda t, blk: TensorDescriptor.from_tensor(t, blk, gl.NVMMASharedLayout.get_default_for(blk, gl.bfloat16))
    mb, nb = triton.cdiv(m, bm), triton.cdiv(n, bn)
    grid = (min(E * mb * nb, per_sm * torch.cuda.get_device_properties(0).multi_processor_count),)
    gk[grid](d(a, [bk, bm]), d(b, [bk, bn]), d(out.view(E * m, n), [bm, bn]), offsets, padded, E, m, mb, nb,
             PADDED_A=padded_a, STAGES=stages, num_warps=warps)
    return out


def main():
    torch.manual_seed(0)
    rows = []
    for name, (E, k, H, I) in SHAPES.items():
        T = 4096
        logits = torch.randn(T, E, device="cuda")
        idx = logits.topk(k, dim=1).indices
        routing = mg._Routing.sort(idx, E)
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        g = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        w = torch.rand(T * k, device="cuda")
        dgu = torch.randn(T * k, 2 * I, device="cuda", dtype=torch.bfloat16)
        h = torch.randn(T * k, I, device="cuda", dtype=torch.bfloat16)
        for bk in (64, 32):
            x_rows, scaled, padded = run_with_scratch(x.device, mg._gather_token_rows, x, g, w, routing, k, bk)
            cases = {"gate_up": (dgu, x_rows, False), "down": (scaled, h, True)}
            for what, (a, b, pa) in cases.items():
                mg.CONFIGS["padded_weight_grad"]["GLUON"] = False
                mg.CONFIGS["padded_weight_grad"]["BLOCK_K"] = bk
                mg.CONFIGS["padded_weight_grad"]["num_stages"] = 3 if bk == 64 else 4
                ref = run_with_scratch(a.device, mg._padded_weight_grad, a, b, routing.offsets, padded, pa, bk)
                t_ref = do_bench(lambda: run_with_scratch(a.device, mg._padded_weight_grad, a, b, routing.offsets,
                                                          padded, pa, bk), warmup=50, rep=300)
                variants = [(3, 1)] if bk == 64 else [(6, 1), (4, 1)]
                for stages, cbuf in variants:
                    try:
                        out = gluon(a, b, routing.offsets, padded, pa, bk, stages)
                        torch.cuda.synchronize()
                        same = torch.equal(out, ref)
                        err = (out.float() - ref.float()).abs().max().item()
                        t = do_bench(lambda: gluon(a, b, routing.offsets, padded, pa, bk, stages), warmup=50,
                                     rep=300)
                    except Exception as e:  # noqa: BLE001
                        print(name, what, bk, stages, cbuf, "failed", type(e).__name__, str(e)[:200], flush=True)
                        continue
                    row = dict(shape=name, grad=what, bk=bk, stages=stages, cbuf=cbuf, triton_ms=t_ref, gluon_ms=t,
                               equal=same, max_err=err)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "probe.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
