"""Layers of kernels-community/linear (Hugging Face ``kernels`` layer rules: no ``__init__``,
``forward`` reads the attributes of the module it replaces)."""

import torch
from torch import nn

from . import matmul


class Linear(nn.Module):
    """``torch.nn.Linear.forward`` (``weight``, optional ``bias``) on the Triton matmul."""

    has_backward = True
    can_torch_compile = False  # an autograd.Function around a raw Triton launch: Dynamo would break the graph

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return matmul.linear(input, self.weight, self.bias)


# register_layer_kernel's layer_name defaults to the kernel name (the Hugging Face convention), and
# the documents register this repo both ways: kernel_name="linear" alone, and layer_name="Linear"
linear = Linear
