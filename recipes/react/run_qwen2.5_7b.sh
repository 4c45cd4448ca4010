#!/usr/bin/env bash
# ReAct baseline, Qwen2.5-7B-Instruct: the MemSearcher recipe (same reward, optimisation, sampling, tool,
# documents and turn limit) with the react agent, whose whole history stays in one context and so
# needs a longer response; nothing else differs (docs/fidelity.md, tests/recipes).
# Data: `verl-memagent prepare --agent react ...` (the rows name the agent). Extra hydra overrides are appended.
set -euo pipefail
DATA_DIR=${DATA_DIR:-$HOME/data/react} exec "$(dirname "$0")/../memsearcher/run_qwen2.5_7b.sh" \
  actor_rollout_ref.rollout.agent.default_agent_loop=react \
  data.max_response_length=12288 \
  trainer.experiment_name=react-qwen2.5-7b \
  "$@"
