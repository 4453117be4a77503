"""Graph-diff helpers for expect tests of kernels swapped by the ``twinkle`` backend.

Record what the backend saw and produced, normalised the way PyTorch's own Dynamo tests do
(``normalize_gm``: no comments, no trailing spaces), and pin it with
``expecttest.TestCase.assertExpectedInline``; ``EXPECTTEST_ACCEPT=1`` fills in the expectations.

Example:
    >>> import expecttest, torch
    >>> from twinkle_fx.testing import record_graphs
    >>> class TestMyKernel(expecttest.TestCase):
    ...     def test_swap(self):
    ...         with record_graphs() as graphs:
    ...             torch.compile(model, backend="twinkle", options={"compiler": "aot_eager"})(x)
    ...         self.assertExpectedInline(graphs.diff(), '''...''')
    ...         self.assertExpectedInline(graphs.forward[0], '''...''')
"""

from __future__ import annotations

import contextlib
import difflib
import re
from collections.abc import Iterator

from .compile.recording import RECORDERS, RecordedGraphs

__all__ = ["record_graphs", "normalize_gm", "root_as_self", "graph_diff", "RecordedGraphs"]


def root_as_self(code: str) -> str:
    """Graph code with the compiled module's inputs named as when Dynamo enters its ``forward``
    directly (``l_self_...``). A forward wrapped by a decorator taking ``*args`` (transformers 5.24
    wraps ``*ForCausalLM.forward`` so) reaches Dynamo as ``args[0]``, and every lifted parameter is
    then named ``l_args_0_...``: the same graph, named after how it was entered.

    Example:
        >>> root_as_self("linear(x, l_args_0_modules_proj_parameters_weight_)")
        'linear(x, l_self_modules_proj_parameters_weight_)'
    """
    return re.sub(r"\b([lL])_args_0_", r"\1_self_", code)


def normalize_gm(code: str) -> str:
    """``print_readable`` output without comments and trailing spaces (PyTorch's ``normalize_gm``),
    the compiled module's inputs named ``l_self_...`` however Dynamo entered it (:func:`root_as_self`).

    Comments carry file paths and line numbers, which differ between machines.
    """
    lines = []
    for line in root_as_self(code).splitlines():
        stripped = re.sub(r"\s*#.*$", "", line) if line.lstrip().startswith("#") or " # " in line else line
        stripped = stripped.rstrip()
        if stripped or (lines and lines[-1]):
            lines.append(stripped)
    return "\n".join(lines).strip("\n") + "\n"


def graph_diff(before: str, after: str, *, context: int = 1) -> str:
    """The unified diff of two (normalised) graph codes: what the rewrite changed (hunk headers
    without line numbers, so expectations survive edits of the model source)."""
    diff = difflib.unified_diff(
        normalize_gm(before).splitlines(), normalize_gm(after).splitlines(), "before", "after", n=context, lineterm=""
    )
    # hunk headers carry line numbers, which move with every edit of the model's source: keep "@@" only
    return "\n".join("@@" if line.startswith("@@") else line for line in diff if not line.startswith(("---", "+++"))) + "\n"


class _Recorded(RecordedGraphs):
    def diff(self, index: int = 0, *, context: int = 1) -> str:
        """The diff of Dynamo graph ``index`` before and after the rewrite."""
        return graph_diff(self.before[index], self.after[index], context=context)


@contextlib.contextmanager
def record_graphs() -> Iterator[_Recorded]:
    """Record, normalised, every graph the ``twinkle`` backend compiles inside the block.

    Yields an object with ``before`` / ``after`` (Dynamo graphs around the rewrite), ``forward`` /
    ``backward`` (AOTAutograd graphs; inner compiler ``aot_eager`` only) and ``diff(i)``.
    Compilation happens at the first call, so call the compiled model inside the block; the
    backward graph is compiled when the first backward runs.
    """
    recorded = _Recorded()
    token = RECORDERS.set(RECORDERS.get() + (recorded,))
    try:
        yield recorded
    finally:
        RECORDERS.reset(token)
