#!/usr/bin/env bash
# SetPO on verl: the paper's Qwen2.5-Math setting (GSM8K train, G=6, T=0.9, max response 756, KL 1e-4,
# global batch 64, 2 epochs, per-algorithm lr and clip, λ per preset) on one node or many.
#
#   MODEL_PATH=/path/to/Qwen2.5-Math-7B \
#   EMBEDDING_MODEL_PATH=/path/to/Qwen3-Embedding-0.6B \
#   TRAIN_FILE=/path/to/gsm8k/train.parquet \
#   VAL_FILE=/path/to/gsm8k/test.parquet,/path/to/math500/test.parquet \
#   PYTHON_BIN=/path/to/env/bin/python \
#   bash scripts/run_setpo.sh [extra Hydra overrides for verl ...]
#
# Required: MODEL_PATH, TRAIN_FILE, VAL_FILE, and EMBEDDING_MODEL_PATH unless SETPO=0 (a local
# sentence-transformers directory; "default" uses the packaged all-MiniLM-L6-v2 instead of the paper's
# Qwen3-Embedding-0.6B). Files may be verl parquet or raw GSM8K / MATH500 / AIME / AMC parquet or jsonl;
# raw files are converted with the Qwen-Math template into DATA_DIR (default: setpo_verl/ beside each file).
#
# Optional (defaults in brackets):
#   PYTHON_BIN [python3]          the training environment's Python (setpo and verl[vllm] installed)
#   NNODES [1]                    nodes in the Ray cluster (start it first; see README "verl across nodes")
#   N_GPUS_PER_NODE [all visible] GPUs per node
#   ALGO [grpo]                   grpo | gspo | dapo (setpo.presets: loss mode, clip, lr, λ)
#   SETPO_LAMBDA [preset's λ]     SetPO marginal weight λ (GRPO 0.05, GSPO 0.1, DAPO 0.2)
#   SETPO [1]                     0 runs the plain base algorithm (the baseline)
#   VAL_N [64]                    samples per validation prompt: Pass@1 = avg@VAL_N at T=0.5, top-p 0.9
#   TEST_FREQ [20] SAVE_FREQ [50] validation / checkpoint every N steps (training resumes automatically)
#   ROLLOUT_TP [1] GPU_MEMORY_UTILIZATION [0.6] MICRO_BATCH_PER_GPU [8] EMBEDDING_DEVICE [auto]
#   OUTPUT_DIR [runs/verl]        checkpoints and overrides.txt under OUTPUT_DIR/<experiment> (shared storage
#                                 for multi-node runs)
#   EXPERIMENT_NAME [from ALGO/λ] LOGGER [console] (e.g. console,wandb)  DATA_DIR [beside each file]
#   DRY_RUN [0]                   1: convert data, compose and validate the verl config, print it, exit
set -euo pipefail

PYTHON_BIN="${PYTHON_BIN:-python3}"
: "${MODEL_PATH:?set MODEL_PATH to the base model directory (e.g. Qwen2.5-Math-7B)}"
: "${TRAIN_FILE:?set TRAIN_FILE to the training data (e.g. GSM8K train parquet)}"
: "${VAL_FILE:?set VAL_FILE to the validation data (comma-separated for several)}"
SETPO="${SETPO:-1}"
if [[ "$SETPO" != "0" ]]; then
  : "${EMBEDDING_MODEL_PATH:?set EMBEDDING_MODEL_PATH to a local embedding model (paper: Qwen3-Embedding-0.6B), or to 'default'}"
fi

if [[ -z "${N_GPUS_PER_NODE:-}" ]]; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    N_GPUS_PER_NODE="$(nvidia-smi --list-gpus | wc -l)"
  else
    N_GPUS_PER_NODE=8
  fi
fi

args=(
  --model-path "$MODEL_PATH"
  --train-file "$TRAIN_FILE"
  --val-file "$VAL_FILE"
  --algo "${ALGO:-grpo}"
  --nnodes "${NNODES:-1}"
  --n-gpus-per-node "$N_GPUS_PER_NODE"
  --val-n "${VAL_N:-64}"
  --test-freq "${TEST_FREQ:-20}"
  --save-freq "${SAVE_FREQ:-50}"
  --rollout-tp "${ROLLOUT_TP:-1}"
  --gpu-memory-utilization "${GPU_MEMORY_UTILIZATION:-0.6}"
  --micro-batch-per-gpu "${MICRO_BATCH_PER_GPU:-8}"
  --embedding-device "${EMBEDDING_DEVICE:-auto}"
  --output-dir "${OUTPUT_DIR:-runs/verl}"
  --logger "${LOGGER:-console}"
)
[[ "$SETPO" != "0" ]] && args+=(--embedding-model "$EMBEDDING_MODEL_PATH") || args+=(--no-setpo)
[[ -n "${SETPO_LAMBDA:-}" ]] && args+=(--lam "$SETPO_LAMBDA")
[[ -n "${EXPERIMENT_NAME:-}" ]] && args+=(--experiment-name "$EXPERIMENT_NAME")
[[ -n "${DATA_DIR:-}" ]] && args+=(--data-dir "$DATA_DIR")

cmd=train
[[ "${DRY_RUN:-0}" == "1" ]] && cmd=print-config

# The plug-in must also be loaded in this driver process; the Ray workers get it through the job's
# runtime_env (VERL_USE_EXTERNAL_MODULES=setpo.verl, set by setpo.verl's overrides).
export VERL_USE_EXTERNAL_MODULES="${VERL_USE_EXTERNAL_MODULES:-setpo.verl}"
exec "$PYTHON_BIN" -m setpo.verl "$cmd" "${args[@]}" "$@"
