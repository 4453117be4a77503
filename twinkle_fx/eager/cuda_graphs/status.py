"""What the CUDA graphs of a model did: :func:`graph_status` (recorded sequences, replays, and the
calls that ran without graphs, with their reasons), counted in one :class:`GraphStatus` per model by
:mod:`.layer_graphs` and :mod:`.model_graphs`."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from ...core.swaps import swapped_forward

__all__ = ["GraphStatus", "graph_status"]


@dataclass
class GraphStatus:
    """What the CUDA graphs of one model did: see :func:`graph_status`."""

    sequences: int = 0
    steps: int = 0
    replays: Counter = field(default_factory=Counter)  # "forward" / "backward" / "recompute" block calls, "model"
    eager: Counter = field(default_factory=Counter)    # reason -> passes whose blocks ran eagerly from then on
    model_graphs: int = 0  # whole-forward decode graphs recorded (:mod:`twinkle_fx.eager.cuda_graphs.model_graphs`)
    model_eager: Counter = field(default_factory=Counter)  # reason -> decode calls not served by one

    def __str__(self) -> str:
        lines = [f"CUDA graphs: {self.sequences} sequence(s), {self.steps} block call(s) recorded; replays "
                 f"{self.replays['forward']} forward, {self.replays['backward']} backward"
                 + (f", {self.replays['recompute']} backward recomputed" if self.replays['recompute'] else "")]
        lines += [f"  {count} pass(es) eager: {reason}" for reason, count in self.eager.most_common()]
        if self.model_graphs or self.model_eager:
            lines.append(f"  whole forward (decode): {self.model_graphs} graph(s) recorded, "
                         f"{self.replays['model']} replay(s)")
            lines += [f"  {count} decode call(s) not from a whole-forward graph: {reason}"
                      for reason, count in self.model_eager.most_common()]
        return "\n".join(lines)


def graph_status(model: torch.nn.Module) -> GraphStatus | None:
    """What the CUDA graphs of ``model`` (``kernelize_model(model, cuda_graphs=True)``) did so far:
    recorded sequences, replays, and the block calls that ran eagerly with their reasons; None when
    the model has no CUDA graphs.

    Examples:
        >>> kernelize_model(model, mode="train", cuda_graphs=True)      # doctest: +SKIP
        >>> for _ in range(3): model(ids, labels=ids).loss.backward()   # doctest: +SKIP
        >>> print(graph_status(model))                                  # doctest: +SKIP
        CUDA graphs: 1 sequence(s), 24 block call(s) recorded; replays 48 forward, 48 backward
          1 pass(es) eager: warm-up pass of a new input signature
    """
    for module in model.modules():
        forward = swapped_forward(module)
        if forward is not None and forward.graphs is not None:
            return forward.graphs.status
    return None
