"""Host cost of the eager kernel path, piece by piece, on a GPU (a diagnostic, not a benchmark):
small tensors (8 x 896 bf16) so the device never holds the host back; best of 7 x 200 calls.
Run from the repository root: PYTHONPATH=.:kernels python tools/host_breakdown.py"""
import cProfile, io, pstats, sys, time, types
import torch
import triton.language as tl
import twinkle_triton as tt
import importlib
rn = importlib.import_module("twinkle_triton.rms_norm")
from twinkle_triton import _launch, layers

dev = "cuda"
def bench(name, fn, n=200):
    for _ in range(20): fn()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(n): fn()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    print(f"{name:42s} {best:7.2f} us", flush=True)

x = torch.randn(8, 896, device=dev, dtype=torch.bfloat16)
w = torch.ones(896, device=dev, dtype=torch.bfloat16)
out = torch.empty_like(x)
bench("torch.empty 8x896", lambda: torch.empty(8, 896, device=dev, dtype=torch.bfloat16))
bench("torch x * 1", lambda: x * 1)
bench("torch.empty_like", lambda: torch.empty_like(x))
args = (x, x, w, out, x, 896, 896, 1, 8, 896, 1e-6)  # ..., row strides, weight stride, n_rows, n_cols, eps
meta = dict(HAS_RESIDUAL=False, ROWS=1, BLOCK=1024, COMPUTE_DTYPE=tl.float32, num_warps=4)
bench("JIT kernel[grid](...)", lambda: rn._rms_norm_fwd_kernel[(8,)](*args, **meta))
L = _launch.cached_launcher(rn._rms_norm_fwd_kernel)
bench("CachedLauncher[grid](...)", lambda: L[(8,)](*args, **meta))
print("cache entries", {k: len(v._compiled) for k, v in _launch._LAUNCHERS.items()})
run, fn_, packed, tail = next(iter(L._compiled.values()))
stream = torch.cuda.current_stream().cuda_stream
bench("compiled.run direct", lambda: run(8, 1, 1, stream, fn_, packed, None, None, None, *args, *tail))
with torch.no_grad():
    bench("rms_norm() no grad", lambda: tt.rms_norm(x, w, 1e-6))
xg = x.clone().requires_grad_(); wg = w.clone().requires_grad_()
bench("rms_norm() grad fwd", lambda: tt.rms_norm(xg, wg, 1e-6))
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm
norm = Qwen2RMSNorm(896).to(dev, torch.bfloat16)
with torch.no_grad():
    bench("HF Qwen2RMSNorm no grad", lambda: norm(x))
    norm.forward = types.MethodType(layers.RMSNorm.forward, norm)
    bench("swapped RMSNorm module no grad", lambda: norm(x))
q = torch.randn(8, 1, 14, 64, device=dev, dtype=torch.bfloat16).transpose(1, 2)
k = torch.randn(8, 1, 2, 64, device=dev, dtype=torch.bfloat16).transpose(1, 2)
cos = torch.randn(8, 1, 64, device=dev, dtype=torch.bfloat16); sin = torch.randn(8, 1, 64, device=dev, dtype=torch.bfloat16)
g = torch.randn(8, 4864, device=dev, dtype=torch.bfloat16); u = torch.randn(8, 4864, device=dev, dtype=torch.bfloat16)
with torch.no_grad():
    bench("rotary no grad", lambda: tt.apply_rotary_pos_emb(q, k, cos, sin))
    bench("rotary reference no grad", lambda: tt.apply_rotary_pos_emb_reference(q, k, cos, sin))
    bench("silu_mul no grad", lambda: tt.silu_mul(g, u))
    bench("add_rms_norm no grad", lambda: tt.add_rms_norm(x, x, w, 1e-6))

class F(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b): return torch.empty_like(a)
    @staticmethod
    def backward(ctx, g): return g, None
bench("empty autograd.Function fwd (cuda)", lambda: F.apply(xg, wg))

# backward per node: N independent leaves, one autograd.grad
def bwd_per_node(name, make, op, N=64):
    best = 1e9
    for _ in range(5):
        leaves = [tuple(t.detach().clone().requires_grad_() if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() > 0 and not name.startswith("rotary") or (name.startswith("rotary") and i < 2 and isinstance(t, torch.Tensor)) else t for i, t in enumerate(make())) for _ in range(N)]
        outs = [op(*l) for l in leaves]
        outs = [o if isinstance(o, torch.Tensor) else o[0] for o in outs]
        inputs = [t for l in leaves for t in l if isinstance(t, torch.Tensor) and t.requires_grad]
        grads = [torch.ones_like(o) for o in outs]
        torch.cuda.synchronize()
        t = time.perf_counter()
        torch.autograd.grad(outs, inputs, grads)
        best = min(best, (time.perf_counter() - t) / N * 1e6)
        torch.cuda.synchronize()
    print(f"{'bwd per node ' + name:42s} {best:7.2f} us", flush=True)

bwd_per_node("rms_norm", lambda: (x, w, 1e-6), tt.rms_norm)
bwd_per_node("rms_norm reference", lambda: (x, w, 1e-6), tt.rms_norm_reference)
bwd_per_node("silu_mul", lambda: (g, u), tt.silu_mul)
bwd_per_node("silu_mul reference", lambda: (g, u), tt.silu_mul_reference)
bwd_per_node("rotary", lambda: (q, k, cos, sin), tt.apply_rotary_pos_emb)
bwd_per_node("x*1", lambda: (x,), lambda a: a * 1)

# where a kernelized training step spends host time
sys.path.insert(0, ".")
from twinkle_fx.bench.workloads import build_model, get_workload, make_batch
from twinkle_fx import kernelize_model, scoped_registry
from twinkle_fx.builtin import use_builtin_kernels
wl = get_workload("qwen2")
model = build_model(wl, tiny=False, dtype=torch.bfloat16, device=torch.device(dev), seed=0)
ids, labels = make_batch(wl, tiny=False, batch=4, seq=1024, device=torch.device(dev), seed=0)
def step():
    model.zero_grad(set_to_none=True)
    model(input_ids=ids, labels=labels).loss.backward()
with scoped_registry():
    use_builtin_kernels(models=("qwen2",), decoder_layers=True)
    kernelize_model(model, mode="train", device="cuda")
    for _ in range(3): step()
    torch.cuda.synchronize()
    p = cProfile.Profile(); p.enable()
    for _ in range(3): step()
    p.disable(); torch.cuda.synchronize()
    s = io.StringIO(); pstats.Stats(p, stream=s).sort_stats("tottime").print_stats(35); print(s.getvalue()[-9000:])
