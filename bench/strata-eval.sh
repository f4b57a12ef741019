#!/usr/bin/env bash
# The strata evaluation of docs/STRATA.md §8 on a synthetic checkpoint (issue 5 item 6):
# records traces from live runs with router lookahead depth 3 (and the refresh), then for each
# trace prints
#   * the lookahead predictor's recall and precision at depths 1-3 and of the refresh (`ktier
#     trace info`), and
#   * hit rate by bytes for every policy (lru, lfu, temperature, static, belady) at RAM tiers
#     holding 5, 10, 20, 40 and 60% of the experts (`ktier trace replay`), without the recorded
#     predictions, with depth 1 alone and with depth 1 and the refresh prefetched;
# then live runs of the engine (memory dial, all experts read from the shards) at one budget:
# temperature vs lru, lookahead 0/1/2 (and 1 without the refresh), s/token, hit rate, prefetch precision/recall/timeliness.
#
#   bench/strata-eval.sh MODEL [BUILD] [OUT] [TOKENS]
# MODEL: a checkpoint (`ktier synth --preset demo -o DIR`); BUILD: build folder (default build);
# OUT: where traces, CSV, JSON and plots go (default /tmp/ktier-strata-eval); TOKENS: decode
# tokens per trace (default 160).
set -euo pipefail
MODEL=${1:?usage: bench/strata-eval.sh MODEL [BUILD] [OUT] [TOKENS]}
BUILD=${2:-build}
OUT=${3:-/tmp/ktier-strata-eval}
TOKENS=${4:-160}
KTIER="$BUILD/ktier"
mkdir -p "$OUT"
# Steps write to files: a failure stops the script naming the step, with the end of its log.
die() { echo "strata-eval: $1 failed; the end of $2:" >&2; tail -n5 "$2" >&2; exit 1; }

keys=$(/usr/bin/python3 - "$MODEL" <<'PY'
import json, sys
c = json.load(open(sys.argv[1] + "/config.json"))
t = c.get("text_config", c)
print((t["num_hidden_layers"] - t.get("first_k_dense_replace", 0)) * t["num_experts"])
PY
)
budgets=""
for pct in 5 10 20 40 60; do budgets+="${budgets:+,}$((keys * pct / 100))x"; done
echo "# $MODEL: $keys routed experts; RAM tiers (experts): $budgets"

# Four conversations: different prompts, sampled (a greedy random-weight model may loop, which
# would flatter every cache).
prompts=("1,5,9,13,17,21,25,29,33,37,41,45,49,53,57,61" "200,3,77,150,8,91,240,16,120,64,33,180"
         "21,33,400,39,99,1000,2000,3" "28,44,400,52,99,1000,2000,4")
i=0
for p in "${prompts[@]}"; do
  i=$((i + 1))
  tr="$OUT/demo-$i.trace"
  "$KTIER" run -m "$MODEL" --ids "$p" -n "$TOKENS" --temp 0.8 --seed "$i" --lookahead 3 \
    --trace "$tr" > /dev/null 2> "$OUT/record-$i.log" || die "recording trace $i" "$OUT/record-$i.log"
  echo
  echo "## trace $i: prompt ${p:0:30}..., $TOKENS tokens"
  "$KTIER" trace info "$tr" > "$OUT/info-$i.txt" 2>&1 || die "trace info $i" "$OUT/info-$i.txt"
  grep -E "tokens:|steps:|distinct keys|hit ceiling|lookahead (d=|refresh)|recall by layer" \
    "$OUT/info-$i.txt" || echo "(none of the expected lines: see $OUT/info-$i.txt)"
  # Lookahead 0, 1 without the recorded refresh ("1n"), 1 with it.
  for la in 0 1n 1; do
    echo "### replay, lookahead $la"
    flags=(--lookahead "${la%n}")
    [ "$la" = 1n ] && flags+=(--no-refresh)
    "$KTIER" trace replay "$tr" --policy all --ram "$budgets" "${flags[@]}" \
      --csv "$OUT/replay-$i-la$la.csv" --json "$OUT/replay-$i-la$la.json" \
      --plot "$OUT/replay-$i-la$la.png" 2> "$OUT/replay-$i-la$la.log" ||
      die "replay of trace $i, lookahead $la" "$OUT/replay-$i-la$la.log"
  done
done

echo
echo "## live engine: all experts from the shards, tier = 20% of the experts, 64 tokens"
pack="$OUT/pack"
# A pack left in OUT is used again; one of another checkpoint is refused by the probe below.
[ -f "$pack/manifest.json" ] ||
  "$KTIER" pack -m "$MODEL" -o "$pack" --force > "$OUT/pack.log" 2>&1 || die "pack" "$OUT/pack.log"
# The budget: the whole trunk pinned, one fetch's slots and 20% of the experts, sized from a
# one-token probe run that keeps everything (every layer pinned: router_bank_bytes is 0; the
# dial's reserve for the routers fits in the tier's share and comes back to it).
"$KTIER" run -m "$MODEL" --pack "$pack" --preset max --ids 1 -n 1 --report-json "$OUT/probe.json" \
  > "$OUT/probe.log" 2>&1 || die "the probe run (a pack of another checkpoint in $pack?)" \
  "$OUT/probe.log"
budget=$(/usr/bin/python3 - "$OUT/probe.json" "$keys" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); keys = int(sys.argv[2])
slot = j["tiers"]["ram"]["bytes"] // j["tiers"]["ram"]["slots"]
batch = j["tiers"]["ram"]["slots"] - j["tiers"]["ram"]["policy_slots"]
print(j["trunk_bytes"] + j["router_bank_bytes"] + (batch + keys // 5) * slot)
PY
)
echo "budget $budget bytes"
# Lookahead 0, 1 and 2 with the refresh (the default), and 1 without it ("1n").
for policy in temperature lru; do
  for la in 0 1 1n 2; do
    flags=(--lookahead "${la%n}")
    [ "$la" = 1n ] && flags+=(--no-lookahead-refresh)
    "$KTIER" run -m "$MODEL" --pack "$pack" --ram "$budget" --ids "${prompts[0]}" -n 64 \
      --temp 0.8 --seed 1 --policy "$policy" "${flags[@]}" \
      --report-json "$OUT/live-$policy-$la.json" --print-ids > "$OUT/live-$policy-$la.out" \
      2> "$OUT/live-$policy-$la.log" || die "live run $policy, lookahead $la" \
      "$OUT/live-$policy-$la.log"
  done
done
/usr/bin/python3 - "$OUT" <<'PY'
import json, sys, glob, os
out = sys.argv[1]
print("policy       la  refresh  s/token  hit%   prefetch prec/recall/timely  expert wait")
for f in sorted(glob.glob(os.path.join(out, "live-*.json"))):
    j = json.load(open(f))
    p = j["prefetch"]
    refresh = "yes" if j["lookahead_refresh"] else "no"
    print(f'{j["policy"]:<12} {j["lookahead"]:>2}  {refresh:<7}  {j["decode_s_per_token"]:.4f}  '
          f'{100*j["tiers"]["ram"]["hit_rate_bytes"]:5.1f}  '
          f'{100*p["precision"]:5.1f} / {100*p["recall"]:5.1f} / {100*p["timeliness"]:5.1f}     '
          f'{100*j["expert_wait_share"]:4.0f}%')
PY
echo "outputs identical across the live runs:"
md5sum "$OUT"/live-*.out | awk '{print $1}' | sort -u | wc -l | sed 's/^1$/yes/;s/^[0-9]*$/NO/'
