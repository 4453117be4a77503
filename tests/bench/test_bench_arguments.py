"""The benchmark modules run as commands (``python -m twinkle_fx.bench.generate``, ``.distributed``,
``.swap_table``) refuse what would measure nothing or end in a traceback, before the run and in one line: an
empty list, an output path the run could not write."""

from __future__ import annotations

import os
import sys

import pytest

from twinkle_fx.bench import distributed as distributed_bench
from twinkle_fx.bench import generate, swap_table

# the quickest run generate() could make: on code that checks nothing, a bad path fails after seconds, not minutes
QUICK = ["--tiny", "--rows", "eager", "--batches", "1", "--prompt", "2", "--new-tokens", "2", "--repeats", "1",
         "--no-token-check"]
PROC = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc, a folder that takes no file")


def _usage_error(capsys, call) -> str:
    """``call()`` must exit 2 through argparse; its one error line."""
    with pytest.raises(SystemExit) as info:
        call()
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err, err
    (line,) = [line for line in err.splitlines() if "error:" in line]
    return line


@pytest.mark.parametrize("argv, expected", [
    (["--rows", ","], "--rows is empty; give a comma-separated list from: eager, hf-static"),
    (["--batches", ","], "--batches takes comma-separated positive integers"),
    (["--out", "{tmp}"], "--out {tmp}: is a directory; give the file to write (e.g. {tmp}/generate.json)"),
    (["--out", "{tmp}/missing/generate.json"], "--out {tmp}/missing/generate.json: the folder {tmp}/missing does "
                                               "not exist"),
    pytest.param(["--out", "/proc/generate.json"], "--out /proc/generate.json: cannot create files in /proc",
                 marks=PROC),
])
def test_generate_refuses_before_it_runs(argv, expected, tmp_path, capsys):
    argv = [a.format(tmp=tmp_path) for a in argv]
    line = _usage_error(capsys, lambda: generate.main([*QUICK, *argv]))
    assert expected.format(tmp=tmp_path) in line
    assert not capsys.readouterr().out  # no table: nothing ran


@pytest.mark.parametrize("flags, expected", [
    ("--out {tmp}", "--out {tmp}: is a directory; give the file to write (e.g. {tmp}/distributed.json)"),
    ("--out {tmp}/missing/run.json", "the folder {tmp}/missing does not exist"),
    ("--profile {tmp}/file", "--profile {tmp}/file: is a file, and the results go into a directory"),
])
def test_distributed_refuses_before_it_runs(flags, expected, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    line = _usage_error(capsys, lambda: distributed_bench.parse_args(flags.format(tmp=tmp_path).split()))
    assert expected.format(tmp=tmp_path) in line


def test_distributed_out_is_rank_0s_alone(tmp_path, monkeypatch):
    """Rank 0 writes --out; another rank never checks it (its machine may not have rank 0's folders)."""
    monkeypatch.setenv("RANK", "1")
    assert distributed_bench.parse_args(["--out", str(tmp_path / "missing" / "run.json")]).out


def test_swap_table_refuses_an_out_that_is_a_file(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(sys, "argv", ["swap_table", "--out", str(tmp_path / "file")])
    line = _usage_error(capsys, swap_table.main)
    assert f"argument --out: {tmp_path}/file: is a file, and the results go into a directory" in line


def test_family_reference_refuses_an_empty_family_list(capsys, monkeypatch):
    import importlib.util
    from pathlib import Path

    tool = Path(__file__).resolve().parents[2] / "tools" / "family_reference.py"
    spec = importlib.util.spec_from_file_location("family_reference_args", tool)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    line = _usage_error(capsys, lambda: module._parse(["--tiny", "--families", ","]))
    assert "--families is empty; give a comma-separated list of built-in families, or all" in line
