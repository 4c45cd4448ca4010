#!/usr/bin/env bash
# MEM1, Qwen2.5-7B (base, as the paper), PPO with a critic, one node of 8 GPUs.
# Data: 2-objective tasks, e.g.
#   verl-memagent prepare --agent mem1 --objectives 2 --input nq=nq_train.jsonl --input hotpotqa=hotpotqa_train.jsonl --out $DATA_DIR/train.parquet
# Extra hydra overrides on the command line are appended.
set -euo pipefail
source "$(dirname "$0")/../common/launch.sh"

MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-7B}
DATA_DIR=${DATA_DIR:-$HOME/data/mem1}

OVERRIDES=(
  actor_rollout_ref.rollout.tensor_model_parallel_size=2
  actor_rollout_ref.ref.fsdp_config.param_offload=true
  trainer.experiment_name=mem1-qwen2.5-7b
)
launch_main_ppo "$RECIPES_DIR/mem1/config" mem1 "${OVERRIDES[@]}" "$@"
