#!/usr/bin/env bash
# Training benchmark for one GPU in one go (the paper-scale training targets): one GRPO update of qwen3_4b,
# 16 completions x (256 + 1024) tokens, in 1 / 2 / 4 micro-batches (tokens/s, MFU against the
# data sheet's dense bf16 peak, compile time, XLA and device peak memory), then one whole GRPO
# step at paper-like settings (32 lakes x G = 8, 1024 new tokens, EOS off) with the time split
# between sampling, the reference log-probs (BETA > 0) and the updates; the old log-prob forward
# the trainer skips (on-policy first update) is timed apart, with its saved share. Writes $OUT/train_<model>.json and
# $OUT/grpo_<model>.json and prints markdown tables for docs/performance.md ("Training").
#
#   bash docs/gpu/train.sh                      # H200: qwen3_4b, f32 master weights, bf16 compute
#   DEVICE=cpu MODEL=tiny ROWS=4 PROMPT=8 COMPLETION=8 MICRO=1 LAKES=2 GROUP=2 NEW=8 STEP_MICRO=1 \
#     REPEATS=1 bash docs/gpu/train.sh          # smoke test on CPU
#
# Variables: MODEL (conf/model preset), PARAM_DTYPE / DTYPE (override the preset's master and
# compute dtypes), ROWS, PROMPT, COMPLETION, MICRO (comma list of micro-batch counts), REMAT
# (comma list: none, full, save_matmuls), LAKES, GROUP, NEW, STEP_MICRO (micro-batches of the
# whole step's update), MU, BETA (> 0 adds the reference forward), KV_BLOCK, REPEATS, OUT,
# DEVICE (gpu|cpu), SKIP_STEP=1 (update only).
# Compilations are cached in $JAX_COMPILATION_CACHE_DIR (default /tmp/jaxlake_jax_cache).
set -euo pipefail
cd "$(dirname "$0")/../.."

MODEL=${MODEL:-qwen3_4b}
ROWS=${ROWS:-16}
PROMPT=${PROMPT:-256}
COMPLETION=${COMPLETION:-1024}
MICRO=${MICRO:-1,2,4}
REMAT=${REMAT:-full}
LAKES=${LAKES:-32}
GROUP=${GROUP:-8}
NEW=${NEW:-1024}
STEP_MICRO=${STEP_MICRO:-16}
MU=${MU:-1}
BETA=${BETA:-0}
KV_BLOCK=${KV_BLOCK:-128}
REPEATS=${REPEATS:-2}
OUT=${OUT:-docs/gpu}
DEVICE=${DEVICE:-gpu}
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/jaxlake_jax_cache}

if [ "$DEVICE" = gpu ]; then
  export JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
else
  export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
fi
mkdir -p "$OUT"
dtypes=(${PARAM_DTYPE:+--param-dtype "$PARAM_DTYPE"} ${DTYPE:+--dtype "$DTYPE"})

time python -m llm.benchmark train --models "$MODEL" "${dtypes[@]}" --rows "$ROWS" --prompt-len "$PROMPT" \
  --completion-len "$COMPLETION" --micro-batches "$MICRO" --remat "$REMAT" --repeats "$REPEATS" \
  --out "$OUT/train_${MODEL}.json"

if [ -z "${SKIP_STEP:-}" ]; then
  time python -m llm.benchmark grpo --models "$MODEL" "${dtypes[@]}" --lakes "$LAKES" --group-size "$GROUP" \
    --prompt-len "$PROMPT" --new-tokens "$NEW" --micro-batches "$STEP_MICRO" --mu "$MU" --beta "$BETA" \
    --remat "${REMAT%%,*}" --kv-block "$KV_BLOCK" --repeats "$REPEATS" --out "$OUT/grpo_${MODEL}.json"
fi
