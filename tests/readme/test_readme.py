"""Every ```python and ```bash block of README.md runs as a user runs it: pasted into a file at the repository
root and run with ``python <file>`` in a fresh process (bash: each command in the repository root), with no
output on stderr. Blocks marked in the page (markdown_blocks.py says how) are skipped with their reason."""

from __future__ import annotations

import pytest
import torch
from markdown_blocks import ROOT, blocks, check

BLOCKS = blocks(ROOT / "README.md")


def test_readme_shows_the_setup_commands_and_the_examples_it_promises():
    langs = [b.lang for b in BLOCKS]
    assert langs.count("python") >= 4 and langs.count("bash") >= 4
    first_screen = "\n".join((ROOT / "README.md").read_text().splitlines()[:60])
    assert "git clone" in first_screen and "pip install -e ." in first_screen


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_readme_block_runs(block, offline_hub):
    reason = check(block, has_cuda=torch.cuda.is_available())
    if reason:
        pytest.skip(reason)
