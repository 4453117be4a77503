"""Test-wide setup.

One device for the whole suite (``device_under_test``): CUDA when a GPU is present, else the CPU with
the Triton interpreter (TRITON_INTERPRET must be set before any ``triton.jit`` runs, so it is set on
import of that module, before the kernels are imported). Tests take the ``device`` fixture instead of
naming "cpu"; ``@pytest.mark.gpu`` tests need CUDA, ``@pytest.mark.interpreter`` tests need the
interpreter (they are skipped, with the reason, elsewhere).

The default run runs every test (CI runs the whole suite). The other markers select: ``-m fast`` the
tests that meet transformers' surface (below); ``-m "not slow"`` leaves out the tests that take ten
seconds or more each on 2 CPU cores (benchmarks, example scripts, training loops, the family
matrices), ``-m "not distributed"`` the ones that start process groups (``tests/distributed/``).
"""

import atexit
import os
import shutil
import tempfile
from pathlib import Path

# The Hub path is tested offline against a cache the tests build: no test may reach the network,
# and huggingface_hub / kernels read these once, at import. Each process (xdist worker) removes its own.
HF_HOME = Path(tempfile.mkdtemp(prefix="twinkle-hf-"))
atexit.register(shutil.rmtree, HF_HOME, ignore_errors=True)
os.environ["HF_HOME"] = str(HF_HOME)
os.environ["HF_HUB_OFFLINE"] = "1"

from device_under_test import DEVICE, INTERPRETED  # noqa: E402  sets TRITON_INTERPRET without a GPU

import sys

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
sys.path.insert(0, str(EXAMPLES))  # the examples' user package (my_pkg) and local kernel repo
TESTS = Path(__file__).resolve().parent

# ``-m fast``: the tests that meet transformers' surface (the README's blocks, every built-in model
# family, the fused-loss head, the names the kernels take) in a few minutes; CI also runs them
# against the oldest transformers the project supports.
FAST = ("readme/", "families/", "generation/", "docs/test_seeds.py", "eager/test_causal_lm_head.py",
        "kernels/test_transformers_api.py")
DISTRIBUTED = ("distributed/",)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped on the CPU/interpreter run)")
    config.addinivalue_line("markers", "interpreter: needs the Triton interpreter (skipped on a GPU run)")
    config.addinivalue_line("markers", "fast: the fast subset that meets transformers' surface (see FAST)")
    config.addinivalue_line("markers", "falls_back: a generation test that means transformers' own loop to run")
    config.addinivalue_line("markers", "slow: ten seconds or more on 2 CPU cores (run by default; -m 'not slow')")
    config.addinivalue_line("markers", "distributed: starts a torch.distributed process group (see DISTRIBUTED)")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device; this run uses the CPU with TRITON_INTERPRET=1")
    skip_interpreter = pytest.mark.skip(reason="needs the Triton interpreter (TRITON_INTERPRET=1); this run uses CUDA")
    for item in items:
        path = Path(item.path).relative_to(TESTS).as_posix()
        if path.startswith(FAST):
            item.add_marker(pytest.mark.fast)
        if path.startswith(DISTRIBUTED):
            item.add_marker(pytest.mark.distributed)
        if "gpu" in item.keywords and INTERPRETED:
            item.add_marker(skip_gpu)
        if "interpreter" in item.keywords and not INTERPRETED:
            item.add_marker(skip_interpreter)


@pytest.fixture
def device() -> str:
    """The device of this run: "cuda" on a GPU machine, "cpu" (Triton interpreter) otherwise."""
    return DEVICE


@pytest.fixture(autouse=True)
def _triton_interpret_as_it_was():
    """A test that switches the Triton interpreter on in-process (``bench --tiny``, ``check --tiny``
    run in-process) must not leave it on: Triton decides per kernel at definition, so every kernel
    Inductor generated afterwards would run through the interpreter on a GPU machine."""
    before = os.environ.get("TRITON_INTERPRET")
    yield
    if before is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = before


@pytest.fixture(autouse=True)
def _autograd_left_on():
    """Autograd is on at the start of every test. One that leaves it off (a ``torch.set_grad_enabled(False)``
    called outside a ``with``, a generator suspended inside ``torch.no_grad()``) fails here, by name, and the
    mode is switched back, instead of every later test in the process failing with "does not require grad"."""
    import torch

    yield
    if not torch.is_grad_enabled():
        torch.set_grad_enabled(True)  # called, not entered: it sets the mode at once
        pytest.fail("this test left autograd off: torch.is_grad_enabled() was False after it", pytrace=False)


@pytest.fixture(autouse=True)
def _torch_functions_as_they_were():
    """No torch function mode is active after a test, and torch functions are not disabled. ``with torch.device(...)``
    pushes its mode to the bottom of the stack, so a mode a test leaves behind (a device context entered and never
    exited) sits above every later test's own and decides the device of their tensors; with torch functions disabled
    no mode runs at all. Later tests would then make CPU tensors on a GPU machine, failing far from the cause (or
    passing on the ops' CPU references). The test that leaves either fails here, by name, and both are restored."""
    import torch
    from torch.overrides import _get_current_function_mode_stack, _pop_mode

    yield
    left, state = _get_current_function_mode_stack(), torch._C._get_torch_function_state()
    for _ in left:
        _pop_mode()
    if state != torch._C._TorchFunctionState.ENABLED:
        torch._C._set_torch_function_state(torch._C._TorchFunctionState.ENABLED)
    if left or state != torch._C._TorchFunctionState.ENABLED:
        pytest.fail(f"this test left torch function modes active ({left}) or torch functions disabled ({state})",
                    pytrace=False)


@pytest.fixture(autouse=True)
def _isolated_registry():
    """Every test gets its own registry, leaves no function patched and no process-wide cache
    filled (twinkle_fx.core.caches; the kernels' own in twinkle_triton): nothing leaks between tests."""
    from twinkle_fx import scoped_registry
    from twinkle_fx.core.caches import reset_caches
    from twinkle_fx.function import restore_functions

    with scoped_registry(inherit=False) as registry:
        yield registry
    restore_functions()
    reset_caches()
    for name in ("twinkle_triton._launch", "twinkle_triton.rotary", "twinkle_triton._library"):  # only if a test imported them
        module = sys.modules.get(name)
        if module is not None:
            module.reset()


@pytest.fixture
def local_repo() -> Path:
    """A real local kernel repo (plain-package layout) shipped with the examples."""
    return EXAMPLES / "local_repo"


@pytest.fixture(scope="session")
def offline_hub() -> Path:
    """The session's offline Hugging Face cache, holding kernels-community/activation built from
    kernels/twinkle_triton and kernels-community/linear from examples/hub_repos/linear (loaded through
    the real ``kernels.get_kernel``)."""
    from make_offline_hub_cache import publish_examples

    publish_examples(HF_HOME)
    return HF_HOME


@pytest.fixture
def empty_offline_hub() -> Path:
    """The session's offline cache, for repos never published to it: no network, no cache."""
    return HF_HOME
