"""Kernel microbenchmarks: every op of ``twinkle_triton`` at a realistic LLM shape, forward and
forward + backward, next to its plain-PyTorch ``<op>_reference`` (eager), ``torch.compile`` of that
reference (Inductor), Liger where Liger has the op, and Apple's Cut Cross-Entropy
(``cut_cross_entropy.linear_cross_entropy``, its defaults) for the fused linear cross-entropy.

Memory-bound ops report achieved GB/s, the minimum bytes the op must read and write divided by its
time, as a fraction of a device-to-device copy (``Tensor.copy_`` of a 1 GiB buffer) measured in the
same process: that copy is the practical roofline of a streaming kernel on this device. The fused
linear cross-entropy is matmul-bound and reports TFLOP/s (its three matmuls) and, above all, the
extra memory it needs. Every implementation is checked against the reference once (outputs and
input gradients); a disagreement marks the row WRONG.

Each row's time runs from a CUDA event before the call to one after it, so a call whose host work outlasts
its kernels (a small op's forward + backward through autograd) is timed by its host. On a GPU each row also
has the call's kernel time alone (:func:`.timing.kernel_ms`, summed from the profiler): what a step replayed
from a CUDA graph pays, and the measure a kernel and Inductor's code for the same region compare by.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..core.tolerances import tolerance
from ..measure.environment import describe_environment
from .model_bench import free_device_memory
from .report import annotate_micro_rows
from .results import BenchResult, MicroRow
from ..measure.clock import DeviceClock
from .timing import GIB, copy_ms, host_us, kernel_ms, time_calls

__all__ = ["MICRO_IMPLS", "MICRO_CASES", "MicroBenchOptions", "run_micro_bench"]

MICRO_IMPLS = ("eager", "inductor", "twinkle", "liger", "cce")



@dataclass
class CaseInputs:
    """The arguments of one op (the same for ``twinkle_triton.<op>`` and ``<op>_reference``).

    Gradients are taken with respect to every tensor argument that requires grad.
    """

    shape: str
    args: tuple
    bytes_fwd: int | None = None  # minimum bytes read + written (memory-bound ops)
    bytes_bwd: int | None = None
    flops_fwd: int | None = None  # matmul-bound ops
    flops_bwd: int | None = None
    # when Liger takes the inputs in another layout: its arguments, and a map from its input
    # gradients to the reference's
    liger_args: tuple | None = None
    liger_grads: Callable[[tuple], tuple] | None = None
    # what the eager and inductor rows run instead of ``<op>_reference`` (same arguments): what a user runs
    # without twinkle, where it is not the reference's (transformers' grouped experts for the MoE op)
    baseline: Callable[..., Any] | None = None


@dataclass(frozen=True)
class MicroCase:
    op: str  # twinkle_triton function name; "<op>_reference" is its eager reference
    make: Callable[[bool, torch.device, torch.dtype], CaseInputs]  # (tiny, device, dtype)
    liger: str | None = None  # function in liger_kernel.transformers.functional, if Liger has the op
    name: str | None = None  # the rows' op column where one op has several cases (shapes); default ``op``

    @property
    def label(self) -> str:
        return self.name or self.op


def _randn(*shape: int, device, dtype, grad: bool = True, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, device=device, dtype=torch.float32) * scale).to(dtype).requires_grad_(grad)


def _silu_and_mul(tiny: bool, device, dtype) -> CaseInputs:
    n, d = (64, 128) if tiny else (4096, 14336)  # Llama-3-8B MLP: intermediate 14336
    x = _randn(n, 2 * d, device=device, dtype=dtype)
    e = x.element_size()
    # Liger's swiglu takes gate and up as two tensors (and assumes both contiguous)
    gate, up = (t.detach().contiguous().requires_grad_() for t in x.chunk(2, dim=-1))
    return CaseInputs(f"x {n} x 2*{d}", (x,), bytes_fwd=3 * n * d * e, bytes_bwd=5 * n * d * e,
                      liger_args=(gate, up), liger_grads=lambda grads: (torch.cat(grads, dim=-1),))


def _clamped_swiglu(tiny: bool, device, dtype) -> CaseInputs:
    # GPT-OSS-20B experts: intermediate 2880, 4096 tokens x top-4 routed rows
    n, d = (64, 128) if tiny else (16384, 2880)
    x = _randn(n, 2 * d, device=device, dtype=dtype, scale=4.0)  # some values beyond the clamp at 7
    e = x.element_size()
    return CaseInputs(f"x {n} x 2*{d} interleaved, alpha 1.702, limit 7", (x, 1.702, 7.0),
                      bytes_fwd=3 * n * d * e, bytes_bwd=5 * n * d * e)


def _silu_mul(tiny: bool, device, dtype) -> CaseInputs:
    n, d = (64, 128) if tiny else (4096, 14336)
    gate, up = _randn(n, d, device=device, dtype=dtype), _randn(n, d, device=device, dtype=dtype)
    e = gate.element_size()
    return CaseInputs(f"gate, up {n} x {d}", (gate, up), bytes_fwd=3 * n * d * e, bytes_bwd=5 * n * d * e)


def _rms_norm(tiny: bool, device, dtype) -> CaseInputs:
    n, h = (64, 128) if tiny else (16384, 4096)
    x = _randn(n, h, device=device, dtype=dtype)
    weight = (1 + _randn(h, device=device, dtype=torch.float32, grad=False, scale=0.1)).to(dtype).requires_grad_()
    e = x.element_size()
    return CaseInputs(f"x {n} x {h}, eps 1e-6", (x, weight, 1e-6),
                      bytes_fwd=2 * n * h * e + h * e, bytes_bwd=3 * n * h * e + 2 * h * e)


def _add_rms_norm(rows: int, hidden: int, name: str = "") -> Callable[[bool, torch.device, torch.dtype], CaseInputs]:
    def make(tiny: bool, device, dtype) -> CaseInputs:
        n, h = (64, 128) if tiny else (rows, hidden)
        x, residual = _randn(n, h, device=device, dtype=dtype), _randn(n, h, device=device, dtype=dtype)
        weight = (1 + _randn(h, device=device, dtype=torch.float32, grad=False, scale=0.1)).to(dtype).requires_grad_()
        e = x.element_size()
        # fwd reads x, residual, writes normed and sum; bwd reads both output gradients and the saved
        # sum and writes one input gradient (x's and residual's are equal)
        return CaseInputs(f"{name}x, residual {n} x {h}, eps 1e-6", (x, residual, weight, 1e-6),
                          bytes_fwd=4 * n * h * e + h * e, bytes_bwd=4 * n * h * e + 2 * h * e)
    return make


def _rotary(tiny: bool, device, dtype) -> CaseInputs:
    # Llama-3-8B attention at batch 4 x 1024: 32 query heads, 8 KV heads, head_dim 128; q and k laid
    # out as transformers makes them (projection output viewed [b, s, h, d] and transposed)
    b, s, hq, hk, d = (1, 16, 4, 2, 32) if tiny else (4, 1024, 32, 8, 128)
    q_proj = _randn(b, s, hq, d, device=device, dtype=dtype)
    k_proj = _randn(b, s, hk, d, device=device, dtype=dtype)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
    freqs = torch.arange(s, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1).expand(b, s, d)
    cos, sin = emb.cos().to(dtype).contiguous(), emb.sin().to(dtype).contiguous()
    e = q_proj.element_size()
    moved = 2 * (q_proj.numel() + k_proj.numel()) * e + 2 * cos.numel() * e
    return CaseInputs(f"q {b} x {hq} x {s} x {d}, k {b} x {hk} x {s} x {d} (transposed views), cos/sin {b} x {s} x {d}",
                      (q_proj.transpose(1, 2), k_proj.transpose(1, 2), cos, sin), bytes_fwd=moved, bytes_bwd=moved)


def _add_gelu(tiny: bool, device, dtype) -> CaseInputs:
    n, d = (64, 256) if tiny else (4096, 16384)  # GPT-style MLP: 4 x hidden 4096
    x, bias = _randn(n, d, device=device, dtype=dtype), _randn(d, device=device, dtype=dtype)
    e = x.element_size()
    return CaseInputs(f"x {n} x {d}, bias {d}, erf form (approximate='none')", (x, bias), bytes_fwd=2 * n * d * e + d * e,
                      bytes_bwd=3 * n * d * e + 2 * d * e)


def _mul_add(tiny: bool, device, dtype) -> CaseInputs:
    n, d = (64, 256) if tiny else (4096, 14336)
    a, b, c = (_randn(n, d, device=device, dtype=dtype) for _ in range(3))
    e = a.element_size()
    # bwd reads the output gradient, a and b, writes da and db (dc is the output gradient itself)
    return CaseInputs(f"a, b, c {n} x {d}", (a, b, c), bytes_fwd=4 * n * d * e, bytes_bwd=5 * n * d * e)


def _gelu_mul(tiny: bool, device, dtype) -> CaseInputs:
    n, d = (64, 128) if tiny else (4096, 16384)  # Gemma-7B MLP: intermediate 24576; 16384 keeps it comparable
    gate, up = _randn(n, d, device=device, dtype=dtype), _randn(n, d, device=device, dtype=dtype)
    e = gate.element_size()
    return CaseInputs(f"gate, up {n} x {d}, tanh GELU (Gemma)", (gate, up, "tanh"), bytes_fwd=3 * n * d * e,
                      bytes_bwd=5 * n * d * e)


def _rms_norm_fp32(tiny: bool, device, dtype) -> CaseInputs:
    n, h = (64, 128) if tiny else (16384, 4096)
    x = _randn(n, h, device=device, dtype=dtype)
    weight = _randn(h, device=device, dtype=dtype, scale=0.1)
    e = x.element_size()
    return CaseInputs(f"x {n} x {h}, eps 1e-6, offset 1 (Gemma)", (x, weight, 1e-6, 1.0),
                      bytes_fwd=2 * n * h * e + h * e, bytes_bwd=3 * n * h * e + 2 * h * e)


def _layer_norm(tiny: bool, device, dtype) -> CaseInputs:
    n, h = (64, 128) if tiny else (16384, 4096)
    x = _randn(n, h, device=device, dtype=dtype)
    weight = (1 + _randn(h, device=device, dtype=torch.float32, grad=False, scale=0.1)).to(dtype).requires_grad_()
    e = x.element_size()
    return CaseInputs(f"x {n} x {h}, no bias, eps 1e-5 (Cohere)", (x, weight, None, 1e-5),
                      bytes_fwd=2 * n * h * e + h * e, bytes_bwd=3 * n * h * e + 2 * h * e)


def _rotary_partial(tiny: bool, device, dtype) -> CaseInputs:
    # Phi3-style partial rotary at the Llama-3-8B attention shape: half of each 128-wide head rotates
    inputs = _rotary(tiny, device, dtype)
    q, k, cos, sin = inputs.args
    r = q.shape[-1] // 2
    moved = inputs.bytes_fwd - cos.numel() * cos.element_size()  # cos and sin half as wide
    return CaseInputs(inputs.shape.replace("cos/sin", "partial, cos/sin") + f"[..., :{r}]",
                      (q, k, cos[..., :r].contiguous(), sin[..., :r].contiguous()), bytes_fwd=moved, bytes_bwd=moved)


def _rotary_deinterleave(tiny: bool, device, dtype) -> CaseInputs:
    # DeepSeek-V3's MLA at batch 4 x 1024: 128 query heads whose last 64 of 192 columns rotate (a
    # strided slice of the projection), one shared 64-wide key head; cos/sin as cat(freqs, freqs)
    b, s, hq, nope, r = (1, 16, 4, 8, 16) if tiny else (4, 1024, 128, 128, 64)
    q = _randn(b, s, hq, nope + r, device=device, dtype=dtype, grad=False)
    q_rot = q.transpose(1, 2)[..., nope:].detach().requires_grad_()
    k_rot = _randn(b, 1, s, r, device=device, dtype=dtype)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, r, 2, device=device, dtype=torch.float32) / r))
    freqs = torch.arange(s, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1).expand(b, s, r)
    cos, sin = emb.cos().to(dtype).contiguous(), emb.sin().to(dtype).contiguous()
    e = q.element_size()
    moved = 2 * (q_rot.numel() + k_rot.numel()) * e + cos.numel() * e  # half of cos and of sin read
    return CaseInputs(f"q {b} x {hq} x {s} x {r} (columns {nope}: of {nope + r}), k {b} x 1 x {s} x {r}, "
                      f"cos/sin {b} x {s} x {r} (DeepSeek-V3 interleaved)", (q_rot, k_rot, cos, sin),
                      bytes_fwd=moved, bytes_bwd=moved)


def _fused_linear_cross_entropy(tiny: bool, device, dtype) -> CaseInputs:
    # the LM head of the reference workload (Qwen2-0.5B): 4096 tokens, hidden 896, vocab 151936
    n, h, v = (64, 32, 256) if tiny else (4096, 896, 151936)
    x = _randn(n, h, device=device, dtype=dtype)
    weight = _randn(v, h, device=device, dtype=dtype, scale=0.02)
    labels = torch.randint(0, v, (n,), device=device)
    labels[::7] = -100  # ignore_index, as padding and prompt tokens are in training
    return CaseInputs(f"{n} tokens x {h} -> {v} vocab, every 7th label -100", (x, weight, labels),
                      flops_fwd=2 * n * h * v, flops_bwd=4 * n * h * v)


def _grouped_experts(experts: int, top_k: int, hidden: int, inter: int, dtype: torch.dtype) -> Callable:
    """transformers' grouped_mm experts (``Qwen3MoeExperts`` with ``_experts_implementation="grouped_mm"``: the
    tokens sorted and copied by expert, ``torch._grouped_mm``, the SwiGLU and the weighted sum as separate ops)
    as a function of ``moe_swiglu_experts``'s arguments."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    config = Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=inter, num_experts=experts,
                            num_experts_per_tok=top_k)
    config._experts_implementation = "grouped_mm"
    with torch.device("meta"):  # the weights come in as arguments
        module = Qwen3MoeExperts(config).to(dtype)

    def grouped_mm_experts(x, gate_up_proj, down_proj, top_k_index, top_k_weights):
        return torch.func.functional_call(module, {"gate_up_proj": gate_up_proj, "down_proj": down_proj},
                                          (x, top_k_index, top_k_weights))

    return grouped_mm_experts


def _moe_experts(shape: tuple[int, int, int, int],
                 name: str) -> Callable[[bool, torch.device, torch.dtype], CaseInputs]:
    """A training slice's MoE layer at 4 x 1024 tokens: (experts, top-k, hidden, intermediate)."""
    def make(tiny: bool, device, dtype) -> CaseInputs:
        experts, top_k, hidden, inter = (4, 2, 32, 16) if tiny else shape
        tokens = 64 if tiny else 4096
        x = _randn(tokens, hidden, device=device, dtype=dtype)
        gate_up = _randn(experts, 2 * inter, hidden, device=device, dtype=dtype, scale=hidden**-0.5)
        down = _randn(experts, hidden, inter, device=device, dtype=dtype, scale=inter**-0.5)
        # a softmax router's top-k over random logits: about balanced
        weights, index = torch.randn(tokens, experts, device=device).softmax(-1).topk(top_k, dim=-1)
        flops = 6 * tokens * top_k * hidden * inter
        return CaseInputs(f"{name}: {tokens} tokens, {experts} experts top-{top_k}, {hidden} -> {inter}",
                          (x, gate_up, down, index, weights.to(dtype).requires_grad_()), flops_fwd=flops,
                          flops_bwd=2 * flops, baseline=_grouped_experts(experts, top_k, hidden, inter, dtype))
    return make


def _causal_sdpa(query, key, value, attn_mask):
    """What a compiled training step runs for causal attention: ``scaled_dot_product_attention`` with
    ``is_causal=True`` over transformers' ``repeat_kv`` K and V (cuDNN's flash kernels on a Hopper GPU), whatever
    ``attn_mask`` (the same causal mask as a tensor, which ``gqa_attention`` reads)."""
    from twinkle_triton.gqa_attention import repeat_kv

    group = query.shape[1] // key.shape[1]
    return torch.nn.functional.scaled_dot_product_attention(query, repeat_kv(key, group), repeat_kv(value, group),
                                                            is_causal=True)


def _causal_attention(shape: tuple[int, int, int, int, int],
                      name: str) -> Callable[[bool, torch.device, torch.dtype], CaseInputs]:
    """Causal grouped-query attention of a training step: (batch, query heads, KV heads, length, head dim)."""
    def make(tiny: bool, device, dtype) -> CaseInputs:
        b, hq, hkv, n, d = (1, 4, 2, 48, 16) if tiny else shape
        q = _randn(b, hq, n, d, device=device, dtype=dtype)
        k, v = _randn(b, hkv, n, d, device=device, dtype=dtype), _randn(b, hkv, n, d, device=device, dtype=dtype)
        mask = torch.ones(n, n, dtype=torch.bool, device=device).tril()[None, None]
        flops = 2 * b * hq * n * n * d  # QK^T and PV over the causal half
        return CaseInputs(f"{name}: q {b} x {hq} x {n} x {d}, k, v {hkv} heads, causal", (q, k, v, mask),
                          flops_fwd=flops, flops_bwd=5 * flops // 2, baseline=_causal_sdpa)
    return make


MICRO_CASES: tuple[MicroCase, ...] = (
    MicroCase("silu_and_mul", _silu_and_mul, liger="liger_swiglu"),
    MicroCase("silu_mul", _silu_mul, liger="liger_swiglu"),
    MicroCase("rms_norm", _rms_norm, liger="liger_rms_norm"),
    MicroCase("add_rms_norm", _add_rms_norm(16384, 4096), liger="liger_fused_add_rms_norm"),
    # a decoder layer's residual add + norm in the training matrix's steps (4 x 1024 tokens)
    MicroCase("add_rms_norm", _add_rms_norm(4096, 2048, "Llama-3.2-1B: "), liger="liger_fused_add_rms_norm",
              name="add_rms_norm llama1b"),
    MicroCase("add_rms_norm", _add_rms_norm(4096, 3072, "Llama-3.2-3B: "), liger="liger_fused_add_rms_norm",
              name="add_rms_norm llama3b"),
    MicroCase("apply_rotary_pos_emb", _rotary, liger="liger_rope"),
    MicroCase("add_gelu", _add_gelu),
    MicroCase("mul_add", _mul_add),
    MicroCase("fused_linear_cross_entropy", _fused_linear_cross_entropy, liger="liger_fused_linear_cross_entropy"),
    MicroCase("gelu_mul", _gelu_mul),
    MicroCase("rms_norm_fp32", _rms_norm_fp32),
    MicroCase("layer_norm", _layer_norm),
    MicroCase("apply_rotary_pos_emb_partial", _rotary_partial),
    MicroCase("apply_rotary_pos_emb_deinterleave", _rotary_deinterleave),
    MicroCase("clamped_swiglu", _clamped_swiglu),
    MicroCase("moe_swiglu_experts", _moe_experts((128, 8, 2048, 768), "Qwen3-30B-A3B layer"),
              name="moe_swiglu_experts qwen3_moe"),
    MicroCase("moe_swiglu_experts", _moe_experts((8, 2, 4096, 14336), "Mixtral-8x7B layer"),
              name="moe_swiglu_experts mixtral"),
    MicroCase("moe_swiglu_experts", _moe_experts((64, 6, 2560, 1536), "ERNIE-4.5-21B-A3B layer"),
              name="moe_swiglu_experts ernie4_5_moe"),
    MicroCase("moe_swiglu_experts", _moe_experts((64, 6, 2048, 1408), "Moonlight-16B-A3B (DeepSeek-V3) layer"),
              name="moe_swiglu_experts deepseek_v3"),
    # the training matrix's attention at 4 x 1024 tokens, against SDPA with is_causal (cuDNN on Hopper)
    MicroCase("gqa_attention", _causal_attention((4, 32, 8, 1024, 64), "Llama-3.2-1B"),
              name="gqa_attention llama1b"),
    MicroCase("gqa_attention", _causal_attention((4, 24, 8, 1024, 128), "Llama-3.2-3B"),
              name="gqa_attention llama3b"),
)

PHASES = ("fwd", "fwd+bwd")

# Calls per host-time measurement (bench.timing.host_us): few enough that the device queue never
# fills (then the host would wait on the device), enough to average the timer's resolution.
HOST_CALLS = 20
# Profiled calls per kernel-time measurement (bench.timing.kernel_ms): its sums need no median.
KERNEL_REPS = 10
# Forwards whose backwards one autograd.grad call runs (their saved tensors are alive together).
HOST_BWD_CALLS = 8


@dataclass(frozen=True)
class MicroBenchOptions:
    impls: list[str]
    dtype: torch.dtype
    reps: int
    warmup: int
    device: torch.device
    tiny: bool = False
    seed: int = 0
    ops: list[str] = field(default_factory=list)  # empty: all


def _import(module: str, *, not_installed: str) -> tuple[Any, str | None]:
    """``(module, None)`` or ``(None, why not)``: not installed, or installed but failing to import."""
    try:
        return importlib.import_module(module), None
    except ImportError as e:
        if importlib.util.find_spec(module.split(".")[0]) is None:
            return None, not_installed
        return None, f"importing {module} raised {type(e).__name__}: {e}"


def _tensors(out: Any) -> tuple[torch.Tensor, ...]:
    return (out,) if isinstance(out, torch.Tensor) else tuple(t for t in out if isinstance(t, torch.Tensor))


def _grad_inputs(args: tuple) -> list[torch.Tensor]:
    return [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]


def _rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    if actual.shape != expected.shape:
        return math.inf
    expected = expected.detach().float()
    diff = torch.linalg.vector_norm(actual.detach().float() - expected)
    scale = torch.linalg.vector_norm(expected)
    return float(diff / scale) if scale > 0 else float(diff)


@dataclass
class _Impl:
    name: str
    fn: Callable[..., Any] | None
    args: tuple
    to_reference_grads: Callable[[tuple], tuple] | None = None
    error: str | None = None  # unavailable


class _Case:
    """One op's inputs, the reference results and the timing of each implementation."""

    def __init__(self, case: MicroCase, inputs: CaseInputs, options: MicroBenchOptions, clock: DeviceClock,
                 copy_gbps: float) -> None:
        self.case, self.inputs, self.options, self.clock, self.copy_gbps = case, inputs, options, clock, copy_gbps

    def grad_outputs(self, outputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        # a fresh set per implementation: Liger's RMSNorm writes its input gradient into this buffer
        generator = torch.Generator(device=outputs[0].device).manual_seed(self.options.seed + 1)
        return tuple(
            torch.randn(o.shape, generator=generator, device=o.device, dtype=torch.float32).to(o.dtype)
            if o.numel() > 1 else torch.ones_like(o)
            for o in outputs
        )

    def run_once(self, impl: _Impl) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        """Outputs and input gradients (in the reference's layout) of one forward + backward."""
        outputs = _tensors(impl.fn(*impl.args))
        grads = torch.autograd.grad(outputs, _grad_inputs(impl.args), self.grad_outputs(outputs))
        if impl.to_reference_grads is not None:
            grads = impl.to_reference_grads(grads)
        return tuple(o.detach() for o in outputs), tuple(grads)

    def rows(self, impl: _Impl, expected) -> list[MicroRow]:
        op, shape = self.case.label, self.inputs.shape
        if impl.error is not None:
            return [MicroRow(op, phase, impl.name, shape, status="unavailable", error=impl.error) for phase in PHASES]
        try:
            outputs, grads = self.run_once(impl)
            error = max((_rel_error(a, b) for a, b in zip(outputs + grads, expected[0] + expected[1])), default=0.0)
            if len(outputs + grads) != len(expected[0] + expected[1]):
                error = math.inf
            del outputs, grads
            rows = [self._timed(impl, phase, error) for phase in PHASES]
        except Exception as e:  # noqa: BLE001 - one failing implementation is a row, the run goes on
            return [MicroRow(op, phase, impl.name, shape, status="failed", error=f"{type(e).__name__}: {e}",
                             traceback=traceback.format_exc()) for phase in PHASES]
        return rows

    def _timed(self, impl: _Impl, phase: str, error: float) -> MicroRow:
        inputs, opts = self.inputs, self.options
        if phase == "fwd":
            def call() -> None:
                impl.fn(*impl.args)

            with torch.no_grad():
                ms, extra = time_calls(call, self.clock, warmup=opts.warmup, reps=opts.reps)
                kernels = kernel_ms(call, self.clock, reps=min(opts.reps, KERNEL_REPS))
                host, host_bwd = host_us(call, self.clock, calls=self._host_calls()), None
            moved, flops = inputs.bytes_fwd, inputs.flops_fwd
        else:
            wrt = _grad_inputs(impl.args)
            grad_outputs = self.grad_outputs(_tensors(impl.fn(*impl.args)))

            def call() -> None:
                torch.autograd.grad(_tensors(impl.fn(*impl.args)), wrt, grad_outputs)

            ms, extra = time_calls(call, self.clock, warmup=opts.warmup, reps=opts.reps)
            kernels = kernel_ms(call, self.clock, reps=min(opts.reps, KERNEL_REPS))
            host, host_bwd = self._host_fwd_bwd(impl, grad_outputs)
            moved = None if inputs.bytes_fwd is None else inputs.bytes_fwd + inputs.bytes_bwd
            flops = None if inputs.flops_fwd is None else inputs.flops_fwd + inputs.flops_bwd
        gbps = None if moved is None else moved / (ms * 1e-3) / 1e9
        # relative L2 error (|a - b| / |b| over a whole output or gradient) against the reference,
        # within the dtype's rtol: fused kernels round fewer intermediates, a few roundings apart
        allowed = tolerance(opts.dtype).rtol
        return MicroRow(
            self.case.label, phase, impl.name, inputs.shape,
            status="ok" if error <= allowed else "wrong",
            ms=ms, bytes_moved=moved, gbps=gbps,
            copy_fraction=None if gbps is None else gbps / self.copy_gbps,
            flops=flops, tflops=None if flops is None else flops / (ms * 1e-3) / 1e12,
            extra_gib=None if extra is None else extra / GIB,
            max_rel_error=error,
            host_us=host,
            host_bwd_us=host_bwd,
            kernel_ms=kernels,
        )

    def _host_calls(self) -> int:
        return 2 if self.options.tiny else HOST_CALLS

    def _host_fwd_bwd(self, impl: _Impl, grad_outputs: tuple) -> tuple[float, float]:
        """(host us of a forward recording autograd + its backward, the backward's share).

        The backward share is one ``torch.autograd.grad`` over HOST_BWD_CALLS independent
        forwards (each on its own detached leaves, so no gradient accumulation joins them),
        divided by their number: per node, what a model's backward pays, without the engine's
        fixed cost per ``grad`` call (tens of us with a GPU, a thread hand-off) counted each time.
        """
        fwd = host_us(lambda: impl.fn(*impl.args), self.clock, calls=self._host_calls())
        n = 2 if self.options.tiny else HOST_BWD_CALLS
        bwd = float("inf")
        for _ in range(3):  # best of 3: the first round may grow the allocator's pool (cudaMalloc)
            outputs, inputs = [], []
            for _ in range(n):
                args = tuple(a.detach().requires_grad_() if isinstance(a, torch.Tensor) and a.requires_grad else a
                             for a in impl.args)
                outputs += _tensors(impl.fn(*args))
                inputs += _grad_inputs(args)
            bwd = min(bwd, host_us(lambda: torch.autograd.grad(outputs, inputs, grad_outputs * n), self.clock,
                                   calls=1, repeats=1) / n)
            del outputs, inputs
        return fwd + bwd, bwd


def _measure_copy(options: MicroBenchOptions, clock: DeviceClock) -> MicroRow:
    n_bytes = (8 << 20) if options.tiny else (1 << 30)
    ms = copy_ms(clock, n_bytes, warmup=options.warmup, reps=max(options.reps, 10))
    moved = 2 * n_bytes  # read + write
    return MicroRow("copy", "-", "torch", f"{n_bytes >> 20} MiB float32 Tensor.copy_", ms=ms, bytes_moved=moved,
                    gbps=moved / (ms * 1e-3) / 1e9, copy_fraction=1.0)


def _implementations(case: MicroCase, inputs: CaseInputs, options: MicroBenchOptions,
                     liger, liger_error: str | None) -> tuple[_Impl, list[_Impl]]:
    """(the reference, the implementations asked for, in order); an unavailable one carries why."""
    import twinkle_triton  # installed with twinkle_fx; every op has its <op>_reference

    reference_fn = inputs.baseline or getattr(twinkle_triton, f"{case.op}_reference")
    reference = _Impl("eager", reference_fn, inputs.args)
    impls: list[_Impl] = []
    for name in options.impls:
        if name in ("eager", "inductor"):
            fn = reference_fn if name == "eager" else torch.compile(reference_fn, dynamic=False)
            impls.append(_Impl(name, fn, inputs.args))
        elif name == "twinkle":
            impls.append(_Impl(name, getattr(twinkle_triton, case.op), inputs.args))
        elif name == "liger" and case.liger is not None:  # no row where Liger has no such op
            if liger is None:
                impls.append(_Impl(name, None, (), error=liger_error))
                continue
            fn = getattr(liger, case.liger, None)
            impls.append(_Impl(name, fn, inputs.liger_args or inputs.args, inputs.liger_grads,
                               error=None if fn else f"liger-kernel has no {case.liger}"))
        elif name == "cce" and case.op == "fused_linear_cross_entropy":  # the only op Cut Cross-Entropy has
            if options.device.type != "cuda":
                # cut-cross-entropy 25.1 installs on a CPU machine, but its Triton kernels raise under the
                # interpreter (an InterpreterError in its forward); its torch.compile path is not its kernels
                impls.append(_Impl(name, None, (), error="Cut Cross-Entropy's Triton kernels need a CUDA device"))
                continue
            cce, cce_error = _import("cut_cross_entropy",
                                     not_installed="cut-cross-entropy not installed (pip install cut-cross-entropy)")
            # linear_cross_entropy(e, c, targets): ignore_index -100 and mean reduction by default, as ours
            fn = getattr(cce, "linear_cross_entropy", None)
            impls.append(_Impl(name, fn, inputs.args, error=cce_error if cce is None or fn else
                               "cut_cross_entropy has no linear_cross_entropy"))
    return reference, impls


def run_micro_bench(options: MicroBenchOptions, progress: Callable[[str], None] = print) -> BenchResult:
    """Time every twinkle_triton op (or ``options.ops``) under each implementation in ``options.impls``.

    Examples:
        >>> options = MicroBenchOptions(impls=["eager", "twinkle"], dtype=torch.float32, reps=2, warmup=1,
        ...                             device=torch.device("cpu"), tiny=True)
        >>> # not run by the doctest test: benchmarks take tens of seconds even tiny (tests/bench runs them)
        >>> result = run_micro_bench(options)                                   # doctest: +SKIP
    """
    clock = DeviceClock(options.device)
    cases = [c for c in MICRO_CASES if not options.ops or c.op in options.ops or c.label in options.ops]
    liger, liger_error = (_import("liger_kernel.transformers.functional",
                                                  not_installed="liger-kernel not installed (pip install liger-kernel)")
                          if "liger" in options.impls else (None, None))

    copy = _measure_copy(options, clock)
    progress(f"[copy] {copy.shape}: {copy.gbps:,.0f} GB/s (the roofline below)")
    rows: list[MicroRow] = [copy]
    for index, case in enumerate(cases, 1):
        torch.manual_seed(options.seed)
        inputs = case.make(options.tiny, options.device, options.dtype)
        progress(f"[{index}/{len(cases)}] {case.label}: {inputs.shape}")
        reference, impls = _implementations(case, inputs, options, liger, liger_error)
        runner = _Case(case, inputs, options, clock, copy.gbps)
        expected, failure = None, None
        try:
            expected = runner.run_once(reference)
        except Exception as e:  # noqa: BLE001 - without a reference no implementation can be checked
            failure = f"{getattr(reference.fn, '__name__', case.op)} raised {type(e).__name__}: {e}"
        for impl in impls:
            if expected is None and impl.error is None:
                new_rows = [MicroRow(case.label, phase, impl.name, inputs.shape, status="failed", error=failure)
                            for phase in PHASES]
            else:
                new_rows = runner.rows(impl, expected)
            for row in new_rows:
                progress(f"    {row}")
            rows += new_rows
        del inputs, runner, expected, impls, reference
        free_device_memory(options.device)
    annotate_micro_rows(rows)
    return BenchResult(
        kind="micro",
        environment=describe_environment(options.device),
        workload={"dtype": str(options.dtype).removeprefix("torch."), "reps": options.reps,
                  "warmup": options.warmup, "tiny": options.tiny, "seed": options.seed,
                  "copy_gbps": copy.gbps, "impls": list(options.impls)},
        rows=rows,
    )
