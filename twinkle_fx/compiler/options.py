"""``torch.compile(..., backend="twinkle", options={...})``: the backend's options, validated once.

:func:`parse_options` checks every key and value and answers one frozen :class:`BackendOptions`;
the backend hands that object to every pass (``state.options``), so no pass reads an option from
anywhere else.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ..core.modes import Mode, parse_mode
from ..core.torch_internals import inductor_config_values

__all__ = ["BackendOptions", "parse_options", "COMPILERS", "SWAP_POLICIES", "FUSE_PROJECTIONS", "GQA_ATTENTION"]

COMPILERS = ("inductor", "aot_eager", "eager")
SWAP_POLICIES = ("measured", "always")
FUSE_PROJECTIONS = (True, False, "auto")
GQA_ATTENTION = (True, False, "auto")
DECODE_GEMV = (True, False, "auto")
DECODE_CACHE = (True, False, "auto")


@dataclass(frozen=True)
class BackendOptions:
    """Options of the ``twinkle`` backend.

    ``fuse_projections``, ``gqa_attention``, ``decode_gemv``, ``decode_cache``, ``causal_mask``,
    ``residual_norm``, ``embedding_grad``, ``scaled_gradient``, ``matmul_sums`` and ``topk`` choose among the graph
    rewrites the registry in effect has: one removed from it (``get_registry().remove_graph_rewrite("gqa_attention")``,
    names in :data:`~twinkle_fx.core.registry.GRAPH_REWRITES`) is not made whatever they say.

    Args:
        compiler (`str`, defaults to `"inductor"`): the inner compiler the rewritten graph goes to:
            "inductor", "aot_eager" or "eager".
        mode (*optional*): "train", "inference", "train+compile", ... (the compile flag is implied).
            Default: training when grad is enabled and a graph input (a parameter) requires grad,
            else inference.
        verify (`bool`, defaults to `False`): run the graph before and after the rewrite on the
            example inputs at compile time, and a graph with dynamic shapes also at an odd size of
            each dynamic dimension (or a WARNING says only the example shapes were checked); on a
            mismatch keep the original graph and report it. See :mod:`.inner.verify`.
        report (`bool`, defaults to `False`): log each graph's report on the logger
            ``twinkle_fx.compiler.backend``: what was swapped or kept, and why, at INFO; the diff of the
            graph's FX code at DEBUG. Where logging would not show INFO, one WARNING says how to see it.
        inductor (`dict`, *optional*): ``torch._inductor.config`` patches for the inner Inductor
            ("max_autotune", "freezing", ...); see :mod:`.inner.inductor_options`.
        cudagraphs (`bool`, defaults to `False`): CUDA graphs, as torch.compile's
            ``mode="reduce-overhead"`` (which cannot be given together with ``options=``).
        fuse_projections (`bool` or `"auto"`, defaults to `"auto"`): one GEMM for the linears that
            read the same input (q/k/v, gate/up); "auto" where measured to pay, see :mod:`.passes.gemm_fusion`.
        gqa_attention (`bool` or `"auto"`, defaults to `"auto"`): SDPA on key/value repeated to the
            query's heads (transformers' ``repeat_kv``) becomes one grouped-query attention kernel
            that reads each KV head once; "auto" for queries of at most 16 tokens (decode steps),
            see :mod:`.passes.attention`.
        decode_gemv (`bool` or `"auto"`, defaults to `"auto"`): linears on a few rows become Triton GEMV
            kernels, q/k/v in one launch, gate/up with the SwiGLU product, o/down with the residual add;
            "auto" in inference on CUDA at one row (decode at batch 1), see :mod:`.passes.decode_gemv`.
        decode_cache (`bool` or `"auto"`, defaults to `"auto"`): at a step with a static KV cache, the
            rotary kernel and the two cache writes (``index_copy_``) become one kernel; "auto" in inference on
            CUDA for queries of at most 16 tokens, ``True`` in any inference graph, see :mod:`.passes.decode_cache`.
        causal_mask (`bool`, defaults to `True`): SDPA given a causal mask that depends on no input
            (transformers materialises one under torch.compile) runs with ``is_causal=True`` instead,
            i.e. flash attention over the lower half, see :mod:`.passes.attention`.
        residual_norm (`bool`, defaults to `True`): a residual add read by a swapped RMSNorm layer joins the
            norm's kernel (``twinkle_triton.add_rms_norm``), forward and backward, see :mod:`.passes.residual_norms`.
        embedding_grad (`bool`, defaults to `True`): in backward graphs, an embedding's weight gradient is
            summed per looked-up row (``twinkle_triton.embedding_grad_sums``) and gathered into the kernel that
            writes the tied LM head's gradient, or added in place to the fused loss's saved head gradient
            (``twinkle_triton.add_embedding_grad``), instead of a dense fp32 table, see :mod:`.inner.embedding_grad`.
        matmul_sums (`bool`, defaults to `True`): a sum of matrix products that only opaque ops read (a layer
            input's gradient from q, k and v, or gate and up, before a swapped norm's backward) runs as GEMMs that
            accumulate into one another, with no add kernel, see :mod:`.inner.matmul_sums`.
        scaled_gradient (`bool`, defaults to `True`): a gradient a backward graph returns as a saved tensor it owns
            times the loss's gradient (the fused loss's untied LM-head gradient) is scaled in place
            (``twinkle_triton.scale_in_place``: nothing touched when that gradient is 1), see
            :mod:`.inner.scaled_gradient`.
        topk (`bool`, defaults to `False`): a top-k of the largest values along a short last dimension (a
            mixture-of-experts router's) runs as one kernel (``twinkle_triton.topk``) instead of torch's selection
            and sort, see :mod:`.inner.topk`. Off unless asked: among equal values the kernel takes the lower
            indices, where torch's kernels take others (their choice is unspecified), so a router whose scores tie
            (weights initialized to zero) routes to other experts than the uncompiled model.
        swap_policy (`str`, defaults to `"always"`): "always" swaps every region; "measured" keeps
            Inductor's code where a kernel was measured slower than Inductor's at that shape (a per-op
            table from one H100, :mod:`.swap_policy`; not yet shown to win end to end, so opt-in).
        dump_graphs (`str`, *optional*): a directory; the graph before and after each pass is written
            there (as ``TWINKLE_FX_DUMP_GRAPHS=<dir>`` does), see :mod:`.pipeline`.
    """

    compiler: str = "inductor"
    mode: Mode | None = None
    verify: bool = False
    report: bool = False
    # the speed options: Inductor passthrough, CUDA graphs, GEMM fusion, swap policy
    inductor: dict = field(default_factory=dict)
    cudagraphs: bool = False
    fuse_projections: bool | str = "auto"
    gqa_attention: bool | str = "auto"
    decode_gemv: bool | str = "auto"
    decode_cache: bool | str = "auto"
    causal_mask: bool = True
    residual_norm: bool = True
    embedding_grad: bool = True
    matmul_sums: bool = True
    scaled_gradient: bool = True
    topk: bool = False
    swap_policy: str = "always"
    dump_graphs: str | None = None

    @property
    def applied_swap_policy(self) -> str:
        """The swap policy the passes apply: the measured per-op decisions (:mod:`.swap_policy`)
        compare a kernel with Inductor's generated code, so they hold only when Inductor is the inner
        compiler; under any other every region is swapped."""
        return self.swap_policy if self.compiler == "inductor" else "always"


def parse_options(options: Mapping[str, Any] | None) -> BackendOptions:
    """Validate ``options`` into one :class:`BackendOptions`.

    Raises:
        ValueError: an unknown key or a bad value (the message names the option and the valid values).

    Examples:
        >>> parse_options({"cudagraphs": True, "gqa_attention": False}).gqa_attention
        False
    """
    if options is None:
        return BackendOptions()
    if not isinstance(options, Mapping):
        raise ValueError(f"twinkle backend options must be a dict, got {type(options).__name__}.")
    valid = [f.name for f in fields(BackendOptions)]
    for key in options:
        if key not in valid:
            raise ValueError(f"Unknown twinkle backend option {key!r}; valid options: {', '.join(valid)}.")
    compiler = options.get("compiler", "inductor")
    if compiler not in COMPILERS:
        raise ValueError(f"twinkle backend option compiler={compiler!r}; valid compilers: {', '.join(COMPILERS)}.")
    mode = options.get("mode")
    if mode is not None:
        mode = parse_mode(mode) | Mode.TORCH_COMPILE
    for key in ("verify", "report", "cudagraphs", "causal_mask", "residual_norm", "embedding_grad", "matmul_sums",
                "scaled_gradient", "topk"):
        default = getattr(BackendOptions, key)
        if not isinstance(options.get(key, default), bool):
            raise ValueError(f"twinkle backend option {key} must be True or False, got {options[key]!r}.")
    for key, allowed in (("fuse_projections", FUSE_PROJECTIONS), ("gqa_attention", GQA_ATTENTION),
                         ("decode_gemv", DECODE_GEMV), ("decode_cache", DECODE_CACHE)):
        value = options.get(key, "auto")
        if not any(value is v if isinstance(v, bool) else value == v for v in allowed):
            raise ValueError(f"twinkle backend option {key} must be True, False or 'auto', got {value!r}.")
    policy = options.get("swap_policy", "always")
    if policy not in SWAP_POLICIES:
        raise ValueError(f"twinkle backend option swap_policy={policy!r}; valid: {', '.join(SWAP_POLICIES)}.")
    dump_graphs = options.get("dump_graphs")
    if dump_graphs is not None and not isinstance(dump_graphs, (str, os.PathLike)):
        raise ValueError(f"twinkle backend option dump_graphs must be a directory path, got {dump_graphs!r}.")
    return BackendOptions(
        compiler=compiler, mode=mode, verify=options.get("verify", False), report=options.get("report", False),
        inductor=_inductor_patches(options.get("inductor")), cudagraphs=options.get("cudagraphs", False),
        fuse_projections=options.get("fuse_projections", "auto"), gqa_attention=options.get("gqa_attention", "auto"),
        decode_gemv=options.get("decode_gemv", "auto"), decode_cache=options.get("decode_cache", "auto"),
        causal_mask=options.get("causal_mask", True), residual_norm=options.get("residual_norm", True),
        embedding_grad=options.get("embedding_grad", True), matmul_sums=options.get("matmul_sums", True),
        scaled_gradient=options.get("scaled_gradient", True), topk=options.get("topk", False), swap_policy=policy,
        dump_graphs=None if dump_graphs is None else os.fspath(dump_graphs),
    )


def _inductor_patches(value: Any) -> dict[str, Any]:
    """``options["inductor"]`` checked: a dict of ``torch._inductor.config`` keys (dotted for nested
    ones, e.g. ``"triton.cudagraphs"``); returns a copy. A key the installed Inductor does not have
    raises ValueError naming it, so a typo is an error, not a silent no-op."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"twinkle backend option inductor must be a dict of torch._inductor.config keys, "
                         f"got {type(value).__name__}.")
    known = inductor_config_values()
    for key in value:
        if not isinstance(key, str) or key not in known:
            raise ValueError(
                f"twinkle backend option inductor={{{key!r}: ...}}: torch._inductor.config has no {key!r} "
                f"(see torch._inductor.list_options() for the valid keys)."
            )
    for key in _WORKER_DECIDED:
        if key in value and value[key] != known[key]:
            raise ValueError(
                f"twinkle backend option inductor={{{key!r}: {value[key]!r}}} cannot take effect: Inductor decides it\n"
                f"where it compiles each kernel, in its compile workers, which read it only from the environment "
                f"when they start (a config patch reaches the calling process only). Set "
                f"{_WORKER_DECIDED[key]}={int(bool(value[key]))} before the first torch.compile of the process instead."
            )
    return dict(value)


# torch._inductor.config keys read in Inductor's compile workers (torch 2.11-2.13: a worker patches in
# only use_static_triton_launcher from the caller's config, runtime/compile_tasks.py), with the
# environment variable that reaches them. static_launch_user_defined_triton_kernels: launch our
# triton_op kernels through Inductor's static CUDA launcher instead of Triton's Python launcher; the
# host cost per launch with and without: tools/launch_host_cost.py.
_WORKER_DECIDED = {
    "static_launch_user_defined_triton_kernels": "TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS",
}
