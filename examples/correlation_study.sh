#!/usr/bin/env bash
# The real correlation study of docs/findings.md §4: two models × four reasoning-gym families, every response
# read out at every layer (JSD, KL and cosine in one pass), then the report: Table 1, sweeps, Figures 1–5.
# Usage: bash examples/correlation_study.sh [runs/study]   (about 90 min on 2 CPU cores)
set -euo pipefail
OUT=${1:-runs/study}
D=${DEPTHLENS:-.venv/bin/depthlens}
TASKS=(
  "basic_arithmetic|min_terms=2,max_terms=2,max_digits=1,allow_parentheses=false,allow_negation=false"
  "chain_sum|min_terms=2,max_terms=3,max_digits=1"
  "leg_counting|min_animals=1,max_animals=2,max_instances=3"
  "products|min_terms=2,max_terms=2,min_digits=1,max_digits=2"
)
run() {  # model questions max-new-tokens
  for t in "${TASKS[@]}"; do
    name=${t%%|*}; cfg=${t#*|}
    $D generate --model "$1" --task "reasoning_gym:$name" --task-config "$cfg" --questions "$2" --pool 8 \
      --max-new-tokens "$3" --readout-tokens all --also-divergences kl,cosine --batch-size 8 \
      --out "$OUT/$1/$name" --resume
  done
}
run smollm2-135m-instruct 16 128
run qwen2.5-coder-0.5b-instruct 5 96
$D report "$OUT"
