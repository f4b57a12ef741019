#!/usr/bin/env bash
# Memory ladder (issue 4, item 6c): decode the same ids under several --ram budgets and print
# budget -> s/token, bytes read per token, expert RAM hit rate, peak RSS (and whether it is within
# budget x 1.05 + OVERHEAD_MB, default 64: binary, bounce buffers, activations, sequence state),
# and whether the ids equal the all-resident run's.
#   bench/memory-ladder.sh MODEL_DIR PACK_DIR [BUILD_DIR] [N_TOKENS] [BUDGET...]
# Single runs per rung, cold: a rung's s/token is one sample (read the trend, not one step).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 MODEL_DIR PACK_DIR [BUILD_DIR] [N_TOKENS] [BUDGET...]" >&2
  exit 2
fi
model=$1 pack=$2 build=${3:-build} n=${4:-16}
shift $(( $# < 4 ? $# : 4 ))
budgets=("$@")
[ ${#budgets[@]} -gt 0 ] || budgets=(600M 800M 1200M 1600M 2400M 3200M)
ids=17,42,1,99,128,7,200,63
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if ! "$build/ktier" run -m "$model" --ids $ids -n "$n" --print-ids --log-level warn \
    --report-json "$out/resident.json" >"$out/resident.txt" 2>"$out/resident.err"; then
  echo "the all-resident run failed:" >&2
  tail -n3 "$out/resident.err" >&2
  exit 1
fi
want=$(tail -n1 "$out/resident.txt")
overhead_mb=${OVERHEAD_MB:-64}
printf '%-10s %10s %9s %14s %14s %9s %10s %7s %8s %9s\n' budget s/token tok/s "trunk MB/tok" \
  "expert MB/tok" "hit rate" "peak RSS MB" "RSS ok" pinned identical
for b in "${budgets[@]}"; do
  if ! "$build/ktier" run -m "$model" --ids $ids -n "$n" --print-ids --pack "$pack" --ram "$b" \
      --log-level warn --report-json "$out/$b.json" >"$out/$b.txt" 2>"$out/$b.err"; then
    printf '%-10s refused: %s\n' "$b" "$(tail -n1 "$out/$b.err")"
    continue
  fi
  got=$(tail -n1 "$out/$b.txt")
  /usr/bin/python3 - "$out/$b.json" "$b" "$([ "$got" = "$want" ] && echo yes || echo NO)" "$overhead_mb" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
ok = j['peak_rss_bytes'] <= j['budget_bytes'] * 1.05 + float(sys.argv[4]) * 1e6
print(f"{sys.argv[2]:<10} {j['decode_s_per_token']:10.4f} {j['decode_tok_per_s']:9.2f} "
      f"{j['bytes_read_per_token']['trunk']/1e6:14.1f} {j['bytes_read_per_token']['experts']/1e6:14.1f} "
      f"{100*j['tiers']['ram']['hit_rate_bytes']:8.1f}% {j['peak_rss_bytes']/1e6:10.1f} "
      f"{'yes' if ok else 'NO':>7} "
      f"{j['trunk_layers_pinned']:>4}/{j['trunk_layers_pinned']+j['trunk_layers_streamed']:<3} {sys.argv[3]:>9}")
PY
done
/usr/bin/python3 -c "import json;j=json.load(open('$out/resident.json'));print(f\"resident (mmap): {j['decode_s_per_token']:.4f} s/token, peak RSS {j['peak_rss_bytes']/1e6:.1f} MB\")"
