#!/usr/bin/env bash
# Reinforcement learning of one agent on the composed password task (docs/papers_claim.md): verl's real
# trainer on CPU with recipes/cpu/composed_doors.yaml, started as every CPU recipe starts it (train_on_cpu).
#   WORK=DIR SEED=0 [RECIPE=composed_doors] [VAL_DATA=PARQUET] recipes/cpu/composed_doors.sh MODEL_DIR TRAIN_PARQUET [overrides...]
# MODEL_DIR: the agent's warm start; TRAIN_PARQUET: its RL questions (the agent is their agent_name).
# RECIPE: the config of recipes/cpu, composed_doors (MEM1's: k = 2 on the 96 RL doors) or
# composed_doors_fresh (the papers' regime at CPU size); VAL_DATA: the questions validation scores (the
# dev split), else the RL questions themselves.
# The retriever serving the task's corpus must answer at MEMAGENT_RETRIEVER_URL. benchmarks/papers_claim.py
# builds the task, its index, the questions and the warm starts and runs this once per agent and RL seed
# (memagent_examples.papers_claim); benchmarks/async_speedup.py adds the trainer modes. Outputs in $WORK:
# metrics.jsonl and checkpoints/, as train_on_cpu writes them. AGENT_LOOPS_YAML
# [recipes/cpu/composed_doors_agent_loops.yaml], N_GPUS_PER_NODE, NNODES and RAY_ADDRESS as in run.sh.
set -euo pipefail

MODEL=${1:?usage: recipes/cpu/composed_doors.sh MODEL_DIR TRAIN_PARQUET [hydra overrides...]}
DATA=${2:?usage: recipes/cpu/composed_doors.sh MODEL_DIR TRAIN_PARQUET [hydra overrides...]}
shift 2
source "$(dirname "${BASH_SOURCE[0]}")/preamble.sh" composed_doors
SEED=${SEED:-0}  # the order of the questions and the rollout's sampling
# verl's processes at TRAINER_THREADS torch threads (2), as the learning demo's (docs/learn_codes.md)
export OMP_NUM_THREADS=${TRAINER_THREADS:-2}

cp "$DATA" "$WORK/train.parquet"
AGENT_LOOPS_YAML=${AGENT_LOOPS_YAML:-$HERE/composed_doors_agent_loops.yaml} train_on_cpu "${RECIPE:-composed_doors}" "$MODEL" \
  data.seed="$SEED" actor_rollout_ref.rollout.seed="$SEED" "$@"
