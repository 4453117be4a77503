"""The passes that rewrite the graph (each ``run(state) -> list[Outcome]``, see :mod:`..pipeline`):

- :mod:`.layer_regions`: regions of registered nn.Module classes become one kernel call each;
- :mod:`.function_patterns`: calls of registered functions (and copies of them) become one kernel call each;
- :mod:`.attention`: SDPA with a constant causal mask becomes ``is_causal=True``, SDPA on repeated K/V
  with a short query one grouped-query attention kernel call;
- :mod:`.gemm_fusion`: linears reading the same input become one GEMM (when options ask for it).
"""
