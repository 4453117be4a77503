"""The backend's graph passes, one file each, named after what it matches (each ``run(state) ->
list[Outcome]``, see :mod:`..pipeline`; the order is :data:`twinkle_fx.compiler.backend.PASSES`).

Rewrites, which change the graph:

- :mod:`.layer_regions`: regions of registered nn.Module classes become one kernel call each;
- :mod:`.function_patterns`: calls of registered functions (and copies of them) become one kernel call each;
- :mod:`.attention`: SDPA with a constant causal mask becomes ``is_causal=True``, SDPA on repeated K/V
  with a short query one grouped-query attention kernel call;
- :mod:`.decode_gemv`: linears on a few rows (decode) become GEMV kernel calls;
- :mod:`.residual_norms`: a residual add read by a swapped RMSNorm joins the norm's kernel;
- :mod:`.decode_cache`: rotary and a static KV cache's writes become one kernel call;
- :mod:`.gemm_fusion`: linears reading the same input become one GEMM (when options ask for it).

Analyses, which only report (all their outcomes :class:`~twinkle_fx.compiler.pipeline.Kept`):

- :mod:`.graph_breaks`: a graph break inside a registered layer or function;
- :mod:`.function_calls`: calls of registered functions no rewrite swapped;
- :mod:`.compiled_root`: a kernel bound to the compiled module itself (no graph region);
- :mod:`.foreign_forwards`: layers whose forward another tool replaced.

A rewrite finds its regions and hands them to :mod:`twinkle_fx.compiler.regions`, which binds each
to its kernel and splices the call in.
"""
