#!/usr/bin/env bash
# Issue 15 on this CPU: do static KV caches change the torch engine's step times? `disco profile` of the
# embedded pair (float32, onednn) with each cache, then one held-out prompt per task generated with each
# (threshold policy): the outputs must be identical. Run alone (one heavy job at a time): ~8 min.
# Rerun: bash bench/static_cache_cpu.sh (the settings below are environment variables, e.g. DISCO=, OUT=).
set -euo pipefail
cd "$(dirname "$0")/.."
DISCO=${DISCO:-.venv/bin/disco}
OUT=${OUT:-bench/static}
mkdir -p "$OUT"
for cache in dynamic static; do
  $DISCO profile --engine torch --cache "$cache" --no-compile --out "$OUT/profile-torch-$cache.json" 2>&1 \
    | tee "$OUT/profile-torch-$cache.log"
  $DISCO generate --engine torch --cache "$cache" --no-compile --prompts code-test,explain-test,write-test --limit 1 \
    --policy threshold --max-new-tokens 64 --json "$OUT/generate-torch-$cache.json" > /dev/null 2> "$OUT/generate-torch-$cache.log"
done
.venv/bin/python - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
prof = {c: json.load(open(f"{out}/profile-torch-{c}.json")) for c in ("dynamic", "static")}
gen = {c: json.load(open(f"{out}/generate-torch-{c}.json"))["results"] for c in ("dynamic", "static")}
same = all(a["token_ids"] == b["token_ids"] for a, b in zip(gen["dynamic"], gen["static"]))
print("| cache | draft step ms | target step ms | verify(2)/(4)/(8)/(16)/(21) ÷ decode(1) | generate tok/s (3 prompts × 64) |")
print("|---|---|---|---|---|")
for c, p in prof.items():
    ratios = " / ".join(f"{p['c_t_ratio'][k - 1]:.2f}" for k in (2, 4, 8, 16, 21))
    tps = sum(r["stats"]["new_tokens"] for r in gen[c]) / sum(r["stats"]["wall_s"] for r in gen[c])
    print(f"| {c} | {p['c_d'] * 1e3:.1f} | {p['c_t'][0] * 1e3:.1f} | {ratios} | {tps:.2f} |")
print(f"static / dynamic: draft step {prof['static']['c_d'] / prof['dynamic']['c_d']:.3f}, target step "
      f"{prof['static']['c_t'][0] / prof['dynamic']['c_t'][0]:.3f}; outputs identical: {same}")
PY
