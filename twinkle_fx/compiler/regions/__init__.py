"""Regions: the part of a graph one kernel call replaces, from finding it to splicing the call in.

- :mod:`.region`: a :class:`~.region.Region` (its nodes, the call's arguments, the outputs the rest
  of the graph reads), the region as a graph module of its own, :func:`~.region.bind` (which region
  inputs are the kernel's arguments, in which order, checked by tracing the region and the original
  code to ATen on the same fake inputs), and the graph's call of a selected kernel (a layer's or a
  function's); :class:`~.region.KeepRegion` keeps a region with its reason;
- :mod:`.pattern_tracing`: a registered function's computation traced to a pattern the function
  pass can match anywhere;
- :mod:`.splice`: the swap policy and the shape guard, then the call in place of the region
  (traceable, or an opaque custom op around a kernel torch.compile cannot trace).
"""
