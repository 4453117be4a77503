"""The ``twinkle-fx`` command line: ``check`` (the checklist in :mod:`twinkle_fx.checklist`), ``bench``
(the harness in :mod:`twinkle_fx.bench`) and ``explain``.

Importing this package (and parsing a command line) imports neither torch nor transformers nor
triton: every argument is checked first, and a command imports what it runs only then.
"""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
