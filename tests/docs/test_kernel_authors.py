"""docs/kernel-authors.md: every code block and command of the page runs, as written, with what it prints checked
(tests/docs/test_pages.py runs the Python block as a user does, too)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _section() -> str:
    return (ROOT / "docs" / "kernel-authors.md").read_text()


def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", _section(), flags=re.S | re.M)


def test_python_block_registers_checks_and_benchmarks(capsys):
    (block,) = _blocks("python")
    exec(compile(block, "docs/kernel-authors.md", "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out
    assert re.search(r"^add\s+my_pkg\.math_ops\.add\s+PASS", out, flags=re.M) or \
        re.search(r"fast_add\s+my_pkg\.math_ops\.add\s+PASS", out), out
    assert re.search(r"fast_add: median [\d.]+ ms .* GB/s \[(perf_counter|cuda events) on ", out), out
    assert re.search(r"speed-up over torch.add: \d+\.\d\dx", out)


@pytest.mark.interpreter  # the page's commands, as written, are `--tiny`: the CPU through the Triton interpreter
def test_commands(tmp_path, monkeypatch, capsys):
    from twinkle_fx.__main__ import main

    (block,) = _blocks("bash")
    commands = [shlex.split(line) for line in block.splitlines() if line.strip()]
    assert [c[:2] for c in commands] == [["twinkle-fx", "check"]] * 2 + [["twinkle-fx", "bench"]]
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # relative paths as in the repository root
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    try:
        statuses = [main(command[1:]) for command in commands]
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert statuses == [0, 0, 0], out

    # 1. the built-in kernels against Qwen2's layers: every checklist item has a verdict
    table = out.split("twinkle-fx check on cpu", 1)[1]
    for kernel, original in (("RMSNorm", "Qwen2RMSNorm"), ("SwiGLUMLP", "Qwen2MLP"),
                             ("CausalLMFusedLoss", "Qwen2ForCausalLM"),
                             ("apply_rotary_pos_emb", "transformers.models.qwen2.modeling_qwen2.apply_rotary_pos_emb")):
        # correctness, speed-up, sizes, memory, fallback, profiler, documented
        assert re.search(rf"^{kernel}\s+{re.escape(original)}\s+PASS\s+N/A\s+N/A\s+N/A\s+PASS\s+PASS\s+PASS$",
                         table, flags=re.M), table

    # 2. the user's own kernel, JSON out
    report = json.loads((tmp_path / "check.json").read_text())
    (check,) = report["checks"]
    assert (check["target"], check["kind"], check["mode"]) == ("my_pkg.math_ops.add", "function", "inference")
    assert check["verdicts"]["correctness"] == "PASS" and len(check["correctness"]) == 6  # 3 sizes x 2 dtypes
    assert {c["dtype"] for c in check["correctness"]} == {"float32", "bfloat16"}
    assert check["speed"][0]["kernel_ms"] > 0 and check["profile"]

    # 3. one trace and one report per backend row
    for row in ("eager", "kernelize"):
        trace = json.loads((tmp_path / "prof" / row / "profile_trace.json").read_text())
        assert trace["traceEvents"]
        report_text = (tmp_path / "prof" / row / "profile_report.txt").read_text()
        assert "host (wall) time per step:" in report_text and "top " in report_text
        assert "kernel launches per step:" in report_text
    assert "rms_norm" in (tmp_path / "prof" / "kernelize" / "profile_report.txt").read_text()
    assert not list(tmp_path.glob("bench-*")), "without --out, bench writes nothing but the profiles"
