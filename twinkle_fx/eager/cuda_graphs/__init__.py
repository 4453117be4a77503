"""CUDA graphs in eager models: ``kernelize_model(model, cuda_graphs=True)`` (not the FX graphs of
the compile path, nor Dynamo's graph breaks).

- :mod:`.layer_graphs`: each decoder layer recorded and replayed, forward and backward;
- :mod:`.model_graphs`: a decode step's whole forward as one graph;
- :mod:`.capture` and :mod:`.replay`: what a capture needs and what a replay runs;
- :mod:`.status`: :func:`graph_status`, what the graphs of a model did.
"""

from .status import GraphStatus, graph_status

__all__ = ["GraphStatus", "graph_status"]
