#!/usr/bin/env bash
# Generation benchmark for one GPU in one go: ours (llm.generation.decode) against transformers
# generate (dynamic and static cache) on the same weights, config and lengths, with the
# roofline fractions (H200: 4.8 TB/s HBM, 989 TFLOP/s dense bf16; see ACCELERATORS in
# llm/benchmark/roofline.py). Writes $OUT/generate_<model>_b<batches>.json and prints markdown tables
# for docs/performance.md ("Generation").
#
#   bash docs/gpu/generate.sh                      # H200: qwen3_4b, bf16, P=256, N=256
#   DEVICE=cpu MODEL=tiny BATCHES=2 BIG_BATCHES= PROMPT=8 NEW=4 bash docs/gpu/generate.sh  # smoke test on CPU
#
# Variables: MODEL (conf/model preset), DTYPE, PROMPT, NEW, BATCHES (all engines),
# BIG_BATCHES (ours + transformers static cache only: the dynamic cache is the slow peer),
# REPEATS, OUT, DEVICE (gpu|cpu; where torch runs), KV_BLOCK (GenerationConfig.kv_block:
# 128 gives 2 decode segments at N=256, fewer unrolled layer bodies to compile than 64's 4),
# ALSO_SCAN=1 (also time ours with the layer scan in the decode loop), ATTENTION (ours'
# attention_impl: the prefill's causal kernel, default auto = cuDNN on a GPU; xla|cudnn also
# send the decode steps through jax.nn.dot_product_attention, the others keep the dense
# grouped attention there), EOS_AFTER (e.g. 64,256: rows of the BATCHES run finish
# after these many tokens, cycled; adds the early-finish table of useful tok/s).
# Compilations are cached in $JAX_COMPILATION_CACHE_DIR (default /tmp/jaxlake_jax_cache), so
# a rerun on the same machine does not compile again.
set -euo pipefail
cd "$(dirname "$0")/../.."

MODEL=${MODEL:-qwen3_4b}
DTYPE=${DTYPE:-bfloat16}
PROMPT=${PROMPT:-256}
NEW=${NEW:-256}
BATCHES=${BATCHES:-8,64}
BIG_BATCHES=${BIG_BATCHES-256}
REPEATS=${REPEATS:-2}
OUT=${OUT:-docs/gpu}
DEVICE=${DEVICE:-gpu}
KV_BLOCK=${KV_BLOCK:-128}
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/jaxlake_jax_cache}

if [ "$DEVICE" = gpu ]; then
  export JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
  # JAX and torch share the GPU: no preallocation, so torch's static cache fits next to ours
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
else
  export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
fi
mkdir -p "$OUT"

run() {  # run <batches> <peers>
  local tag=${1//,/_}
  python -m llm.benchmark generate --device "$DEVICE" --models "$MODEL" --dtype "$DTYPE" \
    --batch "$1" --prompt-len "$PROMPT" --new-tokens "$NEW" --repeats "$REPEATS" --peers "$2" \
    --kv-block "$KV_BLOCK" ${ALSO_SCAN:+--also-scan} ${ATTENTION:+--attention "$ATTENTION"} \
    --out "$OUT/generate_${MODEL}_b${tag}${ATTENTION:+_$ATTENTION}.json" "${@:3}"
}

time run "$BATCHES" dynamic,static ${EOS_AFTER:+--eos-after "$EOS_AFTER"}
if [ -n "$BIG_BATCHES" ]; then
  time run "$BIG_BATCHES" static
fi
