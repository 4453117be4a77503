"""Every ```python and ```bash block of the documentation pages (docs/*.md; docs/seeds/ is test_seeds.py's) runs as a
user runs it: pasted into a file at the repository root and run with ``python <file>`` in a fresh process (bash:
each command in the repository root), with nothing on stderr. Blocks marked in the page are skipped with their
reason (tests/readme/markdown_blocks.py says how)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "readme"))
from markdown_blocks import ROOT, blocks, check  # noqa: E402

PAGES = sorted((ROOT / "docs").glob("*.md"))
BLOCKS = [block for page in PAGES for block in blocks(page)]


def test_every_page_is_in_the_site_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    assert PAGES and [page.name for page in PAGES if f": {page.name}" not in nav] == []


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_docs_block_runs(block, offline_hub):
    reason = check(block, has_cuda=torch.cuda.is_available())
    if reason:
        pytest.skip(reason)
