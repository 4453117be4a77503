"""Graph-diff helpers for expect tests of kernels swapped by the ``twinkle`` backend.

Record what the backend saw and produced, normalised the way PyTorch's own Dynamo tests do
(``normalize_gm``: no comments, no trailing spaces), and pin it with
``expecttest.TestCase.assertExpectedInline``; ``EXPECTTEST_ACCEPT=1`` fills in the expectations.

Examples:
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
from collections.abc import Iterator

from .compiler.graph.recording import RECORDERS, RecordedGraphs, normalize_gm, root_as_self

__all__ = ["record_graphs", "normalize_gm", "root_as_self", "graph_diff", "RecordedGraphs"]


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
