"""What the backend changes about the inner compiler it hands the rewritten graph to: Inductor's config
patches and CUDA-graph status (:mod:`.inductor_options`), the memo of Triton's front end (:mod:`.ttir_memo`),
the compile-time check that the rewrite kept the graph's results (:mod:`.verify`), and the rewrites of the
graphs AOTAutograd traces (:mod:`.post_grad`: :mod:`.embedding_grad`, :mod:`.scaled_gradient`,
:mod:`.matmul_sums`, :mod:`.topk`)."""
