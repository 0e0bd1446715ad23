#!/usr/bin/env bash
# The study of docs/findings.md §6 (issue 32): both papers' protocols at a size with statistical power.
# Per model, three reasoning-gym families × 30 questions × a pool of 16 responses, every token read out at every
# layer (JSD, KL and cosine in one pass), hf sampler in float32; then Think@n and its peers (n = 8 of 16, 10 trials),
# online Think@n / online DeepConf replayed over the same pools, and the report (Table 1, Table 2 with paired tests,
# Figures 1-5). Every step resumes (--resume) or re-reads the stores; nothing needs the model after generation.
#
# Usage: bash examples/findings_study.sh [OUT] [stage]      stage: generate | vote | report | all (default)
# Cost on a quiet 2-core CPU: ~10 tokens per CPU-second for SmolLM2-135M with every token read out, ~2.5 for
# Qwen2.5-Coder-0.5B (its readout is ~4x larger per token): a SmolLM2 family ≈ 1.5 CPU-hours, a Qwen one ≈ 6.
set -euo pipefail
OUT=${1:-runs/findings}
STAGE=${2:-all}
D=${DEPTHLENS:-.venv/bin/depthlens}
QUESTIONS=${QUESTIONS:-30}
FAMILIES=(
  "basic_arithmetic|min_terms=2,max_terms=2,max_digits=1,allow_parentheses=false,allow_negation=false"
  "chain_sum|min_terms=2,max_terms=2,max_digits=1"
  "products|min_terms=2,max_terms=2,min_digits=1,max_digits=1"
)
MODELS=(smollm2-135m-instruct qwen2.5-coder-0.5b-instruct)

generate() {  # model family config
  $D generate --model "$1" --task "reasoning_gym:$2" --task-config "$3" --questions "$QUESTIONS" --pool 16 \
    --batch-size 16 --max-new-tokens 192 --readout-tokens all --also-divergences kl,cosine --backend hf \
    --seed 0 --task-seed 0 --out "$OUT/$1/$2" --resume
}

vote() {  # store: offline methods, then both online policies over the same pools and the same Cons@n draws
  $D thinkn --from "$1" --n 8 --prefix 50 --trials 10 --overwrite
  for signal in dtr confidence; do
    $D thinkn --online --from "$1" --signal "$signal" --n 8 --warmup 4 --max-n 16 --consensus 0.8 --prefix 50 \
      --deepconf-window 16 --trials 10
  done
}

for model in "${MODELS[@]}"; do
  for f in "${FAMILIES[@]}"; do
    name=${f%%|*}; cfg=${f#*|}
    if [[ $STAGE == generate || $STAGE == all ]]; then generate "$model" "$name" "$cfg"; fi
    if [[ ($STAGE == vote || $STAGE == all) && -d $OUT/$model/$name ]]; then vote "$OUT/$model/$name"; fi
  done
done
if [[ $STAGE == report || $STAGE == all ]]; then $D report "$OUT" --bootstrap 10000; fi
