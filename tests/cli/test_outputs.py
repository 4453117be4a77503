"""Every command that writes to a path it is given (``--out``, ``--profile``, a tool's ``--json``) refuses, before
its run, a path the run could not write at its end: a directory where a file goes, a file where a directory goes,
a folder that does not exist, a place no file can be made (``/proc``). One line, naming the option, the path
and what to give instead; nothing left behind by the check."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from twinkle_fx.core.outputs import check_output_path, output_dir, output_file

ROOT = Path(__file__).resolve().parents[2]
PROC = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc, a folder that takes no file")


@pytest.mark.parametrize("path, kind, expected", [
    ("{tmp}", {}, "--out {tmp}: is a directory; give the file to write"),
    ("{tmp}", {"file_name": "check.json"}, "(e.g. {tmp}/check.json)"),
    ("{tmp}/new/", {}, "ends in a slash"),
    ("{tmp}/missing/x.json", {}, "the folder {tmp}/missing does not exist"),
    ("{tmp}/file/x.json", {}, "{tmp}/file is a file, not a folder"),
    ("{tmp}/file/a/x.json", {"parents": True}, "{tmp}/file is a file, so no folder can be made in it"),
    ("{tmp}/file", {"directory": True}, "is a file, and the results go into a directory"),
    ("{tmp}/file/sub", {"directory": True}, "{tmp}/file is a file, so no folder can be made in it"),
])
def test_what_cannot_be_written_is_refused_in_one_line(tmp_path, path, kind, expected):
    (tmp_path / "file").write_text("kept\n")
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(ValueError) as info:
        check_output_path("--out", path.format(tmp=tmp_path), **kind)
    message = str(info.value)
    assert expected.format(tmp=tmp_path) in message and "\n" not in message
    assert len(message) - len(str(tmp_path)) * message.count(str(tmp_path)) <= 200, message
    assert sorted(os.listdir(tmp_path)) == before and (tmp_path / "file").read_text() == "kept\n"


@pytest.mark.parametrize("path, kind", [
    ("{tmp}/x.json", {}), ("{tmp}/file", {}), ("{tmp}/a/b/x.json", {"parents": True}), ("{tmp}", {"directory": True}),
    ("{tmp}/a/b", {"directory": True}), (None, {}),
])
def test_what_can_be_written_passes_and_nothing_is_left_behind(tmp_path, path, kind):
    (tmp_path / "file").write_text("kept\n")
    check_output_path("--out", None if path is None else path.format(tmp=tmp_path), **kind)
    assert os.listdir(tmp_path) == ["file"] and (tmp_path / "file").read_text() == "kept\n"


@PROC
@pytest.mark.parametrize("kind", [{}, {"parents": True}, {"directory": True}])
def test_a_folder_that_takes_no_file_is_refused_though_its_permission_bits_allow_it(kind):
    with pytest.raises(ValueError, match=r"^--out /proc/twinkle-fx\.json: cannot create (files|folders) in /proc "):
        check_output_path("--out", "/proc/twinkle-fx.json", **kind)


def test_argparse_types_say_the_path_and_the_problem(tmp_path):
    import argparse

    assert output_file(str(tmp_path / "x.json")) == tmp_path / "x.json"
    assert output_dir(str(tmp_path / "new")) == tmp_path / "new"
    with pytest.raises(argparse.ArgumentTypeError, match=f"^{tmp_path}: is a directory; give the file to write$"):
        output_file(str(tmp_path))


def _options_writing_paths(path: Path) -> list[tuple[str, str]]:
    """(option, the source of its add_argument call) for each option of ``path`` that names a file or folder to
    write: ``--out``, ``--json``, ``--profile``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument" and node.args
                and isinstance(node.args[0], ast.Constant) and node.args[0].value in ("--out", "--json", "--profile")):
            found.append((node.args[0].value, ast.unparse(node)))
    return found


TOOLS = sorted((ROOT / "tools").glob("*.py"))


@pytest.mark.parametrize("tool", TOOLS, ids=[t.name for t in TOOLS])
def test_every_tool_checks_the_paths_it_writes_when_it_parses_them(tool):
    for option, call in _options_writing_paths(tool):
        assert "type=output_file" in call or "type=output_dir" in call, f"{tool.name}: {call}"


@pytest.mark.parametrize("tool, argv, expected", [
    ("launch_host_cost.py", ["--out", "{tmp}"], "argument --out: {tmp}: is a directory; give the file to write"),
    pytest.param("allreduce_probe.py", ["--json", "/proc/twinkle-fx.json"],
                 "argument --json: /proc/twinkle-fx.json: cannot create files in /proc", marks=PROC),
])
def test_a_tool_refuses_its_output_before_it_runs(tmp_path, tool, argv, expected):
    argv = [a.format(tmp=tmp_path) for a in argv]
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / tool), *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (error,) = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert error.startswith(f"{tool}: error: {expected.format(tmp=tmp_path)}"), error
