"""Test-wide setup.

TRITON_INTERPRET must be set before any ``triton.jit`` runs, so it is set here, before the kernels
are imported, whenever no GPU is present (CI runs on CPU only).
"""

import os
import tempfile
from pathlib import Path

import torch

# The Hub path is tested offline against a cache the tests build: no test may reach the network,
# and huggingface_hub / kernels read these once, at import.
HF_HOME = Path(tempfile.mkdtemp(prefix="twinkle-hf-"))
os.environ["HF_HOME"] = str(HF_HOME)
os.environ["HF_HUB_OFFLINE"] = "1"

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import sys

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
sys.path.insert(0, str(EXAMPLES))  # the examples' user package (my_pkg) and local kernel repo


@pytest.fixture(autouse=True)
def _isolated_registry():
    """Every test gets its own registry and leaves no function patched: nothing leaks between tests."""
    from twinkle_fx import scoped_registry
    from twinkle_fx.function import restore_functions

    with scoped_registry(inherit=False) as registry:
        yield registry
    restore_functions()


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
