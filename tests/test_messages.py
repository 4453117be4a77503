"""Error and log messages say what went wrong in a first line of at most 200 characters; the detail (the
registered kernels, the hint, the measured figures) goes after a newline, where a log line or a
traceback's last line does not bury it.

Read from the source: every ``raise`` of an exception built from a string, every ``logger.<level>(...)``
/ ``logger.log(level, ...)`` and every ``warnings.warn(...)``. Only the literal text counts (an f-string's
replacement fields and ``%s`` arguments count nothing), so a message is measured by what its author wrote.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (ROOT / "twinkle_fx", ROOT / "kernels" / "twinkle_triton")
LIMIT = 200
LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}


def _literal(node: ast.AST) -> str | None:
    """The text an author wrote in a message expression, or None when it is no string built in place."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        left = _literal(node.left)
        right = _literal(node.right) if isinstance(node.op, ast.Add) else ""
        return None if left is None else left + (right or "")
    return None


def _message(node: ast.Call) -> ast.AST | None:
    """The message argument of a logging, warning or exception call, or None when ``node`` is none of them."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else None
    if owner in ("logger", "log", "logging") and name in LEVELS:
        return node.args[0] if node.args else None
    if owner in ("logger", "log") and name == "log":
        return node.args[1] if len(node.args) > 1 else None
    if owner == "warnings" and name == "warn":
        return node.args[0] if node.args else None
    return None


def messages(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, first line of the literal text) of every message written in ``source``, in line order."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        arg = None
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
            arg = node.exc.args[0]
        elif isinstance(node, ast.Call):
            arg = _message(node)
        text = None if arg is None else _literal(arg)
        if text is not None:
            found.append((arg.lineno, text.split("\n", 1)[0]))
    return sorted(found)


FILES = sorted(p for package in PACKAGES for p in package.rglob("*.py"))


def test_the_scan_reads_messages():
    """The scan finds what it is meant to find: a guard against a scan that silently reads nothing."""
    source = ('def f(x):\n'
              '    logger.warning("short %s", x)\n'
              '    logger.log(20, "also " + "short")\n'
              '    warnings.warn(f"{x} warned")\n'
              '    raise ValueError(f"{x}: " "first line\\nthe detail")\n')
    assert [text for _, text in messages(source)] == ["short %s", "also short", " warned", ": first line"]
    assert sum(len(messages(path.read_text(), str(path))) for path in FILES) > 200


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_first_lines_of_messages_are_short(path):
    long = [f"{path.relative_to(ROOT)}:{line}: {len(text)} characters: {text[:80]}..."
            for line, text in messages(path.read_text(), str(path)) if len(text) > LIMIT]
    assert long == [], (f"first lines over {LIMIT} characters (put the detail after a newline):\n"
                        + "\n".join(long))
