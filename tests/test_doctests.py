"""The docstring examples of the public API run (as Hugging Face ``kernels``' ``test_doctest.py``).

Every module below is searched for examples; each docstring with examples is one test, run in the
suite's isolated registry (tests/conftest.py) with ``torch`` and ``nn`` in scope and ``examples/`` on
``sys.path`` (``my_pkg`` is the examples' user package). An example marked ``+SKIP`` says in the
docstring why it cannot run here (a GPU, the Hub, a whole model compiled); this test counts those
too, so an example silently turned off shows up in review.
"""

from __future__ import annotations

import doctest
import importlib

import pytest
import torch

# The examples are written for the CPU (device="cpu", CPU tensors), where twinkle_triton runs through the
# Triton interpreter; on a GPU run (no interpreter) Triton cannot launch on CPU tensors, and
# apply_function_kernel picks the CUDA registrations. The GPU half of each example's API is covered by
# the suite's device tests.
pytestmark = pytest.mark.interpreter

MODULES = (
    "twinkle_fx",
    "twinkle_fx.core.registration",
    "twinkle_fx.core.config",
    "twinkle_fx.function",
    "twinkle_fx.core.registry",
    "twinkle_fx.core.caches",
    "twinkle_fx.core.swaps",
    "twinkle_fx.core.plugins",
    "twinkle_fx.core.selection",
    "twinkle_fx.core.reasons",
    "twinkle_fx.core.admission",
    "twinkle_fx.core.modes",
    "twinkle_fx.core.devices",
    "twinkle_fx.core.numerics",
    "twinkle_fx.core.tolerances",
    "twinkle_fx.core.outputs",
    "twinkle_fx.builtin",
    "twinkle_fx.integrations.kernels_api",
    "twinkle_fx.integrations.kernels_mapping",
    "twinkle_fx.compiler.entry",
    "twinkle_fx.checklist.checklist",
    "twinkle_fx.integrations.hub",
    "twinkle_fx.testing",
    "twinkle_fx.compiler.graph.recording",
    "twinkle_fx.measure.gpu_state",
    "twinkle_fx.measure.kernel_classes",
    "twinkle_fx.measure.kernel_timing",
    "twinkle_fx.measure.overlap",
    "twinkle_fx.eager.function_patches",
    "twinkle_fx.eager.kernelize",
    "twinkle_fx.eager.plan",
    "twinkle_fx.bench",
    "twinkle_fx.bench.micro",
    "twinkle_fx.bench.model_bench",
    "twinkle_fx.bench.inference",
)
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _docstrings():
    finder = doctest.DocTestFinder(exclude_empty=True)
    found = []
    for name in MODULES:
        module = importlib.import_module(name)
        for test in finder.find(module, name, globs={}):
            if test.examples and (test.name.startswith(name + ".") or test.name == name):
                found.append(pytest.param(name, test.name, id=test.name))
    return found


DOCSTRINGS = _docstrings()


@pytest.mark.parametrize("module_name, test_name", DOCSTRINGS)
def test_docstring_examples_run(module_name, test_name):
    module = importlib.import_module(module_name)
    (test,) = [t for t in doctest.DocTestFinder().find(module, module_name) if t.name == test_name]
    test.globs = {**vars(module), "torch": torch, "nn": torch.nn}
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    report: list[str] = []
    result = runner.run(test, out=report.append)
    assert result.failed == 0, "".join(report)


def test_the_public_examples_mostly_run():
    """Most examples run; the few marked +SKIP (GPU, Hub, a compiled model) stay few."""
    runnable = skipped = 0
    for param in DOCSTRINGS:
        module_name, test_name = param.values
        module = importlib.import_module(module_name)
        (test,) = [t for t in doctest.DocTestFinder().find(module, module_name) if t.name == test_name]
        for example in test.examples:
            if example.options.get(doctest.SKIP):
                skipped += 1
            else:
                runnable += 1
    assert runnable >= 3 * skipped, f"{runnable} examples run, {skipped} are skipped"
