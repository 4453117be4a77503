#!/usr/bin/env bash
# Session 3: `twinkle-fx check` over the built-in kernels with its defaults (issue 11's GPU table), then a
# compiled bench run of several backends whose stderr is searched for Dynamo's "Exception ignored" noise
# (issue 12 item 13).
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
start=$(date +%s)
timeout "${1:-400}" python3 -m twinkle_fx check --out "$out/check.json" > "$out/check.txt" 2>&1; echo "check exit $? after $(( $(date +%s) - start )) s"
grep -v "UserWarning\|_warn_once" "$out/check.txt" | tail -60
timeout "${2:-150}" python3 -m twinkle_fx bench --backends inductor,twinkle,kernelize+twinkle --steps 3 --warmup 1 --out "$out/bench" > "$out/bench.txt" 2>&1; echo "bench exit $?"
echo "'Exception ignored' lines: $(grep -c 'Exception ignored' "$out/bench.txt")"
tail -12 "$out/bench.txt"
