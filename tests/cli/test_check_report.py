"""The table ``twinkle-fx check`` prints: each kernel's detail block lists the checklist items in order, and the
profiler's rows stand under the profiler item they belong to, before the next item."""

from __future__ import annotations

from twinkle_fx.checklist.report import CHECKLIST, CheckReport, KernelCheck


def test_the_profiler_rows_stand_under_the_profiler_item():
    check = KernelCheck("scale_kernel", "user_ops.scale", "function", source="impl scale_kernel", mode="train",
                        verdicts=dict.fromkeys(CHECKLIST, "PASS"),
                        notes={item: f"the {item} note" for item in CHECKLIST},
                        profile=[{"name": f"aten::op{i}", "calls": 1, "time_ms": 1.0 - i / 10, "clock": "self CPU"}
                                 for i in range(7)])
    lines = str(CheckReport("cpu", True, ["float32"], [check])).splitlines()
    block = lines[lines.index("scale_kernel vs user_ops.scale [train] from impl scale_kernel") + 1:]
    assert [line.split(":")[0].strip() for line in block if line.startswith("  ") and not line.startswith("    ")] \
        == list(CHECKLIST)
    profiler = block.index("  profiler: the profiler note")
    rows = block[profiler + 1:profiler + 6]
    assert [row.split()[0] for row in rows] == [f"aten::op{i}" for i in range(5)]  # the top five, in order
    assert block[profiler + 6] == "  documented: the documented note"
