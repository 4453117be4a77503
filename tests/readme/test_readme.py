"""Every ```python block of README.md runs as written (each on its own, in a fresh namespace, from the
repository root, with the registry and patched functions reset by the conftest fixture)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OPTIONAL_INTEGRATIONS = ("datasets", "trl", "accelerate")
BLOCKS = re.findall(r"^```python\n(.*?)^```$", (ROOT / "README.md").read_text(), flags=re.S | re.M)


def _first_code_line(block: str) -> str:
    return next(line for line in block.splitlines() if line.strip() and not line.startswith(("import", "from")))


def test_readme_has_the_blocks_it_promises():
    assert len(BLOCKS) >= 7


@pytest.mark.parametrize("block", BLOCKS, ids=[f"{i}:{_first_code_line(b)[:40]}" for i, b in enumerate(BLOCKS)])
def test_readme_block_runs(block, monkeypatch):
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    # the kernels block tags Qwen2RMSNorm the way kernels users do; that must not leak into other tests
    names = ("kernel_layer_name", "kernel_condition")
    saved = {name: Qwen2RMSNorm.__dict__[name] for name in names if name in Qwen2RMSNorm.__dict__}
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    try:
        exec(compile(block, "README.md block", "exec"), {"__name__": "__readme__"})
    except ModuleNotFoundError as e:
        # the trainer recipes need the test extra's datasets/trl/accelerate (CI has them; the GPU machine not)
        if e.name not in OPTIONAL_INTEGRATIONS:
            raise
        pytest.skip(f"README block needs {e.name} (pip install twinkle_fx[test])")
    finally:
        for name in names:
            if name in saved:
                setattr(Qwen2RMSNorm, name, saved[name])
            elif name in Qwen2RMSNorm.__dict__:
                delattr(Qwen2RMSNorm, name)
