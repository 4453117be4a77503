"""The benchmark modules run as commands (``python -m twinkle_fx.bench.generate``, ``.distributed``,
``.swap_table``) refuse what would measure nothing or end in a traceback, before the run and in one line: an
empty list, a size of 0, a baseline file that is not there or not one, an output path the run could not
write, and a distributed run started without torchrun."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

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
    ("--batch 0", "--batch must be at least 1, got 0"),
    ("--seq 0", "--seq must be at least 1, got 0"),
    ("--baseline {tmp}/single.json", "--baseline {tmp}/single.json: no such file; give the JSON a --parallel none "
                                     "run wrote with --out"),
    ("--out {tmp}", "--out {tmp}: is a directory; give the file to write (e.g. {tmp}/distributed.json)"),
    ("--out {tmp}/missing/run.json", "the folder {tmp}/missing does not exist"),
    ("--profile {tmp}/file", "--profile {tmp}/file: is a file, and the results go into a directory"),
    ("--backend inductor --swap-policy always", "--swap-policy is the twinkle backend's option: use it with "
                                                "--backend twinkle or kernelize+twinkle, not inductor"),
])
def test_distributed_refuses_before_it_runs(flags, expected, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    line = _usage_error(capsys, lambda: distributed_bench.parse_args(flags.format(tmp=tmp_path).split()))
    assert expected.format(tmp=tmp_path) in line


def test_distributed_sizes_default_only_when_left_out():
    assert (distributed_bench.parse_args([]).batch, distributed_bench.parse_args([]).seq) == (1, 8)  # --size tiny
    assert distributed_bench.parse_args("--batch 3 --seq 5".split()).batch == 3


def test_distributed_out_is_rank_0s_alone(tmp_path, monkeypatch):
    """Rank 0 writes --out; another rank never checks it (its machine may not have rank 0's folders)."""
    monkeypatch.setenv("RANK", "1")
    assert distributed_bench.parse_args(["--out", str(tmp_path / "missing" / "run.json")]).out


def test_distributed_without_torchrun_says_how_to_launch(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as info:
        distributed_bench.main(["--parallel", "ddp", "--backend", "eager", "--steps", "1"])
    message = str(info.value.code)
    assert message.startswith("--parallel ddp runs one process per device: launch it with torchrun --nproc_per_node")
    assert "or use --parallel none" in message and len(message) <= 200 and "\n" not in message


def test_collective_sm_knobs_reach_nccl_before_the_group_and_cublas_after(monkeypatch):
    """--nccl-ctas is in NCCL's environment when the process group makes its communicator; --sm-carveout goes to
    cuBLAS on a GPU once the rank's device is known, and not at all on a CPU."""
    from twinkle_fx.core import torch_internals

    class Stop(Exception):
        pass

    monkeypatch.setenv("NCCL_MAX_CTAS", "0")
    monkeypatch.delenv("NCCL_MAX_CTAS")  # the variable is put back as it was (unset) after the test
    seen = []
    monkeypatch.setattr(torch_internals, "set_gemm_sm_carveout", lambda sms: seen.append(("carveout", sms)))

    def stop(args, world):
        raise Stop

    monkeypatch.setattr(distributed_bench, "check_world", stop)
    for device, carveout in (("cuda", [("carveout", 8)]), ("cpu", [])):
        seen.clear()
        monkeypatch.setattr(distributed_bench, "init_distributed", lambda parallel, device=device: (
            seen.append(("group", os.environ.get("NCCL_MAX_CTAS"))) or (0, 1, torch.device(device))))
        with pytest.raises(Stop):
            distributed_bench.main("--parallel none --nccl-ctas 16 --sm-carveout 8".split())
        assert seen == [("group", "16"), *carveout]


def test_distributed_baseline_that_is_no_result_is_named(tmp_path):
    baseline = tmp_path / "other.json"
    baseline.write_text(json.dumps({"kind": "something else"}))
    with pytest.raises(SystemExit) as info:
        distributed_bench.main(["--parallel", "none", "--baseline", str(baseline)])
    message = str(info.value.code)
    assert message.startswith(f"error: --baseline {baseline}: not what a --parallel none --out run writes (KeyError")
    assert "\n" not in message


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
