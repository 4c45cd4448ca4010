#!/usr/bin/env bash
# MemSearcher, Qwen2.5-3B-Instruct, one node of 8 GPUs (the paper used 8xH100).
# Extra hydra overrides on the command line are appended, e.g. trainer.total_training_steps=10.
set -euo pipefail
source "$(dirname "$0")/../common/launch.sh"

MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-3B-Instruct}
DATA_DIR=${DATA_DIR:-$HOME/data/memsearcher}

OVERRIDES=(
  actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24576
  trainer.experiment_name=memsearcher-qwen2.5-3b
)
launch_main_ppo "$RECIPES_DIR/memsearcher/config" memsearcher "${OVERRIDES[@]}" "$@"
