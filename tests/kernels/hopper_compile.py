"""Compile every twinkle_triton kernel for an H100 (sm_90) on a machine without a GPU; run as a script.

``python tests/kernels/hopper_compile.py OUT.json`` in a process without ``TRITON_INTERPRET``: each op of
:data:`CASES` runs forward and backward on CPU tensors at GPU widths, through its real Python code (launch
options and block sizes as on a GPU). Triton's own launch path binds and specializes every kernel call (the
ints equal to 1, the 16-divisible values and pointers), then compiles it for sm_90 and launches nothing:
``triton.runtime.driver`` is a stand-in that names the target. OUT gets each compile (kernel, shared memory,
warps, stages, whether its dot products became wgmma and its loads asynchronous copies, registers and spilled
bytes, the fp64 arithmetic of the kernel compiled with its float arguments typed as Inductor types them, the
arguments torch's analysis of the launch counts as written) and each failure.

What the Triton interpreter cannot show: a kernel that does not compile for the GPU (a type the interpreter
tolerates, a layout the compiler rejects) or a launch configuration past the GPU's shared memory. The outputs
are never computed, so nothing here checks numbers (the interpreter tests do).
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback
from pathlib import Path

import torch

TARGET = ("cuda", 90, 32)  # H100 / H200: compute capability 9.0, 32-thread warps
HERE = Path(__file__).resolve().parent


class _HopperDriver:
    """The part of a Triton driver ``JITFunction.run(warmup=True)`` reads: device, stream, target."""

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget(*TARGET)


def resource_usage(cubin: bytes) -> dict[str, int] | None:
    """Registers a thread and spill (local) and stack bytes of a compiled kernel, from the cuobjdump that ships
    with Triton's NVIDIA backend (None without it)."""
    import subprocess
    import tempfile

    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        dump = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", dump)
    return None if found is None else dict(zip(("registers", "stack", "local"), map(int, found.groups())))


def fp64_arithmetic(kernel, fn) -> list[str]:
    """The kernel compiled again with its float arguments typed fp64, as Inductor types a Python float when it
    launches the kernel from a compiled graph: the TTIR lines that compute in fp64 (every line naming f64 but
    the signature and the conversion of a float argument to fp32)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    src = kernel.src
    floats = [name for name, kind in src.signature.items() if kind == "fp32"]
    if not floats:
        return []
    typed = ASTSource(fn, {name: "fp64" if name in floats else kind for name, kind in src.signature.items()},
                      attrs=src.attrs)
    typed.constants = dict(src.constants)
    def frozen(value):  # the metadata's lists back to the options' tuples
        return tuple(frozen(v) for v in value) if isinstance(value, list) else value

    options = {key: frozen(value) for key, value in kernel.metadata._asdict().items()}
    ttir = triton.compile(typed, target=GPUTarget(*TARGET), options=options).asm["ttir"]
    conversion = re.compile(rf"arith\.truncf %({'|'.join(floats)}) : f64 to f32")
    return [line.strip() for line in ttir.splitlines()
            if "f64" in line and "tt.func" not in line and not conversion.search(line)]


def written_arguments(kernel, args: tuple, kwargs: dict) -> list[str]:
    """The arguments of a launch that torch counts as written when the launch is recorded in a compiled graph
    (``triton_kernel_wrap.identify_mutated_tensors``, torch 2.11; ``identify_accessed_tensors``' writes, 2.13).
    AOTAutograd copies each of them before the launch and takes the copy as the tensor's new value, so a table
    the kernel only reads but is counted here is copied for nothing, and a saved forward output counted in a
    backward launch makes the forward's output the backward's value."""
    from torch._higher_order_ops import triton_kernel_wrap

    bound = dict(zip(kernel.arg_names, args))
    bound.update({name: value for name, value in kwargs.items() if name in kernel.arg_names})
    if hasattr(triton_kernel_wrap, "identify_accessed_tensors"):
        writes = triton_kernel_wrap.identify_accessed_tensors(kernel, bound, {}).read_writes.writes
        return sorted(dep.name for dep in writes)
    return sorted(triton_kernel_wrap.identify_mutated_tensors(kernel, bound, {}))


def _grads(out, inputs):
    outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(o, torch.Tensor)]
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    differentiable = [o for o in outs if o.requires_grad]
    if leaves and differentiable:
        torch.autograd.grad(differentiable, leaves, [torch.ones_like(o) for o in differentiable], allow_unused=True)


def _rand(*shape, dtype=torch.bfloat16, grad=True):
    return torch.randn(*shape, dtype=torch.float32).to(dtype).requires_grad_(grad)


def _call(fn, *args, **kwargs):
    _grads(fn(*args, **kwargs), args)


def _cases():
    import twinkle_triton as tt

    bf16 = torch.bfloat16
    rows, hidden, inter = 16, 4096, 14336

    def rotary(fn, dim=128, rotated=128):
        q = _rand(2, 16, 32, dim).transpose(1, 2)  # transformers' layout: [b, s, h, d] viewed as [b, h, s, d]
        k = _rand(2, 16, 8, dim).transpose(1, 2)
        cos, sin = _rand(2, 16, rotated, grad=False), _rand(2, 16, rotated, grad=False)
        _call(fn, q, k, cos, sin)

    def moe(dtype=bf16, weight_grad=None):  # fp32 too: the tiles were tuned for 2-byte operands, 4-byte ones need
        # twice the bytes; and the Triton weight-gradient kernel, which bf16 runs where torch._grouped_mm does not
        from twinkle_triton import moe_gemm

        experts, top_k, h, i, tokens = 8, 2, 1024, 768, 64
        weights, index = torch.randn(tokens, experts).softmax(-1).topk(top_k, dim=-1)
        default, moe_gemm.WEIGHT_GRAD = moe_gemm.WEIGHT_GRAD, weight_grad or moe_gemm.WEIGHT_GRAD
        try:
            _call(tt.moe_swiglu_experts, _rand(tokens, h, dtype=dtype), _rand(experts, 2 * i, h, dtype=dtype),
                  _rand(experts, h, i, dtype=dtype), index, weights.to(dtype).requires_grad_())
        finally:
            moe_gemm.WEIGHT_GRAD = default

    def moe_gluon():  # the padded weight gradients' Gluon kernel, which a Hopper GPU's tensors choose
        from twinkle_triton import moe_gemm

        takes, moe_gemm._gluon_takes = moe_gemm._gluon_takes, lambda a: True
        try:
            moe()
        finally:
            moe_gemm._gluon_takes = takes

    def flce(**options):
        x, weight = _rand(64, 896), _rand(4096, 896)
        target = torch.randint(0, 4096, (64,))
        _grads(tt.fused_linear_cross_entropy(x, weight, target, **options), (x, weight))

    def flce_cublas_chunks():
        import twinkle_triton.fused_linear_cross_entropy_vocab_chunked as vocab_chunked

        kept, vocab_chunked.VOCAB_CHUNKED_FORWARD = vocab_chunked.VOCAB_CHUNKED_FORWARD, "cublas"
        try:
            flce(z_loss=1e-4)
        finally:
            vocab_chunked.VOCAB_CHUNKED_FORWARD = kept

    def attention(q_len, kv_len):
        q = _rand(2, 16, q_len, 128)
        k, v = _rand(2, 4, kv_len, 128), _rand(2, 4, kv_len, 128)
        mask = torch.ones(q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len)[None, None].expand(2, 1, -1, -1)
        _call(tt.gqa_attention, q, k, v, mask)

    def decode_inputs(length=1):
        q, k, v = (_rand(2, length, h * 128, grad=False).view(2, length, h, 128).transpose(1, 2) for h in (16, 4, 4))
        cos, sin = _rand(1, length, 128, grad=False), _rand(1, length, 128, grad=False)
        caches = [_rand(2, 4, 512, 128, grad=False) for _ in range(2)]
        return q, k, v, cos, sin, *caches

    def rotary_cache():
        tt.apply_rotary_pos_emb_to_cache(*decode_inputs(), torch.tensor([37]))

    def rotary_cache_attention():
        tt.rotary_cache_attention(*decode_inputs(), cache_position=torch.tensor([37]))

    def gemvs():
        x = _rand(1, 2048, grad=False)
        tt.gemv(x, [_rand(2048, 2048, grad=False), _rand(512, 2048, grad=False), _rand(512, 2048, grad=False)])
        tt.gemv(x, [_rand(2048, 2048, grad=False)], residual=_rand(1, 2048, grad=False))
        tt.gemv_swiglu(x, _rand(8192, 2048, grad=False), _rand(8192, 2048, grad=False),
                       norm_weight=_rand(2048, grad=False))

    return {
        "silu_and_mul": lambda: _call(tt.silu_and_mul, _rand(rows, 2 * inter)),
        "silu_mul": lambda: _call(tt.silu_mul, _rand(rows, inter), _rand(rows, inter)),
        "silu_mul_linear": lambda: _call(tt.silu_mul_linear, _rand(rows, inter), _rand(rows, inter),
                                         _rand(hidden, inter)),
        "silu_and_mul_linear": lambda: _call(tt.silu_and_mul_linear, _rand(rows, 2 * inter), _rand(hidden, inter)),
        "gelu_mul": lambda: _call(tt.gelu_mul, _rand(rows, inter), _rand(rows, inter)),
        "gelu_and_mul": lambda: _call(tt.gelu_and_mul, _rand(rows, 2 * inter)),
        "clamped_swiglu": lambda: _call(tt.clamped_swiglu, _rand(rows, 2 * 2880), 1.702, 7.0),
        "add_gelu": lambda: _call(tt.add_gelu, _rand(rows, inter), _rand(inter)),
        "mul_add": lambda: _call(tt.mul_add, _rand(rows, hidden), _rand(rows, hidden), _rand(rows, hidden)),
        "rms_norm": lambda: _call(tt.rms_norm, _rand(rows, hidden), _rand(hidden), 1e-6),
        "rms_norm per head": lambda: _call(tt.rms_norm, _rand(rows, 8, 128), _rand(128), 1e-6),  # q/k norms' rows
        "add_rms_norm": lambda: _call(tt.add_rms_norm, _rand(rows, hidden), _rand(rows, hidden), _rand(hidden), 1e-6),
        "rms_norm_fp32": lambda: _call(tt.rms_norm_fp32, _rand(rows, hidden), _rand(hidden), 1e-6, 1.0),
        "layer_norm": lambda: _call(tt.layer_norm, _rand(rows, hidden), _rand(hidden), _rand(hidden)),
        "apply_rotary_pos_emb": lambda: rotary(tt.apply_rotary_pos_emb),
        "apply_rotary_pos_emb_partial": lambda: rotary(tt.apply_rotary_pos_emb_partial, rotated=64),
        "apply_rotary_pos_emb_interleaved": lambda: rotary(tt.apply_rotary_pos_emb_interleaved),
        "apply_rotary_pos_emb_interleaved_partial": lambda: rotary(tt.apply_rotary_pos_emb_interleaved_partial,
                                                                   rotated=64),
        "apply_rotary_pos_emb_deinterleave": lambda: rotary(tt.apply_rotary_pos_emb_deinterleave),
        "apply_rotary_pos_emb_half_angle": lambda: rotary(tt.apply_rotary_pos_emb_half_angle, rotated=64),
        "fused_linear_cross_entropy chunked": lambda: flce(),
        # the bias's gradient takes the two-pass row kernel
        "fused_linear_cross_entropy chunked, two passes": lambda: flce(bias=_rand(4096)),
        "fused_linear_cross_entropy vocab_chunked": lambda: flce(z_loss=1e-4),
        "fused_linear_cross_entropy vocab_chunked, cuBLAS chunks": flce_cublas_chunks,
        "fused_linear_cross_entropy tiled": lambda: flce(filter_eps="auto"),
        "gqa_attention training": lambda: attention(64, 64),
        "gqa_attention decode": lambda: attention(1, 300),
        "apply_rotary_pos_emb_to_cache": rotary_cache,
        "rotary_cache_attention": rotary_cache_attention,
        "gemv": gemvs,
        "moe_swiglu_experts": moe,
        "moe_swiglu_experts fp32": lambda: moe(torch.float32),
        "moe_swiglu_experts, Triton weight gradients": lambda: moe(weight_grad="triton"),
        "moe_swiglu_experts, Gluon weight gradients": moe_gluon,
        "embedding_grad_sums": lambda: tt.embedding_grad_sums(
            torch.randint(0, 1000, (64,)), _rand(64, hidden, grad=False), torch.ones(64, dtype=torch.bool), 1000),
        "add_embedding_grad": lambda: tt.add_embedding_grad(
            _rand(1000, hidden, grad=False), torch.tensor(0.5, dtype=bf16),
            *tt.embedding_grad_sums(torch.randint(0, 1000, (64,)), _rand(64, hidden, grad=False), None, 1000)),
        "scale_in_place": lambda: tt.scale_in_place(_rand(1000, hidden, grad=False), torch.tensor(0.5)),
        "topk": lambda: tt.topk(_rand(4096, 128, dtype=torch.float32, grad=False), 8),
    }


def _kernel_modules() -> list:
    import importlib
    import pkgutil

    import twinkle_triton

    return [importlib.import_module(f"twinkle_triton.{info.name}")
            for info in pkgutil.iter_modules(twinkle_triton.__path__)]


def kernels_defined() -> list[str]:
    """Every ``*_kernel`` JIT function of twinkle_triton's modules (what the cases must reach)."""
    from triton.runtime.jit import JITFunction

    return sorted({name for module in _kernel_modules() for name, value in vars(module).items()
                   if isinstance(value, JITFunction) and name.endswith("_kernel")})


def main(out: Path) -> None:
    assert os.environ.get("TRITON_INTERPRET") != "1", "run without TRITON_INTERPRET: the kernels must be JIT functions"
    sys.path.insert(0, str(HERE.parent.parent / "kernels"))
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    from twinkle_triton import _dependent_launch, _library

    driver.set_active(_HopperDriver())
    compiled, failures, current = [], [], [""]
    launch = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        kernel = launch(self, *args, grid=grid, warmup=True, **kwargs)
        ptx = kernel.asm.get("ptx", "")
        compiled.append({"case": current[0], "kernel": self.fn.__name__, "shared": kernel.metadata.shared,
                         "num_warps": kernel.metadata.num_warps, "num_stages": kernel.metadata.num_stages,
                         "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
                         "mma": len(re.findall(r"\bmma\.sync", ptx)),
                         "async_copies": len(re.findall(r"cp\.async", ptx)),
                         "dependent_launch": "griddepcontrol" in ptx,
                         "resources": resource_usage(kernel.asm["cubin"]),
                         "fp64_arithmetic": fp64_arithmetic(kernel, self),
                         "written": written_arguments(self, args, kwargs)})
        return kernel

    JITFunction.run = compile_only
    _library.KERNELS_RUN_ON_CPU = True  # CPU tensors take the kernels' path, not the PyTorch reference
    _library.cached_launcher = lambda kernel: kernel  # through JITFunction.run, not a compiled launcher
    # the decode kernels' programmatic dependent launches, as on an H100 (each kernel module holds its own name)
    _pdl = _dependent_launch.launch_options
    for module in _kernel_modules():
        if getattr(module, "launch_options", None) is _pdl:
            module.launch_options = lambda x: {"PDL": True, "launch_pdl": True}
    # the pipelined loops' stages, sized to an H100's shared memory (227 KiB a program) as on the GPU
    for module in _kernel_modules():
        if hasattr(module, "shared_memory_per_block"):
            module.shared_memory_per_block = lambda device: 232448
    for name, case in _cases().items():
        current[0] = name
        try:
            case()
        except Exception as e:  # noqa: BLE001  every case reports; the test fails on any
            failures.append({"case": name, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
    out.write_text(json.dumps({"target": TARGET, "compiled": compiled, "failures": failures,
                               "defined": kernels_defined()}, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
