"""Where a profiled training step's time goes, from a ``twinkle-fx bench --profile`` Chrome trace.

Prints per step: device busy time by kernel category (GEMM, attention, twinkle_triton kernels,
Inductor-generated kernels, other), device idle time, the host operators with the most self time,
and the host-to-device runtime calls. Given two traces, also what the second runs that the first does
not: the kernels whose calls per step differ and the host operators whose self time differs most.

    python tools/profile_summary.py prof/inductor/profile_trace.json prof/twinkle/profile_trace.json
"""

import json
import re
import sys
from collections import Counter, defaultdict

CATEGORIES = (
    ("gemm", re.compile(r"nvjet|gemm|cutlass|sm90_xmma|cublas|splitKreduce", re.I)),
    ("attention", re.compile(r"sdpa|flash|fmha|attention", re.I)),
    ("inductor", re.compile(r"^triton_(poi|red|per|tem|for)_")),
    ("twinkle", re.compile(r"^_\w+_kernel$")),
)


def category(name: str) -> str:
    for label, pattern in CATEGORIES:
        if pattern.search(name):
            return label
    return "other"


def summarize(path: str) -> dict:
    data = json.load(open(path))
    events = data["traceEvents"] if isinstance(data, dict) else data
    steps = [e for e in events if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("step")]
    n = max(len(steps), 1)
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy") and "dur" in e]
    by_cat, by_name, calls = Counter(), Counter(), Counter()
    for k in kernels:
        by_cat[category(k["name"])] += k["dur"]
        by_name[k["name"]] += k["dur"]
        calls[k["name"]] += 1
    busy = sum(k["dur"] for k in kernels)
    span = (max(k["ts"] + k["dur"] for k in kernels) - min(k["ts"] for k in kernels)) if kernels else 0
    ops = [e for e in events if e.get("cat") == "cpu_op" and "dur" in e]
    # self time of host ops: duration minus that of children on the same thread
    ops.sort(key=lambda e: (e.get("tid"), e["ts"], -e["dur"]))
    self_us, stack = defaultdict(float), []
    for e in ops:
        while stack and (stack[-1].get("tid") != e.get("tid") or stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]):
            stack.pop()
        self_us[e["name"]] += e["dur"]
        if stack:
            self_us[stack[-1]["name"]] -= e["dur"]
        stack.append(e)
    runtime = Counter()
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "dur" in e:
            runtime[e["name"]] += e["dur"]
    step_wall = [s["dur"] for s in steps]
    return dict(steps=n, step_wall_ms=[round(w / 1e3, 2) for w in step_wall], busy_ms=busy / 1e3 / n,
                span_ms=span / 1e3 / n, by_cat={k: v / 1e3 / n for k, v in by_cat.items()},
                top=[(name, calls[name] / n, us / 1e3 / n) for name, us in by_name.most_common(40)],
                calls={name: c / n for name, c in calls.items()}, kernel_ms={name: us / 1e3 / n for name, us in by_name.items()},
                host_ms={name: us / 1e3 / n for name, us in self_us.items()},
                host_top=[(name, us / 1e3 / n) for name, us in sorted(self_us.items(), key=lambda kv: -kv[1])[:25]],
                runtime=[(name, us / 1e3 / n) for name, us in runtime.most_common(8)],
                launches=sum(1 for e in events if e.get("cat") == "kernel") / n)


def differences(a: dict, b: dict, rows: int = 25) -> list[str]:
    """What the second trace runs that the first does not: kernels whose calls per step differ (with the
    device time of the difference) and the host operators whose self time differs most."""
    lines = ["   kernels with other calls/step (second - first: calls, ms):"]
    names = set(a["calls"]) | set(b["calls"])
    delta = [(b["calls"].get(k, 0) - a["calls"].get(k, 0), b["kernel_ms"].get(k, 0) - a["kernel_ms"].get(k, 0), k)
             for k in names]
    for calls, ms, name in sorted((d for d in delta if abs(d[0]) >= 0.5), key=lambda d: -abs(d[0]))[:rows]:
        lines.append(f"     {calls:+7.1f} {ms:+7.3f}  {name[:110]}")
    lines.append("   host self time, second - first (ms/step):")
    ops = set(a["host_ms"]) | set(b["host_ms"])
    host = [(b["host_ms"].get(k, 0) - a["host_ms"].get(k, 0), k) for k in ops]
    for ms, name in sorted(host, key=lambda d: -abs(d[0]))[:rows]:
        lines.append(f"     {ms:+7.3f}  {name[:110]}")
    return lines


def main() -> None:
    summaries = []
    for path in sys.argv[1:]:
        s = summarize(path)
        summaries.append(s)
        print(f"== {path}: {s['steps']} steps, step wall (host) {s['step_wall_ms']} ms")
        print(f"   device busy {s['busy_ms']:.2f} ms/step over a span of {s['span_ms']:.2f}; "
              f"{s['launches']:.0f} kernels/step")
        print("   by category (ms/step): " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(s["by_cat"].items(), key=lambda kv: -kv[1])))
        print("   top kernels (calls/step, ms/step):")
        for name, calls, ms in s["top"]:
            print(f"     {ms:7.3f} {calls:6.1f}  {name[:110]}")
        print("   host self time (ms/step):")
        for name, ms in s["host_top"]:
            print(f"     {ms:7.3f}  {name[:110]}")
        print("   runtime calls (ms/step): " + ", ".join(f"{n} {ms:.2f}" for n, ms in s["runtime"]))
    if len(summaries) == 2:
        print(f"== {sys.argv[2]} against {sys.argv[1]}")
        print("\n".join(differences(*summaries)))


if __name__ == "__main__":
    main()
