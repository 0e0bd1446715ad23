#!/usr/bin/env bash
# The study of docs/findings.md §6 (issues 32, 44): both papers' Table 1 and Table 2 at a size with statistical
# power, for the least compute that answers them (the protocol and its measured cost: findings.md §6.3).
#
#   SmolLM2-135M: three reasoning-gym families × 30 questions × a pool of 16, every token read out, JSD only —
#                 except chain_sum, which also stores KL and cosine (the divergence ablation, on one family).
#   Qwen2.5-Coder-0.5B: the same families, in order, as far as the compute goes (each ≈ 3.7 CPU-hours).
#   ≤ 192 tokens (the measured answers end at a median of 108 / 144 tokens, p90 185 / 164; 6–12 % are cut).
#   Then Think@n and its peers (n = 8 of 16, 10 trials), online Think@n / DeepConf replayed over the same pools,
#   and the report (Table 1, Table 2 with paired tests, Figures 1-5).
#
#   Issue 48's second model, fixed before running: Qwen2.5-Coder-0.5B on chain_sum (2–4 terms of 1–2 digits, the
#   setting where it answers about half), 32 questions × 16, ≤ 192 tokens, only the first 50 tokens read out (Think@n
#   needs the prefix alone), g = 0.5 bits and ρ = 0.85 (the defaults, not tuned): stage `qwen-chain`.
#
# Usage: bash examples/findings_study.sh [OUT] [stage] [model…]   stage: generate | vote | report | all (default)
#                                                                        | qwen-chain (the second model's store)
#                                                                        | qwen-families (its other two families)
#                                                                        | fallback (issue 48: each store regraded
#   under the final-result answer rule into a copy under OUT-fallback — no resampling —, then voted and reported
#   like the originals; the compact per-response tables of both go to docs/data/findings/)
# Every store resumes (--resume): stop it any time, run the same line again. JOBS stores are generated at once, one
# thread each (OMP_NUM_THREADS=1): on a 2-core machine JOBS=2 (the default) keeps both cores busy and no more.
set -euo pipefail
OUT=${1:-runs/findings}
STAGE=${2:-all}
shift $(( $# > 2 ? 2 : $# ))
MODELS=("$@")
[[ ${#MODELS[@]} -gt 0 ]] || MODELS=(smollm2-135m-instruct qwen2.5-coder-0.5b-instruct)
D=${DEPTHLENS:-.venv/bin/depthlens}
QUESTIONS=${QUESTIONS:-30}
JOBS=${JOBS:-2}
FAMILIES=(
  "basic_arithmetic|min_terms=2,max_terms=2,max_digits=1,allow_parentheses=false,allow_negation=false"
  "chain_sum|min_terms=2,max_terms=2,max_digits=1"
  "products|min_terms=2,max_terms=2,min_digits=1,max_digits=1"
)
ABLATION_FAMILY=chain_sum  # KL and cosine beside JSD on this family only (SmolLM2)

generate() {  # model family config
  local also=()
  if [[ $1 == smollm2-135m-instruct && $2 == "$ABLATION_FAMILY" ]]; then also=(--also-divergences kl,cosine); fi
  OMP_NUM_THREADS=1 $D generate --model "$1" --task "reasoning_gym:$2" --task-config "$3" \
    --questions "$QUESTIONS" --pool 16 --batch-size 16 --max-new-tokens 192 --readout-tokens all "${also[@]}" \
    --backend hf --seed 0 --task-seed 0 --out "$OUT/$1/$2" --resume
}

vote() {  # store: offline methods, then both online policies over the same pools and the same Cons@n draws
  $D thinkn --from "$1" --n 8 --prefix 50 --trials 10 --overwrite
  for signal in dtr confidence; do
    $D thinkn --online --from "$1" --signal "$signal" --n 8 --warmup 4 --max-n 16 --consensus 0.8 --prefix 50 \
      --deepconf-window 16 --trials 10
  done
}

if [[ $STAGE == qwen-chain ]]; then
  OMP_NUM_THREADS=1 $D generate --model qwen2.5-coder-0.5b-instruct --task reasoning_gym:chain_sum \
    --task-config min_terms=2,max_terms=4,min_digits=1,max_digits=2 --questions 32 --pool 16 --batch-size 16 \
    --max-new-tokens 192 --readout-tokens 50 --g 0.5 --rho 0.85 --backend hf --seed 0 --task-seed 0 \
    --out "$OUT/qwen2.5-coder-0.5b-instruct/chain_sum" --resume
  exit
fi
if [[ $STAGE == qwen-families ]]; then
  # Issue 56 item 7, fixed before running: the second model at the first model's breadth — Qwen2.5-Coder-0.5B on
  # basic_arithmetic and products with SmolLM2's task configs (the same questions: --task-seed 0, 30 of them) and its
  # chain_sum store's settings (pool 16, ≤ 192 tokens, the first 50 tokens read out, g 0.5, ρ 0.85, seed 0). One
  # thread each, both at once (JOBS), nice'd so that other work on the machine goes first; --resume across sittings.
  for f in "${FAMILIES[@]}"; do
    name=${f%%|*}; cfg=${f#*|}
    [[ $name == chain_sum ]] && continue
    while [[ $(jobs -rp | wc -l) -ge $JOBS ]]; do wait -n; done
    mkdir -p "$OUT"
    OMP_NUM_THREADS=1 nice -n 19 $D generate --model qwen2.5-coder-0.5b-instruct --task "reasoning_gym:$name" \
      --task-config "$cfg" --questions "$QUESTIONS" --pool 16 --batch-size 16 --max-new-tokens 192 \
      --readout-tokens 50 --g 0.5 --rho 0.85 --backend hf --seed 0 --task-seed 0 \
      --out "$OUT/qwen2.5-coder-0.5b-instruct/$name" --resume > "$OUT/generate-qwen2.5-coder-0.5b-instruct-$name.log" 2>&1 &
  done
  wait
  exit
fi
if [[ $STAGE == fallback ]]; then
  for store in "$OUT"/*/*/; do
    store=${store%/}; rel=${store#"$OUT"/}; copy="$OUT-fallback/$rel"
    [[ -d $store/samples ]] || continue
    rm -rf "$copy"; mkdir -p "$(dirname "$copy")"
    $D regrade "$store" --answer-fallback final-result --out "$copy"
    vote "$copy"
  done
  $D report "$OUT-fallback" --bootstrap 10000
  python examples/compact_table.py "$OUT" docs/data/findings
  exit
fi
if [[ $STAGE == generate || $STAGE == all ]]; then
  for model in "${MODELS[@]}"; do
    for f in "${FAMILIES[@]}"; do
      while [[ $(jobs -rp | wc -l) -ge $JOBS ]]; do wait -n; done
      name=${f%%|*}; cfg=${f#*|}
      mkdir -p "$OUT"
      generate "$model" "$name" "$cfg" > "$OUT/generate-$model-$name.log" 2>&1 &
    done
  done
  wait
fi
for model in "${MODELS[@]}"; do
  for f in "${FAMILIES[@]}"; do
    name=${f%%|*}
    if [[ ($STAGE == vote || $STAGE == all) && -d $OUT/$model/$name ]]; then vote "$OUT/$model/$name"; fi
  done
done
if [[ $STAGE == report || $STAGE == all ]]; then $D report "$OUT" --bootstrap 10000; fi
