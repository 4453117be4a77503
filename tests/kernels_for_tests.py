"""Small layer kernels with observable behaviour, for the tests of the registry, selection and the eager swap."""

import torch


class Gelu(torch.nn.Module):
    """The layer the tests swap: a user module with its own forward."""

    def forward(self, x):
        return torch.nn.functional.gelu(x)


class TanhGeluKernel(torch.nn.Module):
    """A different (approximate) kernel, so a swap is visible in the output."""

    has_backward = True
    can_torch_compile = True

    def forward(self, x):
        return torch.nn.functional.gelu(x, approximate="tanh")


class NoBackwardKernel(torch.nn.Module):
    has_backward = False
    can_torch_compile = True

    def forward(self, x):
        return torch.nn.functional.gelu(x, approximate="tanh")


class NotCompilableKernel(torch.nn.Module):
    has_backward = True
    can_torch_compile = False

    def forward(self, x):
        return torch.nn.functional.gelu(x, approximate="tanh")


class WrongSignatureKernel(torch.nn.Module):
    has_backward = True

    def forward(self, hidden, scale):
        return hidden * scale


def model_with_gelus():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), Gelu(), torch.nn.Linear(8, 8), Gelu())


def uses_tanh(module, x=None):
    x = torch.linspace(-3, 3, 16) if x is None else x
    return torch.equal(module(x), torch.nn.functional.gelu(x, approximate="tanh"))
