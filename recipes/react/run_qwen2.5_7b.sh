#!/usr/bin/env bash
# ReAct baseline with MemSearcher's settings (whole history in one context), Qwen2.5-7B-Instruct, 8 GPUs.
# Extra hydra overrides on the command line are appended, e.g. trainer.total_training_steps=10.
set -euo pipefail
source "$(dirname "$0")/../common/launch.sh"

MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-7B-Instruct}
DATA_DIR=${DATA_DIR:-$HOME/data/react}

OVERRIDES=(
  actor_rollout_ref.rollout.tensor_model_parallel_size=2
  actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384
  actor_rollout_ref.actor.fsdp_config.param_offload=false
  actor_rollout_ref.ref.fsdp_config.param_offload=true
  trainer.experiment_name=react-qwen2.5-7b
)
launch_main_ppo "$RECIPES_DIR/react/config" react "${OVERRIDES[@]}" "$@"
