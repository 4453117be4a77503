"""What the eager path and the compile backend share: registration -> selection.

- :mod:`.registry` holds the registrations (scoped per context), written by :mod:`.registration` and
  :mod:`.config` from the user's keywords; :mod:`.sources` says where a kernel comes from;
- :mod:`.selection` answers, for both paths alike, which kernel serves a layer class or a function on
  a device (:mod:`.devices`) in a mode (:mod:`.modes`), or why none does; :mod:`.admission` whether
  one module gets its class's kernel, or the :mod:`.reasons` it keeps its forward;
- :mod:`.swaps` knows what is swapped right now (the forwards installed, the functions patched), for
  both paths to ask;
- :mod:`.plugins` is where the Hugging Face integrations (``twinkle_fx.integrations``) plug in;
- the small shared pieces: :mod:`.errors`, :mod:`.caches`, :mod:`.settings`, :mod:`.numerics` and
  :mod:`.tolerances`; and for the tools (the benchmarks, the command line), :mod:`.outputs`: their
  ``--out`` paths checked before a run.

Imports go one way: core imports the kernels at most, never the eager or compile paths, the
integrations or the tools (``tests/test_layering.py`` holds the rule). Importing this package imports
nothing else, so the command line stays fast to start.
"""
