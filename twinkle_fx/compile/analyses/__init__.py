"""The passes that only report (each ``run(state) -> list[Outcome]``, all outcomes :class:`Kept`):

- :mod:`.graph_breaks`: a graph break inside a registered layer or function;
- :mod:`.function_calls`: calls of registered functions no rewrite swapped;
- :mod:`.compiled_root`: a kernel bound to the compiled module itself (no graph region);
- :mod:`.foreign_forwards`: layers whose forward another tool replaced.
"""
