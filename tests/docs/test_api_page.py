"""The API reference page as the site shows it: ``mkdocs build --strict`` passes, every docstring example is a
code block with its ``>>>`` prompts (not nested blockquotes of run-together text), a ``>>> # comment`` in an
example never turns into a heading of the page's table of contents, and signatures are formatted (the
``docs`` extra brings the formatter ``separate_signature`` asks for)."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocstrings_handlers.python", reason="the docs extra is not installed: pip install -e .[docs]")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[str, str]:
    """(the API page's HTML, the build's log) of the whole site, built once."""
    site = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return (site / "api" / "index.html").read_text(), proc.stdout + proc.stderr


def _code_lines(page: str) -> set[str]:
    """Every line of every code block of the page, as text."""
    blocks = re.findall(r"<pre\b.*?</pre>", page, flags=re.DOTALL)
    return {line.rstrip() for block in blocks for line in html.unescape(re.sub(r"<[^>]+>", "", block)).splitlines()}


def test_examples_are_code_blocks_with_their_prompts(built):
    page, _ = built
    assert "<blockquote>" not in page  # how an "Example:" admonition renders `>>>`: one blockquote per `>`
    lines = _code_lines(page)
    # kernelize_model's example, a prompt line and its output line; a comment line of use_builtin_kernels'
    assert ">>> undo_kernelize(model)" in lines and "Restored(layers=['0 (GELU): FastGelu'], functions=[])" in lines
    assert any(line.startswith(">>> # not run by the doctest test") for line in lines), sorted(lines)[:50]


def test_only_the_page_sections_and_the_documented_objects_are_headings(built):
    page, _ = built
    sections = {re.sub(r"[^a-z0-9]+", "-", line.lstrip("#").strip().lower()).strip("-")
                for line in (ROOT / "docs" / "api.md").read_text().splitlines() if line.startswith("#")}
    ids = re.findall(r"<h[1-6][^>]*\bid=\"([^\"]+)\"", page)
    assert ids
    # an object's heading is its dotted path; a heading made from a "# comment" line gets "--words-of-it"
    stray = [i for i in ids if i not in sections and not re.fullmatch(r"twinkle_fx(\.\w+)+", i)]
    assert stray == []


def test_signatures_are_formatted(built):
    _, log = built
    assert "requires either Black or Ruff" not in log
